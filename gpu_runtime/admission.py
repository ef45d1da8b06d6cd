"""Admission: turn a SampleRequest into a DecodeSequence, or refuse it with a coded error. Imports no Django.

Validates the controls, renders the chat messages through the template (or takes raw prompt
ids), resolves and loads the adapter, and fixes the identities the rollout provenance record
will carry (sampling, template invocation, behaviour policy, tokenizer, backend).
"""

from __future__ import annotations

from concurrent.futures import Future

from core.contracts.sampling import seed_problem
from gpu_runtime.adapters import AdapterManager
from gpu_runtime.sample_types import SampleRequest, SampleRequestError
from gpu_runtime.sequence import DecodeSequence, ThinkingTokens


def admit_request(
    request: SampleRequest,
    future: Future,
    created_at: float,
    *,
    loaded,
    adapters: AdapterManager,
    thinking: ThinkingTokens,
    in_use: set,
) -> DecodeSequence:
    """Validate `request`, render its prompt and resolve its adapter; raise SampleRequestError with a code.

    `in_use` holds the adapter keys of requests in flight, which the adapter cache must not evict.
    """
    config = loaded.model.config
    vocab_size = config.vocab_size
    max_context = getattr(config, "max_position_embeddings", None) or 1 << 30
    try:
        request.sampling.validate()
    except ValueError as exc:
        raise SampleRequestError("invalid_request", str(exc)) from exc
    if (request.messages is None) == (request.prompt_token_ids is None):
        raise SampleRequestError("invalid_request", "Give exactly one of messages or prompt_token_ids.")
    if request.seed is not None and (problem := seed_problem(request.seed)):
        raise SampleRequestError("invalid_request", problem)
    has_budget = request.thinking_budget_tokens is not None or request.thinking_budget_ms is not None
    for name in ("thinking_budget_tokens", "thinking_budget_ms"):
        value = getattr(request, name)
        if value is not None and (not isinstance(value, int) or value < 0):
            raise SampleRequestError("invalid_request", f"{name} must be a non-negative integer.")
    if has_budget and request.messages is not None and not request.enable_thinking:
        raise SampleRequestError("invalid_request", "A thinking budget needs enable_thinking=true.")
    if has_budget and not thinking.close_sequence:
        raise SampleRequestError(
            "invalid_request", "This tokenizer has no </think> token; budgets are unavailable."
        )

    if request.messages is not None:
        kwargs = dict(request.template_kwargs)
        kwargs.pop("enable_thinking", None)
        prompt_text, prompt_ids = loaded.render_prompt(
            request.messages,
            enable_thinking=request.enable_thinking,
            tools=request.tools,
            template_kwargs=kwargs,
        )
        invocation = {
            "tools": list(request.tools or []),
            "template_kwargs": dict(kwargs, enable_thinking=request.enable_thinking),
        }
        if request.tool_choice is not None:
            invocation["tool_choice"] = request.tool_choice
    else:
        prompt_text, prompt_ids = None, [int(t) for t in request.prompt_token_ids]
        invocation = {}
        if any(not 0 <= t < vocab_size for t in prompt_ids):
            raise SampleRequestError("invalid_request", "prompt_token_ids holds ids outside the vocabulary.")
    if not prompt_ids:
        raise SampleRequestError("invalid_request", "The prompt is empty.")
    if len(prompt_ids) >= max_context:
        raise SampleRequestError(
            "context_length_exceeded",
            f"The prompt has {len(prompt_ids)} tokens; the model allows {max_context}.",
        )

    adapter = adapters.resolve(request.adapter, in_use=in_use)
    sampling = request.sampling.to_record()
    if has_budget:
        budget = {"close_token_ids": list(thinking.close_sequence)}
        if request.thinking_budget_tokens is not None:
            budget["max_tokens"] = request.thinking_budget_tokens
        if request.thinking_budget_ms is not None:
            budget["max_time_ms"] = request.thinking_budget_ms
        sampling["thinking_budget"] = budget
    identity = loaded.identity
    policy = {
        "served_model_id": loaded.served_model_id,
        "base_model_sha256": identity["base_model_sha256"],
        "inference_config_sha256": identity["inference_config_sha256"],
        "implementation": identity["implementation"],
    }
    if adapter is not None:
        policy["adapter"] = adapter.identity()
    return DecodeSequence(
        request,
        future,
        prompt_ids=prompt_ids,
        prompt_text=prompt_text,
        adapter=adapter,
        thinking=thinking,
        eos_ids=loaded.eos_token_ids,
        tokenizer=loaded.tokenizer,
        vocab_size=vocab_size,
        device=loaded.device,
        max_context=max_context,
        provenance_base={
            "sampling": sampling,
            "template_invocation": invocation,
            "behavior_policy": policy,
            "tokenizer": dict(identity["tokenizer"]),
            "generation_backend": identity["generation_backend"],
        },
        created_at=created_at,
    )
