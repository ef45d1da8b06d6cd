"""Whether a warm start's base adapter has the LoRA shape the request asks for, checked at admission.

The trainer refuses a base adapter whose rank or alpha differ from the run's (shape conversion is not
implemented: gpu_runtime.grpo.adapter_io.load_base_adapter), but only after the job was queued, and
for an OpenEnv `kind: train` run only after every episode was collected. Reading the published
`adapter_config.json` here refuses the same request before anything is spent. Reads one small JSON
file; no torch, no Django.
"""

from __future__ import annotations

import json
from pathlib import Path

MAX_CONFIG_BYTES = 1 << 20


def base_adapter_shape_problem(adapter_dir: Path, *, rank: int, alpha: float) -> tuple[str, str] | None:
    """(message, hint) when the adapter's saved rank/alpha differ from the run's; None when they
    agree or the config cannot be read (the trainer then reports what is wrong with the files)."""
    try:
        path = Path(adapter_dir) / "adapter_config.json"
        if path.stat().st_size > MAX_CONFIG_BYTES:
            return None
        saved = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict):
        return None
    saved_rank, saved_alpha = saved.get("r"), saved.get("lora_alpha")
    mismatches = []
    if isinstance(saved_rank, int) and not isinstance(saved_rank, bool) and saved_rank != rank:
        mismatches.append(f"lora_rank {rank} != the base adapter's {saved_rank}")
    if isinstance(saved_alpha, int | float) and not isinstance(saved_alpha, bool) and float(saved_alpha) != float(alpha):
        mismatches.append(f"lora_alpha {alpha:g} != the base adapter's {float(saved_alpha):g}")
    if not mismatches:
        return None
    shape = f"lora_rank {saved_rank}, lora_alpha {float(saved_alpha):g}" if isinstance(saved_rank, int) and isinstance(
        saved_alpha, int | float) else "the base adapter's rank and alpha"
    return ("a warm start keeps the base adapter's LoRA shape: " + "; ".join(mismatches),
            f"train with {shape}, or start from the base model to use another shape")
