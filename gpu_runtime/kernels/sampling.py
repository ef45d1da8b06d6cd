"""Fused sampling: temperature, top-k, top-p, min-p and the inverse-CDF draw in one Triton kernel.
Imports torch (triton lazily); no Django.

The maths is `gpu_runtime.sampling.behavior_logprobs` followed by `draw_tokens` (the torch path
and the oracle), without sorting the vocabulary: penalised logits [B, V] in, each row's token and
the behaviour log-prob of that token out. Rows are independent programs, so a row's result does
not depend on the other rows of the batch.

Each row's uniform number comes from one of two streams:
- `uniforms` (B,) float64 given by the caller: the sampler passes each request's own
  torch.Generator draws, so a seed gives the same tokens on the Triton and the torch path;
- Philox keyed by (request seed, position) inside the kernel (`seeds` and `positions`), a
  stateless per-row stream for callers that keep no generator.
A forced token (>= 0 in `forced`) is taken instead of the draw, and its log-prob is reported.
Agreement with the torch path is exact except where a token's mass lies within float rounding
of a top-p or min-p boundary (the two sum probabilities in different orders).
"""

from __future__ import annotations

import torch
from torch import Tensor

from gpu_runtime.kernels.triton_support import next_power_of_2

__all__ = ["philox_uniforms", "sample"]

MAX_BLOCK = 2048


def _kernels():
    from gpu_runtime.kernels import sampling_triton as k

    return k


def _per_row(params, device) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    temperature = torch.tensor([float(p.temperature) for p in params], dtype=torch.float32, device=device)
    top_k = torch.tensor([int(p.top_k) for p in params], dtype=torch.int32, device=device)
    top_p = torch.tensor([float(p.top_p) for p in params], dtype=torch.float32, device=device)
    min_p = torch.tensor([float(p.min_p) for p in params], dtype=torch.float32, device=device)
    return temperature, top_k, top_p, min_p


def _signed(seeds) -> Tensor:
    # Seeds are u64; the kernel reads int64 (the same 64 bits).
    return torch.tensor([s - (1 << 64) if s >= 1 << 63 else s for s in seeds], dtype=torch.int64)


def sample(
    logits: Tensor,
    params,
    *,
    uniforms: Tensor | None = None,
    seeds: list[int] | None = None,
    positions: list[int] | Tensor | None = None,
    forced: list[int | None] | None = None,
) -> tuple[Tensor, Tensor]:
    """(tokens (B,) int64, chosen log-probs (B,) float32) for penalised logits [B, V].

    `params` holds one object per row with temperature, top_k, top_p and min_p (SamplingParams).
    Give either `uniforms` (float64 in [0, 1)) or `seeds` and `positions` (Philox)."""
    k = _kernels()
    logits = logits.float().contiguous()
    rows, vocab = logits.shape
    device = logits.device
    philox = uniforms is None
    if philox and (seeds is None or positions is None):
        raise ValueError("give uniforms, or seeds and positions")
    temperature, top_k, top_p, min_p = _per_row(params, device)
    forced_ids = torch.tensor([-1 if f is None else int(f) for f in (forced or [None] * rows)],
                              dtype=torch.int64, device=device)
    seed_t = _signed(seeds).to(device) if philox else forced_ids
    pos_t = torch.as_tensor(positions, dtype=torch.int64).to(device) if philox else forced_ids
    u = torch.zeros(rows, dtype=torch.float64, device=device) if philox else uniforms.to(device, torch.float64)
    work = torch.empty_like(logits)
    tokens = torch.empty(rows, dtype=torch.int64, device=device)
    chosen = torch.empty(rows, dtype=torch.float32, device=device)
    k.sample_rows[(rows,)](
        logits, work, temperature, top_k, top_p, min_p, u.contiguous(), seed_t, pos_t, forced_ids,
        tokens, chosen, vocab, PHILOX=philox, BLOCK=min(MAX_BLOCK, next_power_of_2(max(vocab, 16))),
    )
    return tokens, chosen


def philox_uniforms(seeds: list[int], positions, device="cpu") -> Tensor:
    """The uniforms the Philox stream gives each (seed, position): float64 (B,). For tests and for
    replaying a Philox-keyed draw through the torch path."""
    k = _kernels()
    seed_t = _signed(seeds).to(device)
    pos_t = torch.as_tensor(positions, dtype=torch.int64).to(device)
    out = torch.empty(len(seeds), dtype=torch.float64, device=device)
    k.philox_uniforms[(len(seeds),)](seed_t, pos_t, out)
    return out
