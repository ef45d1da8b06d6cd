"""What a lean forward of a Llama-family decoder reads: `plan_for(model) -> Plan`. Imports no Django.

A plan references the model's own tensors (base weights, norms, rotary module) and the LoRA
terms peft has active at plan time; it copies nothing, except that small models get their q|k|v
and gate|up base weights stacked once (cached per weight tensor) so each runs as one matmul, and
inference plans may fold a frozen adapter's LoRA into those stacks (`merge_lora`). On the CPU,
stacks of models too large for its caches are packed for oneDNN instead of copied plainly
(`gpu_runtime.onednn_linear`; `Plan.packing_problem` says why not where they are not). Models outside
the supported shape raise `LeanUnsupported` with the reason. The forward itself is in
`gpu_runtime.lean_decoder`.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gpu_runtime import onednn_linear

__all__ = ["LayerPlan", "LeanUnsupported", "Plan", "Projection", "Stacked", "cached_per_tensor", "plan_for",
           "unsupported_reason"]

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")
# Stack q|k|v and gate|up into single matmuls when the stacked copies stay this small (elements,
# all layers): tiny and small models, where per-call overhead dominates. Larger models keep the
# projections separate and copy nothing.
FUSE_MAX_ELEMENTS = 32 * 1024 * 1024
# id(first part's weight) -> (weakref to it, signature, (stacked weight, stacked bias)): `cached_per_tensor`;
# the same for stacks packed for oneDNN.
_stacked_weights: dict[int, tuple] = {}
_packed_stacks: dict[int, tuple] = {}


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
            y = _add_lora(y, F.linear(xa, a), b, b_bias, scaling)
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

    Fused (small models): one matmul over the stacked base weights (plain, or packed for oneDNN),
    and each adapter's LoRA as one stacked A and one block-diagonal B (zero blocks add exact zeros).
    Otherwise the projections run one by one and their outputs are concatenated (no weight copies)."""

    parts: tuple[Projection, ...]
    weight: Tensor | None = None  # stacked base weight when fused plainly
    bias: Tensor | None = None
    packed: Tensor | None = None  # onednn_linear.pack(stacked base weight) when fused packed

    @property
    def fused(self) -> bool:
        return self.weight is not None or self.packed is not None

    def __call__(self, x: Tensor) -> Tensor:
        if self.packed is not None:
            y = onednn_linear.linear(x, self.packed, self.bias, tuple(part.weight for part in self.parts))
        elif self.weight is None:
            return torch.cat([part(x) for part in self.parts], dim=-1)
        else:
            y = F.linear(x, self.weight, self.bias)
        first = self.parts[0].loras
        if not first:
            return y
        out_dtype = y.dtype
        for index, (_, _, _, scaling) in enumerate(first):
            a = torch.cat([part.loras[index][0] for part in self.parts])
            b = torch.block_diag(*[part.loras[index][1] for part in self.parts])
            xa = x if x.dtype == a.dtype else x.to(a.dtype)
            y = _add_lora(y, F.linear(xa, a), b, None, scaling)
        return y.to(out_dtype)


def _add_lora(y: Tensor, xa: Tensor, b: Tensor, b_bias: Tensor | None, scaling: float) -> Tensor:
    """y + scaling * (xa @ b.T + b_bias): one addmm (product, scale and sum in one kernel, forward
    and backward) where the shapes and dtypes allow, else the three separate ops."""
    if b_bias is None and y.dtype == xa.dtype == b.dtype:
        out = torch.addmm(y.reshape(-1, y.shape[-1]), xa.reshape(-1, xa.shape[-1]), b.t(), alpha=scaling)
        return out.view(y.shape)
    return y + F.linear(xa, b, b_bias) * scaling


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
    packing_problem: str | None = None  # why the stacks are not packed for oneDNN (None: they are)


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


def _stack(parts: tuple[Projection, ...], fuse: bool, merge: bool, pack: bool) -> Stacked:
    folded = False
    if merge:  # a part with no LoRA (the base model) merges to itself: its stack is the shared one
        merged = tuple(part.merged() for part in parts)
        folded = any(m is not p for m, p in zip(merged, parts, strict=True))
        parts = merged
    if not fuse or not _stackable(parts):
        return Stacked(parts)

    def stack() -> tuple[Tensor | None, Tensor | None, Tensor | None]:  # (weight, bias, packed)
        with torch.inference_mode(False):  # plain tensors even when first planned under inference_mode
            weight, bias = _stacked(parts)
        if pack:  # the packed copy replaces the plain one: the cat above is freed on return
            return None, bias, onednn_linear.pack(weight)
        return weight, bias, None

    if folded:  # a LoRA folded in: these weights are this plan's own (maybe inference tensors): stack afresh
        return Stacked(parts, *stack())
    # The model's own base weights: stack once, share across plans, restack if they change.
    weights = [p.weight for p in parts] + [p.bias for p in parts if p.bias is not None]
    return Stacked(parts, *cached_per_tensor(_packed_stacks if pack else _stacked_weights, parts[0].weight, weights, stack))


def cached_per_tensor(cache: dict, anchor: Tensor, inputs: list[Tensor], make):
    """`make()`, made once per `anchor` tensor and remade when any of `inputs` changes (storage,
    in-place version or shape). Keyed by id (tensors compare elementwise, so they cannot be keys by
    value); the entry goes when the anchor is freed."""
    signature = tuple((t.data_ptr(), t._version, tuple(t.shape)) for t in inputs)
    cached = cache.get(id(anchor))
    if cached is None or cached[0]() is not anchor or cached[1] != signature:
        cached = (weakref.ref(anchor), signature, make())
        weakref.finalize(anchor, cache.pop, id(anchor), None)
        cache[id(anchor)] = cached
    return cached[2]


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
    packing_problem = onednn_linear.packing_problem(_projection_tensors(body), stacked=fuse)
    pack = packing_problem is None
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
                    pack,
                ),
                o=o.merged() if merge else o,
                gate_up=_stack((_projection(mlp.gate_proj), _projection(mlp.up_proj)), fuse, merge, pack),
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
        packing_problem=packing_problem,
    )


def _projection_tensors(body: nn.Module) -> list[Tensor]:
    """The base weights and biases of every layer's projections (what packing would copy)."""
    tensors = []
    for layer in body.layers:
        for module in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                       layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj):
            base = getattr(module, "base_layer", module)
            tensors += [t for t in (getattr(base, "weight", None), getattr(base, "bias", None)) if t is not None]
    return tensors
