"""Per-request decoding state: tokens, log-probs, thinking budget, stop rules, and the final result. Imports no Django.

One DecodeSequence lives from admission to completion. The scheduler feeds it one token per step
(`accept`), asks it whether the next token is forced (`forced_next`) and for its next uniform
random number (`uniform`); the sequence decides when it is finished and builds its SampleResult.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from array import array
from dataclasses import dataclass

import torch

from gpu_runtime.sample_types import (
    FINISH_LENGTH,
    FINISH_STOP,
    SOURCE_FORCED,
    SOURCE_SAMPLED,
    SampleRequest,
    SampleResult,
)
from gpu_runtime.sampling import PenaltyState

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


@dataclass(frozen=True)
class ThinkingTokens:
    """Token ids of the reasoning markers; None when the tokenizer has no such tokens."""

    open_id: int | None
    close_id: int | None
    turn_start_id: int | None  # <|im_start|>: where the current assistant turn begins
    close_sequence: tuple[int, ...]  # what a budget forces: `</think>` then the blank line

    def prompt_is_thinking(self, prompt_ids: list[int]) -> bool:
        """True when the prompt leaves the model inside an open `<think>` block of the last turn."""
        if self.open_id is None:
            return False
        start = 0
        if self.turn_start_id is not None and self.turn_start_id in prompt_ids:
            start = len(prompt_ids) - 1 - prompt_ids[::-1].index(self.turn_start_id)
        tail = prompt_ids[start:]
        if self.open_id not in tail:
            return False
        last_open = len(tail) - 1 - tail[::-1].index(self.open_id)
        return self.close_id not in tail[last_open:]


def stream_seed(seed: int, prompt_ids: list[int]) -> int:
    """The random stream of a request: its seed mixed with its prompt's token ids (64 bits).

    The same seed and prompt give the same tokens (replay, provenance); the same seed on another
    prompt gives another stream. Seeding by the seed alone made completion j of every task in a
    rollout batch (the guide gives every task seeds 42, 43, ...) draw the same uniforms: correlated
    samples across tasks, and fewer groups with any contrast for GRPO to learn from.
    """
    digest = hashlib.sha256(f"kiln-stream-v2:{int(seed)}:".encode() + array("q", prompt_ids).tobytes()).digest()
    return int.from_bytes(digest[:8], "little")


class DecodeSequence:
    def __init__(
        self,
        request: SampleRequest,
        future,
        *,
        prompt_ids: list[int],
        prompt_text: str | None,
        adapter,  # AdapterHandle | None
        thinking: ThinkingTokens,
        eos_ids: tuple[int, ...],
        tokenizer,
        vocab_size: int,
        device: torch.device,
        max_context: int,
        provenance_base: dict,
        created_at: float,
    ):
        self.request = request
        self.future = future
        self.params = request.sampling
        self.prompt_ids = prompt_ids
        self.prompt_text = prompt_text
        self.adapter = adapter
        self.adapter_key = adapter.key if adapter is not None else None
        self.seed = request.seed if request.seed is not None else secrets.randbits(64)
        self.generator = torch.Generator().manual_seed(stream_seed(self.seed, prompt_ids))
        self._uniforms: list[float] = []
        self.penalties = PenaltyState(prompt_ids, vocab_size, device) if self.params.uses_penalties else None
        self._thinking_tokens = thinking
        self._eos_ids = frozenset(eos_ids)
        self._tokenizer = tokenizer
        self._max_context = max_context
        self._provenance_base = provenance_base
        # A stop string of n characters spans at most 4n byte-level tokens (4 bytes per character):
        # decoding that many trailing tokens each step finds it without re-decoding everything.
        self._stop_window = 4 * max((len(s) for s in self.params.stop), default=0) + 4

        self.completion: list[int] = []
        self.logprobs: list[float] = []
        self.sources: list[str] = []
        self.in_thinking = thinking.prompt_is_thinking(prompt_ids)
        self.template_opened_thinking = self.in_thinking
        self.model_opened_thinking = False
        self.reasoning_tokens = 0
        self._thinking_since = None
        self._forced: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason = None
        self._stop_text: str | None = None

        self.created_at = created_at
        self.admitted_at = time.perf_counter()
        self.prefilled_at: float | None = None
        self.first_token_at: float | None = None

    # -- scheduling ---------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def position(self) -> int:
        """Rotary position of the last accepted token (the one the next forward pass feeds)."""
        return len(self.prompt_ids) + len(self.completion) - 1

    @property
    def has_budget(self) -> bool:
        return self.request.thinking_budget_tokens is not None or self.request.thinking_budget_ms is not None

    def forced_next(self) -> int | None:
        """The next token if a controller forces it (thinking budget spent), else None."""
        if self.in_thinking and self._thinking_since is None:
            self._thinking_since = time.perf_counter()  # the time budget starts with the first decision
        if not self._forced and self.in_thinking and self.has_budget and self._budget_spent():
            self._forced = list(self._thinking_tokens.close_sequence)
        return self._forced.pop(0) if self._forced else None

    def uniform(self) -> float:
        """The next uniform number from this request's own generator (one per sampled token).

        Drawn 64 at a time (one call instead of 64): the stream depends only on the seed, the prompt and on
        how many tokens this request has sampled, never on the batch around it.
        """
        if not self._uniforms:
            self._uniforms = torch.rand(64, generator=self.generator, dtype=torch.float64).tolist()[::-1]
        return self._uniforms.pop()

    def accept(self, token: int, logprob: float, source: str) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        was_thinking = self.in_thinking
        self.completion.append(token)
        self.logprobs.append(logprob)
        self.sources.append(source)
        if self.penalties is not None:
            self.penalties.add(token)
        tt = self._thinking_tokens
        if was_thinking:
            if token == tt.close_id:
                self.in_thinking = False
            elif token not in self._eos_ids:
                self.reasoning_tokens += 1
        elif (token == tt.open_id and len(self.completion) == 1 and self.request.enable_thinking
              and not self.template_opened_thinking):
            # A template that leaves `<think>` to the model (original Qwen3): reasoning starts now. Only
            # as the answer's first token and with thinking asked for: a `<think>` later on (a damaged
            # adapter writes one mid-answer) is content, so reasoning + content still cover the text.
            self.model_opened_thinking = self.in_thinking = True
            self._thinking_since = time.perf_counter()
        self._check_finished(token)
        if self.request.on_token is not None:
            self.request.on_token(self.completion)

    def _budget_spent(self) -> bool:
        req = self.request
        if req.thinking_budget_tokens is not None and self.reasoning_tokens >= req.thinking_budget_tokens:
            return True
        if req.thinking_budget_ms is not None and self._thinking_since is not None:
            return (time.perf_counter() - self._thinking_since) * 1000 >= req.thinking_budget_ms
        return False

    def _check_finished(self, token: int) -> None:
        if token in self._eos_ids and not self.request.ignore_eos:
            self.finish_reason, self.stop_reason = FINISH_STOP, token
            return
        if self.params.stop:
            tail = self._tokenizer.decode(self.completion[-self._stop_window :], skip_special_tokens=True)
            if any(stop in tail for stop in self.params.stop):
                text = self._tokenizer.decode(self.completion, skip_special_tokens=True)
                hits = [(text.find(stop), stop) for stop in self.params.stop if stop in text]
                if hits:  # (a window that starts mid-character can show what the full text lacks)
                    index, stop = min(hits)  # the earliest match wins
                    self._stop_text = text[:index]
                    self.finish_reason, self.stop_reason = FINISH_STOP, stop
                    return
        if len(self.completion) >= self.params.max_tokens or self.position + 1 >= self._max_context:
            self.finish_reason = FINISH_LENGTH

    # -- result -------------------------------------------------------------------------------

    def result(self) -> SampleResult:
        finished_at = time.perf_counter()
        text = self._stop_text
        if text is None:
            text = self._tokenizer.decode(self.completion, skip_special_tokens=True)
        reasoning, content = split_reasoning(
            text,
            thinking=self.template_opened_thinking or self.model_opened_thinking,
            model_opened=self.model_opened_thinking,
        )
        first = self.first_token_at or finished_at
        prefilled = self.prefilled_at or first
        base = self._provenance_base
        sampling = dict(base["sampling"])
        return SampleResult(
            request_id=self.request.request_id,
            prompt_text=self.prompt_text,
            prompt_token_ids=list(self.prompt_ids),
            completion_token_ids=list(self.completion),
            token_logprobs=list(self.logprobs),
            token_sources=list(self.sources),
            finish_reason=self.finish_reason or FINISH_LENGTH,
            stop_reason=self.stop_reason,
            text=text,
            reasoning_content=reasoning,
            content=content,
            usage={
                "prompt_tokens": len(self.prompt_ids),
                "completion_tokens": len(self.completion),
                "total_tokens": len(self.prompt_ids) + len(self.completion),
                "reasoning_tokens": self.reasoning_tokens,
                "forced_tokens": self.sources.count(SOURCE_FORCED),
            },
            timing={
                "queue_ms": _ms(self.admitted_at - self.created_at),
                "prefill_ms": _ms(prefilled - self.admitted_at),
                "ttft_ms": _ms(first - self.created_at),
                "decode_ms": _ms(finished_at - first),
                "total_ms": _ms(finished_at - self.created_at),
            },
            seed=self.seed,
            adapter=self.adapter.identity() if self.adapter is not None else None,
            sampling=sampling,
            template_invocation=dict(base["template_invocation"]),
            behavior_policy=dict(base["behavior_policy"]),
            tokenizer=dict(base["tokenizer"]),
            generation_backend=base["generation_backend"],
        )


def split_reasoning(text: str, *, thinking: bool, model_opened: bool = False) -> tuple[str | None, str]:
    """(reasoning_content, content). Byte-exact: reasoning + "</think>" + content == text when closed.

    Thinking off: (None, text). Reasoning never closed: (text, "") - no `</think>` is invented.
    """
    if not thinking:
        return None, text
    if model_opened and THINK_OPEN in text:
        text = text.split(THINK_OPEN, 1)[1]
    if THINK_CLOSE not in text:
        return text, ""
    reasoning, content = text.split(THINK_CLOSE, 1)
    return reasoning, content


def _ms(seconds: float) -> float:
    return round(max(0.0, seconds) * 1000, 3)


__all__ = ["DecodeSequence", "ThinkingTokens", "split_reasoning", "SOURCE_SAMPLED", "SOURCE_FORCED"]
