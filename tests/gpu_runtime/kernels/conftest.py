"""The kernels' CPU check: Triton under its interpreter (TRITON_INTERPRET=1), against the torch path.

triton picks the interpreter when it is first imported (transformers imports it, so
tests/conftest.py sets the variable before anything else); a process where that came too late
cannot check the kernels, and says so instead of passing. The interpreter is 20-100x slower
than torch: every shape here is small.
"""

from __future__ import annotations

import pytest

from gpu_runtime.kernels import selection

_problem = selection.triton_import_problem()
if _problem:
    pytest.skip(f"the Triton kernels cannot be checked here: {_problem}", allow_module_level=True)

import triton.language as tl  # noqa: E402

if type(tl.standard.max).__name__ != "InterpretedFunction":
    raise RuntimeError(
        "triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot run on the CPU "
        "in this process (tests/conftest.py sets it first; an explicit TRITON_INTERPRET=0 overrides it)"
    )


@pytest.fixture
def triton_kernels(monkeypatch):
    """KILN_KERNELS=triton for one test: the selection then picks Triton on this CPU."""
    monkeypatch.setenv(selection.ENV, "triton")
    choice = selection.choose("cpu")
    assert choice.triton, choice
    return choice
