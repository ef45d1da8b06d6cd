"""The resident model's frozen base weights, lent to a trainer in the same process. Imports no Django.

Why: the GPU worker keeps the served model resident for the sampler, and a GRPO run used to read
the same weights from disk a second time. Base weights never change during LoRA training, so the
trainer can build its model on the very tensors the sampler reads: one copy of the base on the
device instead of two (a 4 B model in bf16: 8 GB less during training), no second read from disk,
and the small-model stacked projections (`lean_plan`) are cached once for both.

`SharedBase.of(model, ...)` is taken right after loading, before any adapter is attached: it keeps
a module tree (`template`) that shares every parameter and buffer with the loaded model and is
never wrapped by peft itself. `fresh_model()` hands out a new module tree on those same tensors, so
the trainer's peft wrapping changes only its own modules, never the sampler's.

It also carries the loaded model's identity (`model_loading.identity_of`, hashed from the weight files
when they were read): a trainer on these tensors records it instead of hashing the files again (a
4 B model's 8 GB took seconds a run), and it describes the tensors the trainer really uses even if
the files on disk were replaced since.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

__all__ = ["SharedBase"]


def _tensors_of(model: nn.Module) -> dict[int, torch.Tensor]:
    """id -> tensor for every parameter and buffer (deepcopy's memo: these are shared, not copied)."""
    return {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index or 0) == (b.index or 0)  # "cuda" is "cuda:0" here


@dataclass(frozen=True)
class SharedBase:
    path: Path
    device: torch.device
    dtype: torch.dtype
    template: nn.Module
    identity: dict | None = None  # identity_of() of the loaded weights, without the serving name

    @classmethod
    def of(cls, model: nn.Module, *, path: Path, device: torch.device, dtype: torch.dtype,
           identity: dict | None = None) -> SharedBase:
        """Take `model` (just loaded: no adapter layers yet) as the shared base."""
        return cls(Path(path), torch.device(device), dtype, copy.deepcopy(model, _tensors_of(model)),
                   copy.deepcopy(identity))

    def unusable_for(self, model_dir: Path, device: torch.device, dtype: torch.dtype) -> str | None:
        """Why a trainer of `model_dir` on (device, dtype) cannot build on these tensors, or None."""
        if Path(model_dir).resolve() != self.path.resolve():
            return f"the resident model is {self.path}, the run trains on {model_dir}"
        if not _same_device(torch.device(device), self.device) or dtype != self.dtype:
            return (f"the resident model is on {self.device} in {self.dtype}, "
                    f"the trainer runs on {device} in {dtype}")
        return None

    def fresh_model(self) -> nn.Module:
        """A new module tree over the shared tensors (configs and small attributes copied)."""
        return copy.deepcopy(self.template, _tensors_of(self.template))
