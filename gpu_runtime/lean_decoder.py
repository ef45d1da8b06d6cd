"""A lean functional forward for Llama-family decoders (Qwen3, Qwen2, Llama) with live LoRA. Imports no Django.

Why it exists: GRPO runs many small forwards (a group's prompt once, then its completions
against the prompt's keys and values) and the sampler runs one decode step per token. For
those, the Hugging Face forward's per-call bookkeeping (mask builders, cache objects, module
hooks, peft dispatch) costs more than the maths on small models. This module runs the same
computation straight from the same weight tensors (no copies): embedding -> decoder layers
(RMSNorm, projections, rotary, SDPA, SwiGLU) -> final norm, with peft's LoRA terms read from
the wrapped modules at plan time, so `disable_adapter()`, `set_adapter()` and the trainable
LoRA parameters (and their gradients) behave as they do in the peft forward.

`plan_for(model)` captures which tensors a forward uses right now (call it again after
switching adapters); `forward(plan, ids, ...)` returns the final hidden states (before the
final norm) and each layer's keys/values. Results equal the Hugging Face forward up to float
rounding (tests/gpu_runtime/test_lean_decoder.py). A model outside this shape raises
`LeanUnsupported` with the reason; callers then take the Hugging Face path and record it.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")
# Stack q|k|v and gate|up into single matmuls when the stacked copies stay this small (elements,
# all layers): tiny and small models, where per-call overhead dominates. Larger models keep the
# projections separate and copy nothing.
FUSE_MAX_ELEMENTS = 32 * 1024 * 1024
# id(first part's weight) -> (weakref to it, signature, stacked weight, stacked bias). Keyed by id:
# tensors compare elementwise, so they cannot be dictionary keys by value.
_stacked_weights: dict[int, tuple] = {}

__all__ = [
    "LeanUnsupported",
    "Plan",
    "forward",
    "lm_logprobs",
    "plan_for",
    "prefix_attention_mask",
    "unsupported_reason",
]


class LeanUnsupported(Exception):
    """The model (or its current adapter state) is outside what the lean forward computes."""


@dataclass(frozen=True)
class Projection:
    """One linear layer with the LoRA terms active at plan time: y = W x + b + sum(s * B A x)."""

    weight: Tensor
    bias: Tensor | None
    loras: tuple[tuple[Tensor, Tensor, Tensor | None, float], ...]  # (A, B, B's bias, scaling)

    def __call__(self, x: Tensor) -> Tensor:
        y = F.linear(x, self.weight, self.bias)
        if not self.loras:
            return y
        out_dtype = y.dtype
        for a, b, b_bias, scaling in self.loras:
            xa = x if x.dtype == a.dtype else x.to(a.dtype)  # peft casts the input to the LoRA dtype
            y = y + F.linear(F.linear(xa, a), b, b_bias) * scaling
        return y.to(out_dtype)


    def merged(self) -> Projection:
        """The same map with the LoRA terms folded into the weight (for frozen, inference-only use)."""
        if not self.loras:
            return self
        with torch.no_grad():
            return self._merged()

    def _merged(self) -> Projection:
        weight = self.weight.float()
        for a, b, b_bias, scaling in self.loras:
            if b_bias is not None:
                return self  # a LoRA bias does not fold into the weight alone
            weight = weight + (b.float() @ a.float()) * scaling
        return Projection(weight.to(self.weight.dtype), self.bias, ())


@dataclass(frozen=True)
class Stacked:
    """Projections reading the same input, outputs concatenated on the last axis (q|k|v, gate|up).

    Fused (small models): one matmul over the stacked base weights, and each adapter's LoRA as one
    stacked A and one block-diagonal B (zero blocks add exact zeros). Otherwise the projections run
    one by one and their outputs are concatenated (no weight copies)."""

    parts: tuple[Projection, ...]
    weight: Tensor | None = None  # stacked base weight when fused
    bias: Tensor | None = None

    def __call__(self, x: Tensor) -> Tensor:
        if self.weight is None:
            return torch.cat([part(x) for part in self.parts], dim=-1)
        y = F.linear(x, self.weight, self.bias)
        first = self.parts[0].loras
        if not first:
            return y
        out_dtype = y.dtype
        for index, (_, _, _, scaling) in enumerate(first):
            a = torch.cat([part.loras[index][0] for part in self.parts])
            b = torch.block_diag(*[part.loras[index][1] for part in self.parts])
            xa = x if x.dtype == a.dtype else x.to(a.dtype)
            y = y + F.linear(F.linear(xa, a), b) * scaling
        return y.to(out_dtype)


@dataclass(frozen=True)
class LayerPlan:
    input_norm: Tensor
    post_norm: Tensor
    qk_norm: Tensor | None  # (heads + kv_heads, head_dim): Qwen3's per-head q/k norm weights
    qkv: Stacked
    o: Projection
    gate_up: Stacked
    down: Projection


@dataclass(frozen=True)
class Plan:
    embed: Tensor
    layers: tuple[LayerPlan, ...]
    final_norm: Tensor
    lm_head: Tensor
    lm_head_bias: Tensor | None
    rotary: nn.Module  # the model's own rotary embedding (every rope scaling variant it knows)
    eps: float
    heads: int
    kv_heads: int
    head_dim: int
    scaling: float
    intermediate: int


def _causal_lm(model) -> nn.Module:
    """The transformers CausalLM inside `model` (itself, or the one a PeftModel wraps)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PeftModel
    config = getattr(inner, "config", None)
    if config is None or getattr(inner, "lm_head", None) is None or not hasattr(inner, "model"):
        raise LeanUnsupported(f"{type(inner).__name__} is not a transformers causal LM with a decoder body")
    _check_config(config)
    return inner


def unsupported_reason(model) -> str | None:
    """Why the lean forward cannot run `model` as it is now, or None when it can."""
    try:
        plan_for(model)
    except LeanUnsupported as exc:
        return str(exc)
    return None


def _check_config(config) -> None:
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise LeanUnsupported(f"model type {model_type!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise LeanUnsupported(f"activation {config.hidden_act!r} (only silu)")
    layer_types = getattr(config, "layer_types", None) or ()
    if any(kind != "full_attention" for kind in layer_types) or getattr(config, "use_sliding_window", False):
        raise LeanUnsupported("sliding-window attention layers")
    if (getattr(config, "pretraining_tp", 1) or 1) > 1:
        raise LeanUnsupported("pretraining_tp > 1")


def _projection(module: nn.Module) -> Projection:
    if type(module) is nn.Linear:
        return Projection(module.weight, module.bias, ())
    base = getattr(module, "base_layer", None)
    if base is None or type(base) is not nn.Linear or not hasattr(module, "lora_A"):
        raise LeanUnsupported(f"layer type {type(module).__name__}")
    if module.disable_adapters:
        if module.merged:
            raise LeanUnsupported("a disabled adapter whose weights are merged into the base")
        return Projection(base.weight, base.bias, ())
    if module.merged:
        return Projection(base.weight, base.bias, ())
    loras = []
    for name in module.active_adapters:
        if name not in module.lora_A:
            continue
        if name in getattr(module, "lora_variant", {}):
            raise LeanUnsupported(f"LoRA variant {type(module.lora_variant[name]).__name__} (e.g. DoRA)")
        dropout = module.lora_dropout[name]
        if not isinstance(dropout, nn.Identity) and dropout.training and dropout.p > 0:
            raise LeanUnsupported("LoRA dropout in training mode")
        a, b = module.lora_A[name], module.lora_B[name]
        loras.append((a.weight, b.weight, b.bias, module.scaling[name]))
    return Projection(base.weight, base.bias, tuple(loras))


def _stack(parts: tuple[Projection, ...], fuse: bool, merge: bool) -> Stacked:
    if merge:
        parts = tuple(part.merged() for part in parts)
    if not fuse or not _stackable(parts):
        return Stacked(parts)
    if merge:  # merged weights belong to this plan (and may be inference tensors): stack afresh
        return Stacked(parts, *_stacked(parts))
    # The model's own base weights: stack once, share across plans, restack if they change.
    weights = [p.weight for p in parts] + [p.bias for p in parts if p.bias is not None]
    signature = tuple((w.data_ptr(), w._version, tuple(w.shape)) for w in weights)
    anchor = parts[0].weight
    cached = _stacked_weights.get(id(anchor))
    if cached is None or cached[0]() is not anchor or cached[1] != signature:
        # Plain tensors even when first planned under inference_mode: training may use them.
        with torch.inference_mode(False):
            cached = (weakref.ref(anchor), signature, *_stacked(parts))
        weakref.finalize(anchor, _stacked_weights.pop, id(anchor), None)
        _stacked_weights[id(anchor)] = cached
    return Stacked(parts, cached[2], cached[3])


@torch.no_grad()
def _stacked(parts: tuple[Projection, ...]) -> tuple[Tensor, Tensor | None]:
    bias = None
    if any(p.bias is not None for p in parts):
        bias = torch.cat([p.bias if p.bias is not None else p.weight.new_zeros(p.weight.shape[0]) for p in parts])
    return torch.cat([p.weight for p in parts]), bias


def _stackable(parts: tuple[Projection, ...]) -> bool:
    """One matmul serves them all: same LoRA layout (count, scaling, no B bias) in every part."""
    first = parts[0].loras
    for part in parts:
        if len(part.loras) != len(first) or part.weight.dtype != parts[0].weight.dtype:
            return False
        for mine, theirs in zip(part.loras, first, strict=True):
            if mine[2] is not None or mine[3] != theirs[3] or mine[0].dtype != theirs[0].dtype:
                return False
    return True


def _stacked_norm(q_weight: Tensor, k_weight: Tensor, heads: int, kv_heads: int) -> Tensor:
    with torch.inference_mode(False), torch.no_grad():
        return torch.cat([q_weight.expand(heads, -1), k_weight.expand(kv_heads, -1)])


def plan_for(model, *, merge_lora: bool = False) -> Plan:
    """What a forward of `model` uses now (weights are referenced; small models get stacked copies
    of their base projections, cached across plans). `merge_lora` folds the active LoRA terms into
    the weights, for inference on frozen adapters of small models (no LoRA matmuls per step)."""
    lm = _causal_lm(model)
    config = lm.config
    body = lm.model
    if getattr(body, "rotary_emb", None) is None or getattr(body, "embed_tokens", None) is None:
        raise LeanUnsupported("the model has no rotary embedding module")
    if lm.lm_head.__class__ is not nn.Linear:
        raise LeanUnsupported(f"lm_head is {type(lm.lm_head).__name__}")
    heads = config.num_attention_heads
    kv_heads = config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    hidden = config.hidden_size
    stacked = len(body.layers) * hidden * ((heads + 2 * kv_heads) * head_dim + 2 * config.intermediate_size)
    fuse = stacked <= FUSE_MAX_ELEMENTS
    merge = merge_lora and fuse
    layers = []
    for layer in body.layers:
        attention, mlp = layer.self_attn, layer.mlp
        q_norm, k_norm = getattr(attention, "q_norm", None), getattr(attention, "k_norm", None)
        qk_norm = None
        if q_norm is not None:
            qk_norm = _stacked_norm(q_norm.weight, k_norm.weight, heads, kv_heads)
        o, down = _projection(attention.o_proj), _projection(mlp.down_proj)
        layers.append(
            LayerPlan(
                input_norm=layer.input_layernorm.weight,
                post_norm=layer.post_attention_layernorm.weight,
                qk_norm=qk_norm,
                qkv=_stack(
                    tuple(_projection(m) for m in (attention.q_proj, attention.k_proj, attention.v_proj)),
                    fuse,
                    merge,
                ),
                o=o.merged() if merge else o,
                gate_up=_stack((_projection(mlp.gate_proj), _projection(mlp.up_proj)), fuse, merge),
                down=down.merged() if merge else down,
            )
        )
    return Plan(
        embed=body.embed_tokens.weight,
        layers=tuple(layers),
        final_norm=body.norm.weight,
        lm_head=lm.lm_head.weight,
        lm_head_bias=lm.lm_head.bias,
        rotary=body.rotary_emb,
        eps=config.rms_norm_eps,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        scaling=getattr(body.layers[0].self_attn, "scaling", head_dim**-0.5),
        intermediate=config.intermediate_size,
    )


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm over the last axis; `weight` broadcasts over the trailing axes it covers."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32 and weight.dim() == 1:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    # Reduced precision: normalise in float32 and cast back before the weight, as transformers does.
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


# Below this many attention scores (batch x heads x queries x keys), explicit batched matmuls
# beat the fused SDPA kernel's per-call setup on CPU; above it SDPA avoids materialising them.
SMALL_ATTENTION_SCORES = 1 << 20


@dataclass(frozen=True)
class Attention:
    """How every layer of one forward attends: SDPA with a bool mask, or batched matmuls with an
    additive bias laid out for grouped queries (built once per forward, not once per layer)."""

    sdpa_mask: Tensor | None
    bias: Tensor | None  # (B*KV or 1, group*T, S) additive, for the matmul path
    matmul: bool


def _attention_for(plan: Plan, batch: int, length: int, keys: int, mask: Tensor | None, device) -> Attention:
    if batch * plan.heads * length * keys > SMALL_ATTENTION_SCORES or device.type != "cpu":
        return Attention(mask, None, False)
    group = plan.heads // plan.kv_heads
    if mask is None and length > 1:
        mask = torch.ones(length, keys, dtype=torch.bool, device=device).tril(keys - length)
    if mask is None:
        return Attention(None, None, True)
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


def _attend(plan: Plan, how: Attention, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """q (B, H, T, D) over k, v (B, KV, S, D) -> (B, H, T, D)."""
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
    # Queries and keys are normed and rotated together: one op each instead of two.
    qk = qkv[:, :, : heads + kv_heads]
    if layer.qk_norm is not None:
        qk = rms_norm(qk, layer.qk_norm, plan.eps)
    qk = _rotate(qk.transpose(1, 2), cos, sin)
    q, k = qk[:, :heads], qk[:, heads:]
    v = qkv[:, :, heads + kv_heads :].transpose(1, 2)
    if past is not None:
        past_k, past_v = past
        if past_k.shape[0] != batch:
            past_k, past_v = past_k.expand(batch, -1, -1, -1), past_v.expand(batch, -1, -1, -1)
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
    else:
        k, v = k.contiguous(), v.contiguous()
    attended = _attend(plan, how, q, k, v)
    h = h + layer.o(attended.transpose(1, 2).reshape(batch, length, heads * dim))
    x = rms_norm(h, layer.post_norm, plan.eps)
    gate, up = layer.gate_up(x).split(plan.intermediate, dim=-1)
    h = h + layer.down(F.silu(gate) * up)
    return h, (k, v)


def forward(
    plan: Plan,
    ids: Tensor,
    *,
    positions: Tensor | None = None,
    mask: Tensor | None = None,
    past: list[tuple[Tensor, Tensor]] | None = None,
    checkpoint_segments: int = 0,
) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
    """Hidden states (B, T, H) before the final norm, and each layer's full keys/values.

    - no `mask`, no `past`: causal attention. Right-padded rows are exact: a real token never
      attends to the padding after it.
    - `mask` (bool, True = may attend), broadcastable to (B, heads, T, past + T); required with
      `past` unless T == 1 and every past column is visible.
    - `positions` (B or 1, T) rotary positions; default past length + arange(T).
    - `past`: per layer (keys, values) of shape (1 or B, kv_heads, P, head_dim); a batch of 1 is
      shared by every row (a group's prompt).
    - `checkpoint_segments` > 0 recomputes activations in that many layer segments on backward.
    """
    past_length = 0 if past is None else past[0][0].shape[2]
    if positions is None:
        positions = torch.arange(past_length, past_length + ids.shape[1], device=ids.device)[None]
    h = F.embedding(ids, plan.embed)
    cos, sin = plan.rotary(h, positions)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
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


def lm_logprobs(plan: Plan, hidden: Tensor, targets: Tensor) -> Tensor:
    """log p(targets) from pre-norm hidden states of the positions that predict them.

    `hidden` (..., H) and `targets` (...) line up element for element; the vocabulary projection
    runs only for these positions.
    """
    logits = lm_logits(plan, hidden)
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()  # bf16/fp16 log-probs are too coarse for ratios
    # cross_entropy is one fused log-softmax + gather, forward and backward (several times faster
    # on CPU than gather - logsumexp, whose backward materialises the full softmax twice).
    vocab = logits.shape[-1]
    nll = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1), reduction="none")
    return -nll.view(targets.shape)


def lm_logits(plan: Plan, hidden: Tensor) -> Tensor:
    return F.linear(rms_norm(hidden, plan.final_norm, plan.eps), plan.lm_head, plan.lm_head_bias)


def prefix_attention_mask(prefix: int, length: int, device) -> Tensor:
    """(length, prefix + length) bool: every query sees the whole prefix, then causal within."""
    causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
    return torch.cat([torch.ones(length, prefix, dtype=torch.bool, device=device), causal], dim=1)


def sequence_logprobs(plan: Plan, ids: Tensor, start: int, *, prefix: int = 0, checkpoint_segments: int = 0):
    """(B, T) log p(ids[:, t] | ids[:, <t]) for t >= start (0 before) of right-padded rows.

    With `prefix` >= 1 the rows' first `prefix` tokens are identical (a group's prompt): they run
    once as a batch of one, and the rest of every row attends to their keys and values (with
    gradients flowing back through the shared part). Positions past a row's end hold garbage
    that callers mask.
    """
    batch, width = ids.shape
    prefix = min(prefix, width - 1)
    if batch == 1 or checkpoint_segments:
        prefix = 0  # nothing to share; checkpointed runs trade speed for memory: one plain forward
    if prefix:
        prefix_hidden, prefix_kv = forward(plan, ids[:1, :prefix])
        suffix_ids = ids[:, prefix:]
        mask = prefix_attention_mask(prefix, suffix_ids.shape[1], ids.device)
        suffix_hidden, _ = forward(plan, suffix_ids, mask=mask, past=prefix_kv)
        # Positions start-1 .. T-2 predict tokens start .. T-1.
        first = start - 1
        parts = []
        if first < prefix:
            parts.append(prefix_hidden[:, first:prefix].expand(batch, -1, -1))
            parts.append(suffix_hidden[:, : width - 1 - prefix])
        else:
            parts.append(suffix_hidden[:, first - prefix : width - 1 - prefix])
        hidden = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
    else:
        hidden, _ = forward(plan, ids, checkpoint_segments=checkpoint_segments)
        hidden = hidden[:, start - 1 : width - 1]
    selected = lm_logprobs(plan, hidden, ids[:, start:])
    return torch.cat([selected.new_zeros(batch, start), selected], dim=1)
