"""A lean functional forward for Llama-family decoders (Qwen3, Qwen2, Llama) with live LoRA. Imports no Django.

Why it exists: GRPO runs many small forwards (a group's prompt once, then its completions
against the prompt's keys and values) and the sampler runs one decode step per token. For
those, the Hugging Face forward's per-call bookkeeping (mask builders, cache objects, module
hooks, peft dispatch) costs more than the maths on small models. This module runs the same
computation straight from the same weight tensors (no copies): embedding -> decoder layers
(RMSNorm, projections, rotary, SDPA, SwiGLU) -> final norm, with peft's LoRA terms read from
the wrapped modules at plan time, so `disable_adapter()`, `set_adapter()` and the trainable
LoRA parameters (and their gradients) behave as they do in the peft forward.

`plan_for(model)` (`gpu_runtime.lean_plan`) captures which tensors a forward uses right now
(call it again after switching adapters); `forward(plan, ids, ...)` returns the final hidden states (before the
final norm) and each layer's keys/values. Results equal the Hugging Face forward up to float
rounding (tests/gpu_runtime/test_lean_decoder.py). A model outside this shape raises
`LeanUnsupported` with the reason; callers then take the Hugging Face path and record it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from gpu_runtime import chunked_attention
from gpu_runtime.fused_elementwise import FUSED_RMS_NORM, rotary, swiglu
from gpu_runtime.fused_elementwise import rms_norm as fused_rms_norm
from gpu_runtime.lean_plan import LayerPlan, LeanUnsupported, Plan, plan_for, unsupported_reason

__all__ = [
    "LeanUnsupported",
    "Plan",
    "forward",
    "lm_logits",
    "lm_logprobs",
    "plan_for",
    "predicting_hidden",
    "rms_norm",
    "sequence_logprobs",
    "shared_prefix",
    "unsupported_reason",
]


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last axis; `weight` broadcasts over the trailing axes it covers."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32 and FUSED_RMS_NORM:
        return fused_rms_norm(x, weight, eps)
    # Reduced precision: normalise in float32 and cast back before the weight, as transformers does.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


# Below this many attention scores (batch x heads x queries x keys), explicit batched matmuls
# beat the fused SDPA kernel's per-call setup on CPU; above it SDPA avoids materialising them.
SMALL_ATTENTION_SCORES = 1 << 20
# Above that, a CPU forward with gradients attends in query chunks (`chunked_attention`) while the
# probabilities it keeps for the backward stay within this many a layer (16 MB in float32): its
# backward takes about 0.7 of the flash kernel's time. Past the budget the flash kernel runs, whose
# memory does not grow with the keys.
CHUNKED_ATTENTION_KEPT_SCORES = 1 << 22
# ... and only with heads at least this wide: narrower heads make the chunks' matmuls too thin to
# beat the flash kernel (equal at the tiny model's 24, measured in docs/performance.md).
CHUNKED_ATTENTION_MIN_HEAD_DIM = 64


@dataclass(frozen=True)
class Attention:
    """How every layer of one forward attends (built once per forward, not once per layer):
    - `sdpa_mask` / is_causal: `scaled_dot_product_attention` (any device);
    - `bias`: batched matmuls with an additive bias laid out for grouped queries (small CPU calls);
    - `chunked`: causal attention in query chunks with a hand-written backward (CPU training);
    - `groups`: left-padded rows, group by group over their own columns (`forward(starts=...)`)."""

    sdpa_mask: Tensor | None
    bias: Tensor | None  # (B*KV or 1, group*T, S) additive, for the matmul path
    matmul: bool
    chunked: bool = False
    groups: tuple[RowGroup, ...] = ()  # `forward(starts=...)`: rows attend group by group


@dataclass(frozen=True)
class RowGroup:
    """Rows first_row .. end_row - 1, whose real keys all start at column `first_key` (left padding
    before it); their queries from `first_query` on are real."""

    first_row: int
    end_row: int
    first_key: int
    first_query: int


def _attention_for(plan: Plan, batch: int, length: int, keys: int, mask: Tensor | None, device) -> Attention:
    large = batch * plan.heads * length * keys > SMALL_ATTENTION_SCORES or device.type != "cpu"
    if large and mask is None and length > 1 and _chunked_fits(plan, batch, length, keys, device):
        return Attention(None, None, False, chunked=True)
    # SDPA's is_causal aligns to the first key, so past keys need the end-aligned mask spelled out;
    # the matmul path always adds it as a bias.
    if mask is None and length > 1 and (length < keys or not large):
        mask = torch.ones(length, keys, dtype=torch.bool, device=device).tril(keys - length)
    if large:
        return Attention(mask, None, False)
    if mask is None:
        return Attention(None, None, True)
    group = plan.heads // plan.kv_heads
    mask = mask if mask.dim() == 4 else mask.view(1, 1, *mask.shape[-2:])
    # Query heads h*group .. h*group+group-1 share key head h; their rows stack along the query
    # axis, so the (T, S) mask tiles `group` times.
    bias = torch.zeros(mask.shape, dtype=plan.embed.dtype, device=device).masked_fill_(~mask, float("-inf"))
    bias = bias.repeat(1, 1, group, 1)
    if bias.shape[0] == 1:
        bias = bias.view(1, group * length, keys)
    else:
        bias = bias.expand(-1, plan.kv_heads, -1, -1).reshape(batch * plan.kv_heads, group * length, keys)
    return Attention(None, bias, True)


def _chunked_fits(plan: Plan, batch: int, length: int, keys: int, device) -> bool:
    """The chunked path: a float32 CPU forward that will be differentiated, within the kept budget.
    Without gradients (the sampler, the reference forward) it would only cost memory."""
    return (
        device.type == "cpu"
        and torch.is_grad_enabled()
        and plan.embed.dtype == torch.float32
        and plan.head_dim >= CHUNKED_ATTENTION_MIN_HEAD_DIM
        and chunked_attention.kept_scores(batch, plan.heads, length, keys) <= CHUNKED_ATTENTION_KEPT_SCORES
    )


def _row_groups(starts: list[int], past_length: int, one_row_each: bool = False) -> tuple[RowGroup, ...]:
    """Runs of consecutive rows with one first real column (a GRPO group's samples make one run).
    `one_row_each`: every row its own group (see `forward`)."""
    groups, first = [], 0
    for row in range(1, len(starts) + 1):
        if row == len(starts) or one_row_each or starts[row] != starts[first]:
            groups.append(RowGroup(first, row, starts[first], max(0, starts[first] - past_length)))
            first = row
    return tuple(groups)


def _attend_in_groups(plan: Plan, groups: tuple[RowGroup, ...], q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Each group of rows attends over its own real keys only, so a row computes exactly what it
    computes alone: the same shapes and strides through SDPA's flash kernel, whose work per (row,
    head, query block) does not depend on how many rows there are. Masked padding would not do: how
    many padding keys precede a row's changes the blocks its softmax and sums run in (and the
    baddbmm of the small-call path rounds a row differently with the batch size at 16 threads).
    Padding queries get zeros."""
    parts = []
    for group in groups:
        rows = slice(group.first_row, group.end_row)
        queries = q[rows, :, group.first_query :].contiguous()  # a view of one layout or another: one layout
        keys, values = k[rows, :, group.first_key :], v[rows, :, group.first_key :]
        length, width = queries.shape[2], keys.shape[2]
        mask = None
        if 1 < length < width:  # queries after past keys: causal aligned to the end
            mask = torch.ones(length, width, dtype=torch.bool, device=q.device).tril(width - length)
        parts.append(F.scaled_dot_product_attention(
            queries, keys, values, attn_mask=mask, is_causal=mask is None and length > 1, scale=plan.scaling,
            enable_gqa=plan.heads != plan.kv_heads,
        ))
    if all(group.first_query == 0 for group in groups):
        return parts[0] if len(parts) == 1 else torch.cat(parts)
    out = q.new_zeros(q.shape)
    for group, part in zip(groups, parts, strict=True):
        out[group.first_row : group.end_row, :, group.first_query :] = part
    return out


def _attend(plan: Plan, how: Attention, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """q (B, H, T, D) over k, v (B, KV, S, D) -> (B, H, T, D)."""
    if how.groups:
        return _attend_in_groups(plan, how.groups, q, k, v)
    if how.chunked:
        return chunked_attention.causal_attention(q, k, v, plan.scaling)
    if not how.matmul:
        return F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=how.sdpa_mask,
            is_causal=how.sdpa_mask is None and q.shape[2] > 1,
            scale=plan.scaling,
            enable_gqa=plan.heads != plan.kv_heads,
        )
    batch, heads, length, dim = q.shape
    kv_heads, keys = k.shape[1], k.shape[2]
    queries = q.reshape(batch * kv_heads, heads // kv_heads * length, dim)
    keys_t = k.reshape(batch * kv_heads, keys, dim).transpose(1, 2)
    if how.bias is None:
        scores = torch.bmm(queries, keys_t) * plan.scaling
    else:
        scores = torch.baddbmm(how.bias, queries, keys_t, alpha=plan.scaling)
    weights = torch.softmax(scores, dim=-1)
    return torch.bmm(weights, v.reshape(batch * kv_heads, keys, dim)).view(batch, heads, length, dim)


def _layer(plan: Plan, layer: LayerPlan, h: Tensor, cos, sin, how: Attention, past) -> tuple[Tensor, tuple]:
    batch, length, _ = h.shape
    heads, kv_heads, dim = plan.heads, plan.kv_heads, plan.head_dim
    x = rms_norm(h, layer.input_norm, plan.eps)
    qkv = layer.qkv(x).view(batch, length, heads + 2 * kv_heads, dim)
    # Queries and keys are normed and rotated together: one op each instead of two. `split`, not
    # slicing: its backward concatenates the parts' gradients once, where each slice's backward
    # would zero-fill a whole qkv-sized gradient and copy its part in.
    qk, v = qkv.split((heads + kv_heads, kv_heads), dim=2)
    if layer.qk_norm is not None:
        qk = rms_norm(qk, layer.qk_norm, plan.eps)
    q, k = rotary(qk.transpose(1, 2), cos, sin).split((heads, kv_heads), dim=1)
    v = v.transpose(1, 2)
    if hasattr(past, "append"):  # a sampler's cache layer (kv_cache.KVLayer): appended in place
        k, v = past.append(k, v)
    elif past is not None:
        past_k, past_v = past
        if past_k.shape[0] != batch:
            past_k, past_v = past_k.expand(batch, -1, -1, -1), past_v.expand(batch, -1, -1, -1)
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
    else:
        k, v = k.contiguous(), v.contiguous()
    attended = _attend(plan, how, q, k, v)
    h = h + layer.o(attended.transpose(1, 2).reshape(batch, length, heads * dim))
    x = rms_norm(h, layer.post_norm, plan.eps)
    h = h + layer.down(_activated(plan, layer, x, batch_invariant=bool(how.groups)))
    return h, (k, v)


def _activated(plan: Plan, layer: LayerPlan, x: Tensor, batch_invariant: bool = False) -> Tensor:
    """The MLP's silu(gate) * up. A fused gate|up is one matmul whose halves `swiglu` reads in
    place; kept apart (large models), the two outputs are used as they are, not concatenated."""
    if layer.gate_up.fused:
        gate_up = layer.gate_up(x)
        if batch_invariant:
            return _silu_times(*gate_up.split(plan.intermediate, dim=-1))
        return swiglu(gate_up, plan.intermediate)
    gate, up = (part(x) for part in layer.gate_up.parts)
    if batch_invariant:
        return _silu_times(gate, up)
    if gate.requires_grad or up.requires_grad:
        return F.silu(gate) * up
    return F.silu(gate, inplace=True).mul_(up)  # no backward to feed: reuse the gate's buffer


def _silu_times(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up as gate / (1 + exp(-gate)) * up, for batch invariance. Torch's fused silu
    rounds the elements a loop leaves to its scalar tail differently from its vectorised body (1 in
    25 differ), and a multi-threaded elementwise op splits its elements by count, cutting rows at
    places that move with the batch. exp's scalar and vectorised loops agree (320 M float32 values
    checked), and +, / and * round exactly on both."""
    return (gate / torch.neg(gate).exp_().add_(1)).mul_(up)


def forward(
    plan: Plan,
    ids: Tensor,
    *,
    positions: Tensor | None = None,
    mask: Tensor | None = None,
    past: list[tuple[Tensor, Tensor]] | None = None,
    cache=None,
    starts: list[int] | None = None,
    checkpoint_segments: int = 0,
) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
    """Hidden states (B, T, H) before the final norm, and each layer's full keys/values.

    - no `mask`: causal attention aligned to the end: every query sees all `past` keys, then this
      call's keys up to its own position (with `past`, a group's completions over its shared
      prompt). Right-padded rows are exact: a real token never attends to the padding after it.
    - `mask` (bool, True = may attend), broadcastable to (B, heads, T, past + T).
    - `positions` (B or 1, T) rotary positions; default past length + arange(T).
    - `past`: per layer (keys, values) of shape (1 or B, kv_heads, P, head_dim); a batch of 1 is
      shared by every row (a group's prompt).
    - `cache`: instead of `past`, a `kv_cache.LeanCache` (B rows) that takes this call's keys and
      values (inference only); the keys/values returned are views of its buffers.
    - `starts`: instead of `mask`, for left-padded rows: row b's keys (past and new) before column
      starts[b] are padding, and the others are causal. Rows attend in groups of one start over
      their own columns only (`_attend_in_groups`) and the MLP's silu is spelled out
      (`_silu_times`), so with batch-invariant projections (`packed_linear.PackedPlan`) a row's
      hidden states are bitwise those it has alone, whatever the thread count. Outputs at padding
      positions are garbage (finite) that callers ignore.
    - `checkpoint_segments` > 0 recomputes activations in that many layer segments on backward.
    """
    if cache is not None:
        past_length, past = cache.length, cache.layers
    else:
        past_length = 0 if past is None else past[0][0].shape[2]
    if positions is None:
        positions = torch.arange(past_length, past_length + ids.shape[1], device=ids.device)[None]
    h = F.embedding(ids, plan.embed)
    cos, sin = plan.rotary(h, positions)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    if starts is not None:
        if mask is not None:
            raise ValueError("pass either `starts` or `mask`, not both")
        # A decode step (one query a row) on several CPU threads attends row by row: there SDPA's flash
        # kernel splits a call's work across threads by how many rows the call has, and a row's sums
        # came out differently in a call of two rows than alone (2-8 threads, measured 2026-12-05);
        # one row a call is exactly the call it makes alone. Prefill, and one thread, keep their runs.
        one_row_each = ids.shape[1] == 1 and ids.device.type == "cpu" and torch.get_num_threads() > 1
        how = Attention(None, None, False, groups=_row_groups(starts, past_length, one_row_each))
    else:
        how = _attention_for(plan, ids.shape[0], ids.shape[1], past_length + ids.shape[1], mask, ids.device)
    if checkpoint_segments and torch.is_grad_enabled() and past is None:
        return _checkpointed(plan, h, cos, sin, how, checkpoint_segments)
    kv = []
    for index, layer in enumerate(plan.layers):
        h, layer_kv = _layer(plan, layer, h, cos, sin, how, None if past is None else past[index])
        kv.append(layer_kv)
    return h, kv


def _checkpointed(plan: Plan, h, cos, sin, how: Attention, segments: int):
    from torch.utils.checkpoint import checkpoint

    count = len(plan.layers)
    segments = max(1, min(segments, count))
    bounds = [round(i * count / segments) for i in range(segments + 1)]

    def run(first: int, last: int, hidden: Tensor) -> Tensor:
        for layer in plan.layers[first:last]:
            hidden, _ = _layer(plan, layer, hidden, cos, sin, how, None)
        return hidden

    for first, last in zip(bounds, bounds[1:], strict=False):
        h = checkpoint(run, first, last, h, use_reentrant=False)
    return h, []


def lm_logprobs(plan: Plan, hidden: Tensor, targets: Tensor, temperature: Tensor | None = None) -> Tensor:
    """log p(targets) from pre-norm hidden states of the positions that predict them.

    `hidden` (..., H) and `targets` (...) line up element for element; the vocabulary projection
    runs only for these positions. `temperature` (broadcast against the logits) divides them.
    """
    logits = lm_logits(plan, hidden)
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()  # bf16/fp16 log-probs are too coarse for ratios
    if temperature is not None:
        logits = logits / temperature
    # cross_entropy is one fused log-softmax + gather, forward and backward (several times faster
    # on CPU than gather - logsumexp, whose backward materialises the full softmax twice).
    vocab = logits.shape[-1]
    nll = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), reduction="none")
    return -nll.view(targets.shape)


def lm_logits(plan: Plan, hidden: Tensor) -> Tensor:
    return F.linear(rms_norm(hidden, plan.final_norm, plan.eps), plan.lm_head, plan.lm_head_bias)


def shared_prefix(ids: Tensor, lengths: list[int]) -> int:
    """How many leading tokens every right-padded row shares (within every row's own length)."""
    if ids.shape[0] < 2:
        return 0
    differs = (~(ids == ids[:1]).all(dim=0)).nonzero()
    shared = int(differs[0]) if len(differs) else ids.shape[1]
    return min(shared, min(lengths))


def predicting_hidden(plan: Plan, ids: Tensor, start: int, *, prefix: int = 0, checkpoint_segments: int = 0):
    """(B, T - start, H) pre-norm hidden states of positions start-1 .. T-2 of right-padded rows:
    row[:, j] is what predicts ids[:, start + j].

    With `prefix` >= 1 the rows' first `prefix` tokens are identical (a group's prompt): they run
    once as a batch of one, and the rest of every row attends to their keys and values (with
    gradients flowing back through the shared part). Positions past a row's end hold garbage
    that callers mask.
    """
    batch, width = ids.shape
    prefix = min(prefix, width - 1)
    if batch == 1 or checkpoint_segments:
        prefix = 0  # nothing to share; checkpointed runs trade speed for memory: one plain forward
    if not prefix:
        hidden, _ = forward(plan, ids, checkpoint_segments=checkpoint_segments)
        return hidden[:, start - 1 : width - 1]
    prefix_hidden, prefix_kv = forward(plan, ids[:1, :prefix])
    # No mask: each completion token sees the whole prompt, then causal within its own row.
    suffix_hidden, _ = forward(plan, ids[:, prefix:], past=prefix_kv)
    # Positions start-1 .. T-2 predict tokens start .. T-1.
    first = start - 1
    if first >= prefix:
        return suffix_hidden[:, first - prefix : width - 1 - prefix]
    shared = prefix_hidden[:, first:prefix].expand(batch, -1, -1)
    return torch.cat([shared, suffix_hidden[:, : width - 1 - prefix]], dim=1)


def sequence_logprobs(
    plan: Plan,
    ids: Tensor,
    start: int,
    *,
    prefix: int = 0,
    checkpoint_segments: int = 0,
    head=None,
    temperatures: Tensor | None = None,
):
    """(B, T) log p(ids[:, t] | ids[:, <t]) for t >= start (0 before) of right-padded rows.

    `head(plan, hidden, targets, temperature=None)` replaces `lm_logprobs` (the fused kernel of
    `gpu_runtime.kernels.lm_head`, when the kernel selection says Triton). `prefix`: see
    `predicting_hidden`. `temperatures` (B,) divide each row's logits.
    """
    hidden = predicting_hidden(plan, ids, start, prefix=prefix, checkpoint_segments=checkpoint_segments)
    temperature = None if temperatures is None else temperatures.to(torch.float32)[:, None, None]
    selected = (head or lm_logprobs)(plan, hidden, ids[:, start:], temperature=temperature)
    return torch.cat([selected.new_zeros(ids.shape[0], start), selected], dim=1)
