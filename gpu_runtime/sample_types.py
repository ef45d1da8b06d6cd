"""Plain request/result types of the batched sampler. Imports no Django (nor torch).

A SampleRequest carries chat messages (rendered through the model's chat template) or raw
prompt token ids, the sampling controls, an optional adapter name and seed, and the thinking
switches. A SampleResult carries every token with its behaviour log-prob and source, the decoded
text split into reasoning and content, usage, timing, and the identities a
kiln.rollout-provenance.v1 record needs (see core.contracts.provenance).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from gpu_runtime.sampling import SamplingParams

SOURCE_SAMPLED = "sampled"
SOURCE_FORCED = "forced"
FINISH_STOP = "stop"
FINISH_LENGTH = "length"


class SampleRequestError(Exception):
    """A request the sampler refuses or cannot serve. Codes are stable:

    invalid_request, context_length_exceeded, adapter_not_found, adapter_load_failed,
    adapter_content_mismatch, sampler_stopped, generation_failed.
    """

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class SampleRequest:
    messages: list[dict] | None = None  # chat messages, rendered through the chat template
    prompt_token_ids: list[int] | None = None  # or an already-tokenised prompt (exactly one of the two)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    adapter: str | None = None  # None or "base" = the base model
    seed: int | None = None  # u64; None draws one (returned in the result)
    enable_thinking: bool = True
    thinking_budget_tokens: int | None = None  # reasoning tokens before `</think>` is forced
    thinking_budget_ms: int | None = None  # wall-clock reasoning budget, same effect
    tools: list[dict] | None = None
    tool_choice: object | None = None  # recorded in provenance; the template does not use it
    template_kwargs: dict = field(default_factory=dict)  # extra chat-template kwargs
    ignore_eos: bool = False  # keep sampling past end-of-turn (benchmarks); stop strings still apply
    # Called on the sampler thread after each accepted token with the completion ids so far (read
    # it, do not keep or change it); streaming uses it. It must return quickly.
    on_token: object | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)


@dataclass
class SampleResult:
    request_id: str
    prompt_text: str | None
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    token_logprobs: list[
        float
    ]  # behaviour log-prob of each completion token (forced: what it would have had)
    token_sources: list[str]  # "sampled" | "forced"
    finish_reason: str  # "stop" | "length"
    stop_reason: str | int | None  # the stop string or end-of-turn token id that ended it
    text: str  # decoded completion (special tokens dropped), cut before a matched stop string
    reasoning_content: str | None  # None when thinking is off; text before `</think>` otherwise
    content: str  # text after `</think>` (byte-exact), or all text when thinking is off
    usage: dict  # prompt_tokens, completion_tokens, total_tokens, reasoning_tokens
    timing: dict  # queue_ms, prefill_ms, ttft_ms, decode_ms, total_ms
    seed: int
    adapter: dict | None  # {"name", "content_sha256"} or None for the base model
    sampling: dict  # provenance `sampling` object (incl. thinking_budget when one applied)
    template_invocation: dict  # provenance `template_invocation` ({} for raw-token prompts)
    behavior_policy: dict  # provenance `behavior_policy`
    tokenizer: dict  # provenance `tokenizer`
    generation_backend: str
