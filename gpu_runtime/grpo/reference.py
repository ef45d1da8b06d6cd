"""Next-token log-probs and the shared-prefix KL-reference forward (`shared_prefix_reference`).

Imports torch (and duck-types a Hugging Face causal LM); no Django. The completions of a GRPO
group share one rendered prompt, so the reference forward can run the prompt once, keep its KV
cache, and run only the completion tokens against it. The result equals per-completion full
forwards up to float rounding (tests/grpo/test_reference.py checks it on a tiny Qwen3).

For `kl_reference_policy: base_per_step` the caller passes the base model (for a PEFT model,
call inside `with model.disable_adapter():`); for `ema`, the snapshot model. The reference is
never used as the behavior policy.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "common_prefix_length",
    "full_reference_logprobs",
    "shared_prefix_reference_logprobs",
    "token_logprobs",
]


def token_logprobs(logits: Tensor, input_ids: Tensor) -> Tensor:
    """(B, T, V) logits and (B, T) ids -> (B, T) with out[:, t] = log p(ids[:, t] | ids[:, <t]).

    Position 0 has no preceding logits and is 0 (never a trained position). Computed as the
    selected logit minus logsumexp, so the full log-softmax is never materialised.
    """
    logits = logits[:, :-1]
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()  # bf16/fp16 log-probs are too coarse for ratios
    targets = input_ids[:, 1:].unsqueeze(-1)
    selected = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return torch.cat([selected.new_zeros(selected.shape[0], 1), selected], dim=1)


def common_prefix_length(sequences: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix every sequence shares."""
    if not sequences:
        return 0
    first, n = sequences[0], min(len(s) for s in sequences)
    for i in range(n):
        if any(s[i] != first[i] for s in sequences):
            return i
    return n


def _pad(sequences: Sequence[Sequence[int]], device) -> tuple[Tensor, Tensor]:
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long, device=device)
    mask = torch.zeros(len(sequences), width, dtype=torch.long, device=device)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)] = torch.as_tensor(list(seq), dtype=torch.long, device=device)
        mask[row, : len(seq)] = 1
    return ids, mask


def _device(model) -> torch.device:
    return next(model.parameters()).device


@torch.no_grad()
def full_reference_logprobs(model, sequences: Sequence[Sequence[int]]) -> Tensor:
    """The per-completion fallback: one full forward per sequence. (B, max_len), 0 past each end."""
    device = _device(model)
    rows = []
    for seq in sequences:
        ids = torch.as_tensor(list(seq), dtype=torch.long, device=device)[None]
        rows.append(token_logprobs(model(input_ids=ids).logits, ids)[0])
    out = rows[0].new_zeros(len(sequences), max(len(s) for s in sequences))
    for row, values in enumerate(rows):
        out[row, : len(values)] = values
    return out


@torch.no_grad()
def shared_prefix_reference_logprobs(
    model, sequences: Sequence[Sequence[int]], prefix_len: int | None = None
) -> Tensor:
    """Reference log-probs of a group whose sequences share their first `prefix_len` tokens
    (default: the longest common prefix): one prefix forward with a KV cache, then one batched
    forward of the right-padded suffixes against the cache repeated per sequence.

    Returns (B, max_len) laid out like `token_logprobs` (0 at position 0 and past each end).
    """
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("sequences must be non-empty")
    shared = common_prefix_length(sequences)
    prefix_len = shared if prefix_len is None else prefix_len
    if not 1 <= prefix_len <= shared:
        raise ValueError(f"prefix_len {prefix_len} must be within [1, {shared}] (the shared prefix)")
    device = _device(model)
    prefix = torch.as_tensor(list(sequences[0][:prefix_len]), dtype=torch.long, device=device)[None]
    prefix_out = model(input_ids=prefix, use_cache=True)
    # Positions 1..P-1 are the same for every sequence; the prefix's last logits predict token P.
    prefix_logprobs = token_logprobs(prefix_out.logits, prefix)[0]
    out = prefix_logprobs.new_zeros(len(sequences), max(len(s) for s in sequences))
    out[:, :prefix_len] = prefix_logprobs
    last_logits = prefix_out.logits[0, -1].to(out.dtype)
    last = last_logits - torch.logsumexp(last_logits, dim=-1)

    suffixes = [list(s[prefix_len:]) for s in sequences]
    rows = [i for i, s in enumerate(suffixes) if s]
    if not rows:
        return out
    ids, mask = _pad([suffixes[i] for i in rows], device)
    # transformers 5 names the KV cache `cache` (older releases: `past_key_values`).
    cache_arg = "cache" if "cache" in prefix_out else "past_key_values"
    cache = prefix_out[cache_arg]
    cache.batch_repeat_interleave(len(rows))
    attention = torch.cat([torch.ones(len(rows), prefix_len, dtype=torch.long, device=device), mask], dim=1)
    # Right padding: real tokens never attend to the pads after them, and positions continue
    # from the cache length, so each row sees exactly its own full sequence.
    logits = model(input_ids=ids, attention_mask=attention, use_cache=True, **{cache_arg: cache}).logits
    inner = token_logprobs(logits, ids)  # positions 1.. within the suffix
    for k, row in enumerate(rows):
        n = len(suffixes[row])
        out[row, prefix_len] = last[suffixes[row][0]]
        out[row, prefix_len + 1 : prefix_len + n] = inner[k, 1:n]
    return out
