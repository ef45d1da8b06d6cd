"""The training memory preflight: a GRPO submission one of whose steps cannot fit in the memory a step
may use is refused before it is queued, with 413 `training_will_not_fit` (reference-spec §1.0), instead
of running out of memory on the GPU worker later.

The budget is `[training] memory_budget_mib` when set (any device), else what the live GPU worker
publishes for its accelerator in its heartbeat (gpu_runtime.device_memory); a CPU worker publishes
none, so on a CPU the check runs only under a configured budget (host memory is the host's to govern,
and a large CPU step already runs in micro-batches). The estimate (core.contracts.training_memory) is
a floor, so a refusal means the step cannot fit.

Token counts: exact from a rollout's provenance record when it carries one; else counted with the
model's `tokenizer.json` (the `tokenizers` library, no torch), only for groups whose byte count says
they could matter (a token is at least one byte); without a tokenizer file, one token per four bytes,
which undercounts and so never refuses wrongly.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from core.contracts.training_memory import (
    TEMPLATE_TOKENS_PER_MESSAGE,
    GroupTokens,
    ModelShape,
    StepMemory,
    cpu_micro_batches,
    estimate_step,
    text_tokens_without_tokenizer,
)
from core.errors import KilnError

BUDGET_SETTING = "[training] memory_budget_mib (KILN_TRAINING_MEMORY_BUDGET_MIB)"
WILL_NOT_FIT_HINT = ("send fewer or shorter completions per group, set config.grad_checkpoint_segments (e.g. 4), "
                     "lower config.lora_rank, or free accelerator memory; " + BUDGET_SETTING + " sets the budget")


@dataclass(frozen=True)
class StepBudget:
    mib: float
    source: str
    device: str  # "cpu" or "cuda": the dtype and attention kernels the estimate assumes
    fused_head: bool  # the GPU worker's Triton LM head: no logits are kept


def step_budget() -> StepBudget | None:
    """The memory one step may use beyond the resident model, or None when nothing sets one."""
    from core.jobs.selectors import workers_alive

    workers = [w for w in workers_alive() if "gpu" in (w.queues or [])]
    models = [(w.status or {}).get("model") or {} for w in workers]
    device = "cuda" if any(str(m.get("device", "")).startswith("cuda") for m in models) else "cpu"
    fused_head = bool(models) and all(((m.get("kernels") or {}).get("backend") == "triton") for m in models)
    configured = settings.KILN.training_memory_budget_mib
    if configured:
        return StepBudget(float(configured), BUDGET_SETTING, device, fused_head)
    memories = [(w.status or {}).get("memory") for w in workers]
    memories = [m for m in memories if isinstance(m, dict) and isinstance(m.get("available_for_training_mib"), int | float)]
    if not memories:
        return None
    tightest = min(memories, key=lambda m: m["available_for_training_mib"])
    return StepBudget(float(tightest["available_for_training_mib"]),
                      f"the GPU worker's {tightest.get('device', 'accelerator')} ({tightest.get('total_mib')} MiB, "
                      f"{tightest['available_for_training_mib']} MiB free for training)", "cuda", fused_head)


def memory_plan(groups: list[dict], config, budget: StepBudget | None) -> dict | None:
    """The largest step's estimate against the budget; None when the model's shape is unknown."""
    shape = _model_shape()
    if shape is None:
        return None
    device = budget.device if budget else "cpu"
    fused = budget.fused_head if budget else False
    counter = _TokenCounter()
    largest: tuple[StepMemory, GroupTokens, int] | None = None
    for index, group in enumerate(groups):
        bound = _group_tokens(group, config, counter, exact=False)
        if largest is not None and _step(shape, bound, config, device, fused).total_bytes <= largest[0].total_bytes:
            continue  # even counting a token per byte, this group's step is no larger
        tokens = _group_tokens(group, config, counter, exact=True)
        step = _step(shape, tokens, config, device, fused)
        if largest is None or step.total_bytes > largest[0].total_bytes:
            largest = (step, tokens, index)
    if largest is None:
        return None
    step, tokens, index = largest
    return {
        "largest_step": {**step.to_dict(), "group": index, "prompt_tokens": tokens.prompt,
                         "completions": len(tokens.completions), "longest_completion_tokens": max(tokens.completions)},
        "device": device,
        "token_counts": counter.how,
        "budget_mib": budget.mib if budget else None,
        "budget_source": budget.source if budget else None,
        "fits": None if budget is None else step.total_bytes / 2**20 <= budget.mib,
    }


def check_step_memory(groups: list[dict], config) -> dict | None:
    """The memory plan; KilnError 413 `training_will_not_fit` when a budget is set and the largest
    step's estimate exceeds it."""
    budget = step_budget()
    plan = memory_plan(groups, config, budget) if budget is not None else None
    if plan is not None and plan["fits"] is False:
        largest = plan["largest_step"]
        raise KilnError(
            "training_will_not_fit",
            f"a GRPO step needs at least {largest['total_mib']} MiB beyond the model (adapter and optimizer "
            f"{largest['adapter_and_optimizer_mib']}, activations {largest['activations_mib']}, logits "
            f"{largest['logits_mib']}) for group {largest['group']} ({largest['prompt_tokens']} prompt tokens, "
            f"{largest['completions']} completions of up to {largest['longest_completion_tokens']} tokens), "
            f"but {budget.source} allows {budget.mib:g} MiB",
            status=413, hint=WILL_NOT_FIT_HINT)
    return plan


def _step(shape: ModelShape, tokens: GroupTokens, config, device: str, fused: bool) -> StepMemory:
    """The largest optimizer step of one group: the whole group, one completion (per_sample), or the
    CPU's largest micro-batch."""
    if config.loss_aggregation == "per_sample":
        parts = [GroupTokens(tokens.prompt, (max(tokens.completions),), tokens.shared_prompt)]
    elif device == "cpu":
        parts = cpu_micro_batches(shape, tokens)
    else:
        parts = [tokens]
    optimizer = getattr(config.optimizer, "kind", "adam_w")
    steps = [estimate_step(shape, part, lora_rank=config.lora_rank, device=device, fused_head=fused,
                           checkpoint_segments=config.grad_checkpoint_segments or 0, optimizer=optimizer)
             for part in parts]
    return max(steps, key=lambda s: s.total_bytes)


def _group_tokens(group: dict, config, counter: _TokenCounter, *, exact: bool) -> GroupTokens:
    """The group's prompt and completion lengths: exact from provenance, else counted (exact=True) or
    bounded above by their UTF-8 bytes (exact=False)."""
    count = counter.count if exact else _bytes
    prompt = sum(count(m.get("content") or "") + TEMPLATE_TOKENS_PER_MESSAGE for m in group["messages"])
    completions = []
    for completion in group["completions"]:
        record = completion.get("provenance") or {}
        ids, prompt_count = record.get("input_token_ids"), record.get("prompt_token_count")
        if isinstance(ids, list) and isinstance(prompt_count, int) and 0 < prompt_count <= len(ids):
            prompt = max(prompt, prompt_count)  # the rendered prompt, system and template included
            completions.append(len(ids) - prompt_count)
            continue
        segments = completion.get("trajectory") or []
        text = "".join(s.get("content", "") for s in segments) or completion["text"]
        completions.append(count(text) + 1)  # and the end-of-turn token
    return GroupTokens(prompt, tuple(max(1, c) for c in completions), bool(config.shared_prefix_reference))


def _bytes(text: str) -> int:
    return len(text.encode("utf-8"))


class _TokenCounter:
    """Counts text with the served model's tokenizer.json when it has one (see the module docstring)."""

    _cache: dict = {}
    _lock = threading.Lock()

    def __init__(self):
        self.tokenizer = self._tokenizer()
        self.how = "tokenizer" if self.tokenizer is not None else "utf-8 bytes / 4"

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self.tokenizer is None:
            return text_tokens_without_tokenizer(text)
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    @classmethod
    def _tokenizer(cls):
        path = settings.KILN.model_path and Path(settings.KILN.model_path) / "tokenizer.json"
        if not path or not path.is_file():
            return None
        key = (str(path), path.stat().st_mtime_ns)
        with cls._lock:
            if key not in cls._cache:
                try:
                    from tokenizers import Tokenizer

                    cls._cache = {key: Tokenizer.from_file(str(path))}
                except Exception:  # noqa: BLE001 - an unreadable tokenizer: count bytes instead
                    cls._cache = {key: None}
            return cls._cache[key]


def _model_shape() -> ModelShape | None:
    path = settings.KILN.model_path and Path(settings.KILN.model_path) / "config.json"
    try:
        return ModelShape.from_config(json.loads(path.read_text())) if path else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # health and the worker report a model that cannot be read; nothing to estimate
