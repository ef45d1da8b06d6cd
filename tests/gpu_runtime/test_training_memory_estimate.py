"""The step memory estimate (core.contracts.training_memory) against what the lean policy forward
really keeps for its backward, counted tensor by tensor with autograd's saved-tensor hooks."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from core.contracts.training_memory import GroupTokens, ModelShape, estimate_step, saved_activation_elements
from gpu_runtime import lean_decoder
from gpu_runtime.grpo.adapter_io import attach_lora

# Shapes whose intermediate is not a fixed multiple of the hidden size, with narrow heads (the
# small-call attention) and 64-wide ones (the chunked attention of CPU training).
SHAPES = {
    "narrow": dict(hidden_size=96, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=24, vocab_size=300),
    "wide": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=3, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=64, vocab_size=500),
}


def _plan(shape: dict, rank: int):
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(Qwen3Config(**shape, max_position_embeddings=512)).float()
    model = attach_lora(model, rank=rank, alpha=2 * rank)
    return model, lean_decoder.plan_for(model)


def _resident(value, found: set[int]) -> set[int]:
    """Storages of every tensor a plan holds (its packed weight copies are resident, not per step)."""
    if isinstance(value, torch.Tensor):
        found.add(value.untyped_storage().data_ptr())
    elif isinstance(value, list | tuple):
        for item in value:
            _resident(item, found)
    elif dataclasses.is_dataclass(value):
        for f in dataclasses.fields(value):
            _resident(getattr(value, f.name), found)
    return found


def _saved_bytes(model, plan, prompt: int, completions: list[int], checkpoint_segments: int = 0) -> int:
    """Bytes of distinct storages autograd keeps for the backward of one policy forward (weights excluded)."""
    weights = _resident(plan, {p.untyped_storage().data_ptr() for p in model.parameters()})
    seen: dict[int, int] = {}

    def keep(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            seen[storage.data_ptr()] = storage.nbytes()
        return tensor

    width = prompt + max(completions)
    torch.manual_seed(1)
    ids = torch.randint(5, 250, (len(completions), width))
    ids[:, :prompt] = ids[0, :prompt]  # one group: the shared prompt
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        out = lean_decoder.sequence_logprobs(plan, ids, prompt, prefix=prompt, checkpoint_segments=checkpoint_segments)
    assert out.requires_grad
    return sum(seen.values())


@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize(("prompt", "completions"), [(24, [16] * 8), (40, [8, 30, 12, 30]), (12, [48] * 2), (100, [60] * 16)])
def test_the_estimate_tracks_what_the_policy_forward_keeps(name, prompt, completions):
    rank = 8
    model, plan = _plan(SHAPES[name], rank)
    shape = ModelShape.from_config(model.config.to_dict())
    group = GroupTokens(prompt, tuple(completions))
    measured = _saved_bytes(model, plan, prompt, completions)
    step = estimate_step(shape, group, lora_rank=rank)
    # The torch head keeps the float32 logits once; the estimate adds their gradient (as large).
    estimated = step.activation_bytes + step.logit_bytes // 2
    assert 0.9 * measured <= estimated <= 1.1 * measured, (measured, estimated)
    assert saved_activation_elements(shape, group, lora_rank=rank) * 4 == step.activation_bytes


def test_checkpointing_segments_shrink_the_estimate_as_they_shrink_what_is_kept():
    model, plan = _plan(SHAPES["wide"], 8)
    shape = ModelShape.from_config(model.config.to_dict())
    group = GroupTokens(24, (32,) * 8)
    plain = _saved_bytes(model, plan, 24, [32] * 8)
    checkpointed = _saved_bytes(model, plan, 24, [32] * 8, checkpoint_segments=3)
    assert checkpointed < plain / 2
    plain_estimate = estimate_step(shape, group, lora_rank=8)
    checkpointed_estimate = estimate_step(shape, group, lora_rank=8, checkpoint_segments=3)
    # Checkpointing keeps the segment boundaries, but the backward recomputes one segment at a time.
    assert checkpointed_estimate.activation_bytes < plain_estimate.activation_bytes / 2
    assert checkpointed_estimate.activation_bytes >= checkpointed - checkpointed_estimate.logit_bytes


def test_the_adapter_part_counts_the_lora_weights_the_trainer_attaches():
    model, _ = _plan(SHAPES["wide"], 16)
    shape = ModelShape.from_config(model.config.to_dict())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert shape.lora_parameters(16) == trainable
    assert estimate_step(shape, GroupTokens(4, (4,)), lora_rank=16).adapter_bytes == 16 * trainable
    assert estimate_step(shape, GroupTokens(4, (4,)), lora_rank=16, optimizer="muon").adapter_bytes == 12 * trainable
    assert estimate_step(shape, GroupTokens(4, (4,)), lora_rank=16, optimizer="sgd").adapter_bytes == 8 * trainable


def test_the_estimate_uses_the_trainers_own_budgets():
    from core.contracts import training_memory
    from gpu_runtime.grpo import step, train_types

    assert training_memory.CPU_MICRO_BATCH_ACTIVATIONS == step.MICRO_BATCH_ACTIVATIONS
    assert training_memory.KEPT_ATTENTION_SCORES_CPU == lean_decoder.CHUNKED_ATTENTION_KEPT_SCORES
    assert training_memory.DEFAULT_TARGET_MODULES == train_types.DEFAULT_TARGET_MODULES
