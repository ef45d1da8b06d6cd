"""The /v1/chat/completions request as Kiln accepts it: OpenAI fields plus Kiln's own.

Fields the command owns or Kiln does not support are refused with a clear message instead of being
silently ignored (tools, response_format, logit_bias, logprobs, top_logprobs). Unknown extra fields are ignored, as OpenAI
clients send some of their own.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    field_validator,
    model_validator,
)

from core.contracts.sampling import (
    MAX_SEED,
    MAX_STOP_SEQUENCES,
    PENALTY_LIMIT,
    REPETITION_PENALTY_MAX,
    TEMPERATURE_MAX,
    seed_range_problem,
    stop_bytes_problem,
)


def _unicode_text(value):
    """A lone surrogate ("\\ud800") cannot be tokenized; refuse it as a validation error."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("holds a lone surrogate; send valid Unicode text") from None
    return value


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")

    # "developer" is OpenAI's newer name for the system role (its SDK sends it for some models): the
    # chat template knows "system", so it is read as that.
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    reasoning_content: str | None = None
    name: str | None = None
    tool_call_id: str | None = None

    @field_validator("role")
    @classmethod
    def _developer_is_system(cls, value: str) -> str:
        return "system" if value == "developer" else value

    @field_validator("content")
    @classmethod
    def _flatten_parts(cls, value):
        """OpenAI content parts are flattened to their text, as the chat template needs one string."""
        if isinstance(value, list):
            texts = []
            for part in value:
                if part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ValueError("only text content parts are supported")
                texts.append(part["text"])
            value = "".join(texts)
        return _unicode_text(value)

    @field_validator("reasoning_content", "name", "tool_call_id")
    @classmethod
    def _valid_text(cls, value):
        return _unicode_text(value)


def _json_integer(value):
    """An integer field takes a JSON number, never a string ("5") or a boolean (true read as 1)."""
    if isinstance(value, bool | str):
        raise ValueError(f"must be a JSON integer, not {'a boolean' if isinstance(value, bool) else 'a string'}")
    return value


JsonInt = Annotated[int, BeforeValidator(_json_integer)]


class ChatTemplateKwargs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enable_thinking: StrictBool = True  # "no" is refused (a template would read it as true)


class StreamOptions(BaseModel):
    # Other options OpenAI defines (include_obfuscation) change nothing here: ignored, not refused.
    model_config = ConfigDict(extra="ignore")

    include_usage: StrictBool = False  # a last chunk with `choices: []` and the usage, as OpenAI sends


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str = "kiln"
    messages: list[ChatMessage] = Field(min_length=1)
    n: JsonInt = Field(1, ge=1)
    seed: JsonInt | None = Field(None, ge=0, le=MAX_SEED)  # u64, like every other seed (core.contracts.sampling)
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    max_tokens: JsonInt | None = Field(None, ge=1)
    max_completion_tokens: JsonInt | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=TEMPERATURE_MAX)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: JsonInt = Field(0, ge=0)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    stop: str | list[str] | None = Field(None, validate_default=True)  # always a list once parsed
    presence_penalty: float = Field(0.0, ge=-PENALTY_LIMIT, le=PENALTY_LIMIT)
    frequency_penalty: float = Field(0.0, ge=-PENALTY_LIMIT, le=PENALTY_LIMIT)
    repetition_penalty: float = Field(1.0, gt=0.0, le=REPETITION_PENALTY_MAX)
    adapter: str | None = None  # None: the active adapter (the registry says which); "base": the base model
    chat_template_kwargs: ChatTemplateKwargs = Field(default_factory=ChatTemplateKwargs)
    thinking_budget_tokens: JsonInt | None = Field(None, ge=1)
    thinking_budget_ms: JsonInt | None = Field(None, ge=1)  # wall clock of reasoning before </think> is forced
    rollout_provenance: StrictBool = False
    tools: list[dict[str, Any]] | None = None
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: StrictBool | None = None
    top_logprobs: JsonInt | None = None

    @field_validator("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP_SEQUENCES or any(not s for s in stops):
            raise ValueError(f"stop takes at most {MAX_STOP_SEQUENCES} non-empty strings")
        # Checked here, not only by the GPU worker: a stream would already have answered 200.
        problem = stop_bytes_problem([_unicode_text(s) for s in stops])
        if problem:
            raise ValueError(problem)
        return stops

    @model_validator(mode="after")
    def _supported(self):
        if self.tools:
            raise ValueError("tools are not supported by Kiln's sampler")
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise ValueError("response_format other than text is not supported")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported")
        if self.logprobs or self.top_logprobs:
            # refused, not answered with logprobs: null (a client would take that for none computed)
            raise ValueError("logprobs and top_logprobs are not supported; rollout_provenance: true returns each "
                             "sampled token's log-probability")
        for budget in ("thinking_budget_tokens", "thinking_budget_ms"):
            if getattr(self, budget) is not None and not self.chat_template_kwargs.enable_thinking:
                raise ValueError(f"{budget} needs chat_template_kwargs.enable_thinking = true")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        if problem := seed_range_problem(self.seed, self.n):
            raise ValueError(problem)
        if self.messages[-1].role == "assistant":
            raise ValueError("the last message must not be the assistant's: Kiln generates that turn")
        return self

    @property
    def effective_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def adapter_name(self) -> str | None:
        """None means the base model ('base' and an empty value say so too)."""
        return None if self.adapter in (None, "", "base") else self.adapter
