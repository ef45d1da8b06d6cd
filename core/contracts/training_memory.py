"""How much memory one GRPO step needs beyond the resident model: the estimate behind the 413
`training_will_not_fit` (reference-spec §1.0). Pure arithmetic; imports no Django and no torch.

The trainer (`gpu_runtime.grpo.step`) takes one optimizer step per group on the lean forward: the
group's shared prompt once, then every completion after it. The base weights are already resident
(the trainer shares the sampler's), so a step needs:
- the adapter: LoRA weights, their gradients and the optimizer's moments, all float32;
- the activations the policy forward keeps for its backward, per layer: for every token fed the
  SwiGLU's gate|up output and their product (3 x intermediate), four hidden-wide tensors (the two
  norms' inputs and outputs), the packed q|k|v, the grouped queries and the attention output
  (2 x query width) and the LoRA inputs' low-rank projections; for every completion row the prompt's
  keys and values it attends over (2 x key/value width x its context); on the CPU the attention
  probabilities too, up to a budget a layer. With
  `grad_checkpoint_segments` only the segment boundaries stay, plus one segment while it recomputes.
  `tests/gpu_runtime/test_training_memory_estimate.py` holds this to the bytes the lean forward
  really saves;
- the log-probabilities: on the torch path the LM head's logits (tokens x vocabulary, float32) are
  kept for the backward and their gradient is as large; the fused Triton head works in tiles and
  keeps none of them.

Activations are float32 on the CPU and bfloat16 on CUDA. Allocator slack and
the backward's short-lived per-layer gradients are not counted, so the estimate is a floor: a step
it refuses cannot fit, and one it passes may still run out (the trainer then fails with `oom`).
"""

from __future__ import annotations

from dataclasses import dataclass

MIB = 2**20
# Per message the chat template adds a few tokens of its own (role markers, separators) to the text.
TEMPLATE_TOKENS_PER_MESSAGE = 8
# Text counted without the model's tokenizer: at most one token per this many UTF-8 bytes is
# assumed (BPE vocabularies average three to four bytes a token on English), so the count stays low.
BYTES_PER_TOKEN_WITHOUT_TOKENIZER = 4

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
# The most attention probabilities a CPU training forward keeps a layer (gpu_runtime.lean_decoder's
# CHUNKED_ATTENTION_KEPT_SCORES; past it the flash kernel runs, which keeps none).
KEPT_ATTENTION_SCORES_CPU = 1 << 22
# gpu_runtime.grpo.step.MICRO_BATCH_ACTIVATIONS: past this many tokens x hidden x layers a CPU step
# runs its completions in parts.
CPU_MICRO_BATCH_ACTIVATIONS = 1 << 23


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    @classmethod
    def from_config(cls, config: dict) -> ModelShape:
        """The shape from a transformers `config.json` (a multimodal one nests it under text_config).
        KeyError/TypeError/ValueError when a field is missing or not a positive integer."""
        config = config.get("text_config") or config
        hidden = _positive(config["hidden_size"])
        heads = _positive(config["num_attention_heads"])
        return cls(
            hidden=hidden,
            intermediate=_positive(config["intermediate_size"]),
            layers=_positive(config["num_hidden_layers"]),
            heads=heads,
            kv_heads=_positive(config.get("num_key_value_heads") or heads),
            head_dim=_positive(config.get("head_dim") or hidden // heads),
            vocab=_positive(config["vocab_size"]),
        )

    @property
    def query_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    def module_dims(self, module: str) -> tuple[int, int] | None:
        """(in, out) features of a projection LoRA can wrap, or None for a name this shape lacks."""
        h, i, q, kv = self.hidden, self.intermediate, self.query_width, self.kv_width
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}.get(module)

    def lora_parameters(self, rank: int, target_modules=DEFAULT_TARGET_MODULES) -> int:
        dims = [self.module_dims(m) for m in target_modules]
        return self.layers * rank * sum(a + b for a, b in (d for d in dims if d is not None))


@dataclass(frozen=True)
class GroupTokens:
    """One group as the trainer feeds it: the shared prompt once, then every completion right-padded
    to the longest (the rows of one forward are as wide as its widest)."""

    prompt: int
    completions: tuple[int, ...]
    shared_prompt: bool = True  # config.shared_prefix_reference: off, every row feeds the prompt again

    @property
    def padded_completions(self) -> int:
        return len(self.completions) * max(self.completions, default=0)

    @property
    def fed(self) -> int:
        if not self.shared_prompt:
            return len(self.completions) * (self.prompt + max(self.completions, default=0))
        return self.prompt + self.padded_completions


def cpu_micro_batches(shape: ModelShape, group: GroupTokens) -> list[GroupTokens]:
    """The parts a CPU token_level step runs its completions in (gpu_runtime.grpo.step's
    `_micro_batches`: at most MICRO_BATCH_ACTIVATIONS tokens x hidden x layers a part)."""
    rows = len(group.completions)
    if rows < 2:
        return [group]
    width = group.prompt + max(group.completions)
    fits = max(1, CPU_MICRO_BATCH_ACTIVATIONS // (shape.hidden * shape.layers * width))
    count = -(-rows // fits)
    size = -(-rows // count)
    return [GroupTokens(group.prompt, group.completions[i : i + size], group.shared_prompt)
            for i in range(0, rows, size)]


@dataclass(frozen=True)
class StepMemory:
    adapter_bytes: int
    activation_bytes: int
    logit_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.adapter_bytes + self.activation_bytes + self.logit_bytes

    def to_dict(self) -> dict:
        return {"total_mib": mib(self.total_bytes), "adapter_and_optimizer_mib": mib(self.adapter_bytes),
                "activations_mib": mib(self.activation_bytes), "logits_mib": mib(self.logit_bytes)}


def mib(count: int) -> float:
    return round(count / MIB, 1)


def saved_activation_elements(shape: ModelShape, group: GroupTokens, *, lora_rank: int,
                              target_modules=DEFAULT_TARGET_MODULES, device: str = "cpu") -> int:
    """Elements the lean policy forward keeps for its backward over all layers (no checkpointing)."""
    lora_projections = lora_rank * sum(1 for m in target_modules if shape.module_dims(m) is not None)
    per_token = (3 * shape.intermediate + 4 * shape.hidden + shape.query_width + 2 * shape.kv_width
                 + 2 * shape.query_width + lora_projections)
    rows, longest = len(group.completions), max(group.completions, default=0)
    # Each completion row attends over the prompt's keys and values, copied per row, and its own.
    row_keys = 2 * shape.kv_width * rows * (group.prompt + longest)
    # The CPU keeps the softmax probabilities (explicit or chunked attention) up to a budget a layer,
    # past which the flash kernel runs; CUDA's flash/efficient kernels keep none.
    scores = 0
    if device == "cpu":
        scores = shape.heads * (group.prompt * group.prompt + rows * longest * (group.prompt + longest))
        scores = min(scores, KEPT_ATTENTION_SCORES_CPU)
    return shape.layers * (per_token * group.fed + row_keys + scores)


def estimate_step(shape: ModelShape, group: GroupTokens, *, lora_rank: int, target_modules=DEFAULT_TARGET_MODULES,
                  device: str = "cpu", fused_head: bool = False, checkpoint_segments: int = 0,
                  optimizer: str = "adam_w") -> StepMemory:
    """The memory one step over `group` needs beyond the resident model (see the module docstring).
    `device`: "cpu" (float32 activations) or an accelerator ("cuda": bfloat16)."""
    # float32 weight and gradient, plus AdamW's two moments or Muon's momentum (SGD's, when it has one,
    # is left out: a floor)
    per_parameter = {"adam_w": 16, "muon": 12}.get(optimizer, 8)
    adapter = shape.lora_parameters(lora_rank, target_modules) * per_parameter
    elements = saved_activation_elements(shape, group, lora_rank=lora_rank, target_modules=target_modules,
                                         device=device)
    if checkpoint_segments and checkpoint_segments > 0:
        segments = min(checkpoint_segments, shape.layers)
        per_layer = elements // shape.layers
        layers_in_segment = -(-shape.layers // segments)
        elements = segments * group.fed * shape.hidden + layers_in_segment * per_layer
    activations = elements * (4 if device == "cpu" else 2)
    # Kept float32 logits and their gradient; the fused head's tiles are a few MiB whatever the size.
    logits = 0 if fused_head else 2 * group.padded_completions * shape.vocab * 4
    return StepMemory(adapter_bytes=adapter, activation_bytes=activations, logit_bytes=logits)


def text_tokens_without_tokenizer(text: str) -> int:
    return -(-len(text.encode("utf-8")) // BYTES_PER_TOKEN_WITHOUT_TOKENIZER)


def _positive(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"expected a positive integer, not {value!r}")
    return value
