"""Kernel selection: Triton on CUDA when triton imports, else torch with the reason; KILN_KERNELS overrides.
Also what /v1/config publishes (computed without importing torch or triton)."""

from __future__ import annotations

import pytest

from gpu_runtime.kernels import selection


@pytest.fixture
def mode(monkeypatch):
    def set_mode(value: str | None):
        if value is None:
            monkeypatch.delenv(selection.ENV, raising=False)
        else:
            monkeypatch.setenv(selection.ENV, value)

    return set_mode


def test_auto_takes_triton_on_cuda_and_torch_on_the_cpu(mode):
    mode(None)
    assert selection.choose("cuda:0").to_record() == {"backend": "triton", "requested": "auto", "fallback_reason": None}
    cpu = selection.choose("cpu")
    assert cpu.backend == "torch" and cpu.fallback_reason == "device cpu: the kernels run on CUDA"


def test_overrides(mode, monkeypatch):
    mode("torch")
    assert selection.choose("cuda").fallback_reason == "KILN_KERNELS=torch"
    mode("triton")
    assert selection.choose("cpu").triton  # TRITON_INTERPRET=1 in this test process
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    forced = selection.choose("cpu")
    assert forced.backend == "torch" and "TRITON_INTERPRET=1" in forced.fallback_reason
    mode("fast")
    with pytest.raises(ValueError, match="KILN_KERNELS"):
        selection.choose("cpu")


def test_without_triton_the_reason_is_the_import_error(mode, monkeypatch):
    mode(None)
    monkeypatch.setattr(selection, "triton_import_problem", lambda: "triton is not importable (ImportError: x)")
    choice = selection.choose("cuda")
    assert choice.backend == "torch" and choice.fallback_reason.startswith("triton is not importable")


def test_v1_config_publishes_the_rule_without_torch(mode):
    from kiln_project.system_api import kernel_selection

    mode(None)
    published = kernel_selection()
    assert published["requested"] == "auto" and published["triton_installed"] is True
    assert published["backend_on_cuda"] == "triton" and published["fallback_reason"] is None
    mode("torch")
    assert kernel_selection()["backend_on_cuda"] == "torch"
