"""Which path the kernels take in this process: Triton or torch, and why. Imports no Django.

Rule: Triton runs when the device is CUDA and triton imports; otherwise the torch path runs and
the reason is recorded. `KILN_KERNELS` overrides: `torch` always takes the torch path, `triton`
asks for Triton anywhere it can run (on a CPU only under `TRITON_INTERPRET=1`, which the tests
use; the interpreter is far too slow for real work), `auto` (the default) applies the rule.
The record (`KernelChoice.to_record()`) goes into the train receipt's execution provenance.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import lru_cache

ENV = "KILN_KERNELS"
MODES = ("auto", "torch", "triton")


@dataclass(frozen=True)
class KernelChoice:
    backend: str  # "triton" | "torch"
    requested: str  # the KILN_KERNELS mode
    fallback_reason: str | None = None  # why the torch path runs where Triton could have been asked for

    @property
    def triton(self) -> bool:
        return self.backend == "triton"

    def to_record(self) -> dict:
        return {"backend": self.backend, "requested": self.requested, "fallback_reason": self.fallback_reason}


@lru_cache(maxsize=1)
def triton_import_problem() -> str | None:
    """None when triton imports, else why not (cached: an import is tried once per process)."""
    try:
        importlib.import_module("triton")
        importlib.import_module("triton.language")
    except Exception as exc:  # noqa: BLE001 - any failure to import means the torch path
        return f"triton is not importable ({type(exc).__name__}: {exc})"
    return None


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") not in ("", "0")


def requested_mode() -> str:
    mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV} must be one of {', '.join(MODES)}, got {mode!r}")
    return mode


def choose(device) -> KernelChoice:
    """The path for work on `device` (a torch.device or its string)."""
    mode = requested_mode()
    device_type = getattr(device, "type", None) or str(device).split(":")[0]
    if mode == "torch":
        return KernelChoice("torch", mode, f"{ENV}=torch")
    problem = triton_import_problem()
    if problem:
        return KernelChoice("torch", mode, problem)
    if device_type == "cuda":
        return KernelChoice("triton", mode)
    if mode == "triton" and interpreting():
        return KernelChoice("triton", mode)
    if mode == "triton":
        return KernelChoice("torch", mode, f"device {device_type}: Triton off CUDA needs TRITON_INTERPRET=1")
    return KernelChoice("torch", mode, f"device {device_type}: the kernels run on CUDA")
