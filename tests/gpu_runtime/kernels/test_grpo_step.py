"""One GRPO run on the tiny model with the kernels on (Triton, interpreted) equals one with them off.

Two groups of four completions, KL k3 against the base (so the reference forward takes the fused
head too), recorded nowhere else: same seed, same data. Tolerances: the first step starts from the
same weights, so its loss and gradient norm agree to float32 rounding (1e-5 relative); the second
step's inputs already differ by one AdamW update computed from gradients that differ at 1e-7, and
Adam's per-element normalisation can magnify that for near-zero moments, so it gets 1e-3.
"""

from __future__ import annotations

import pytest

from tests.grpo.tiny_support import fixed_groups, run, train_request


def train(model_dir, out, name):
    return run(train_request(model_dir, fixed_groups(2), out, name, kl_coeff=0.05, kl_estimator="k3"))


def test_kernels_on_equal_kernels_off(tiny_model_dir, tmp_path, monkeypatch, one_thread):
    monkeypatch.setenv("KILN_KERNELS", "torch")
    plain = train(tiny_model_dir, tmp_path, "plain")
    monkeypatch.setenv("KILN_KERNELS", "triton")
    fused = train(tiny_model_dir, tmp_path, "fused")

    kernels = fused.receipt["runtime"]["execution_provenance"]["kernels"]
    assert kernels["backend"] == "triton" and kernels["fallback_reason"] is None
    assert kernels["applied"] == {"linear_logprobs": True, "token_loss": True}
    assert plain.receipt["runtime"]["execution_provenance"]["kernels"]["fallback_reason"] == "KILN_KERNELS=torch"
    assert fused.receipt["fallbacks"] == plain.receipt["fallbacks"] == []

    first, second = zip(plain.receipt["loss_history"], fused.receipt["loss_history"], strict=True)
    assert first[1]["loss"] == pytest.approx(first[0]["loss"], rel=1e-5, abs=1e-7)
    assert first[1]["kl_mean"] == first[0]["kl_mean"] == 0.0  # a fresh adapter is the base, on both paths
    assert second[1]["loss"] == pytest.approx(second[0]["loss"], rel=1e-3, abs=1e-6)
    assert second[1]["kl_estimator_mean"] == pytest.approx(second[0]["kl_estimator_mean"], rel=1e-3, abs=1e-9)
    norms = list(zip(plain.receipt["lora_grad_norms"], fused.receipt["lora_grad_norms"], strict=True))
    assert norms[0][1] == pytest.approx(norms[0][0], rel=1e-5)
    assert norms[1][1] == pytest.approx(norms[1][0], rel=1e-3)
