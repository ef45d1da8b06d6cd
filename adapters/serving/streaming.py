"""Token-by-token streaming of chat completions, on the GPU worker side.

The sampler calls each request's `on_token` on its own thread with the completion ids so far; this
relay only records them and wakes the actor thread, which decodes, splits reasoning from content and
emits the new text as OpenAI chunk events. It never emits text the final result will not hold:
- once a stop string shows in the decoded text, the text ends where the sequence cuts it (the
  earliest match; the sampler may report the token that completed the stop before the request is
  done, and settle() cannot take text back);
- before that, the last len(stop)-1 characters (which a stop string might still cut), a trailing
  partial `<think>`/`</think>` (a cut through the tag would stream its start as reasoning) and
  half-decoded characters are held back.
The final result settles whatever is left, so the streamed text always equals the non-streamed text.
A choice's role chunk is sent with its first token, not before: a request the sampler refuses at
admission (a prompt over the context length) then has an error as its first event, which the web
process answers with an HTTP error instead of a 200 stream.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def _partial_tag_length(text: str) -> int:
    """How many trailing characters of `text` are the start of a think tag, but not the whole tag."""
    for size in range(len(THINK_CLOSE) - 1, 0, -1):
        tail = text[-size:]
        if len(tail) == size and any(tag.startswith(tail) and tag != tail for tag in (THINK_OPEN, THINK_CLOSE)):
            return size
    return 0


class StreamRelay:
    def __init__(self, *, tokenizer, n: int, thinking: bool, stops: list[str], meta: dict, emit):
        self.tokenizer = tokenizer
        self.thinking = thinking
        self.stops = [s for s in stops if s]
        self.hold_back = max((len(s) for s in self.stops), default=1) - 1
        self.meta = meta  # id, object, created, model (and usage: null with include_usage) of every chunk
        self.emit = emit
        self._latest: list[list[int] | None] = [None] * n
        self._seen = [0] * n
        self._started = [False] * n  # role chunk sent
        self._sent = [["", ""] for _ in range(n)]  # [reasoning, content] already streamed
        self._wake = threading.Event()
        self._diverged: set[tuple[int, str]] = set()  # (choice, field) already warned about

    def on_token(self, index: int):
        def record(completion_ids: list[int]) -> None:
            self._latest[index] = completion_ids
            self._wake.set()

        return record

    def _chunk(self, index: int, delta: dict, finish_reason=None, **extra) -> dict:
        return {**self.meta, "choices": [{"index": index, "delta": delta, "finish_reason": finish_reason, **extra}]}

    def _start(self, index: int) -> None:
        if not self._started[index]:
            self._started[index] = True
            self.emit({"type": "delta", "chunk": self._chunk(index, {"role": "assistant"})})

    def _split(self, text: str) -> tuple[str, str]:
        if not self.thinking:
            return "", text
        if THINK_OPEN in text:
            text = text.split(THINK_OPEN, 1)[1]
        if THINK_CLOSE not in text:
            return text, ""
        reasoning, content = text.split(THINK_CLOSE, 1)
        return reasoning, content

    def _visible(self, text: str) -> str:
        """The part of the decoded text so far that the final text is sure to begin with."""
        hits = [text.find(stop) for stop in self.stops if stop in text]
        if hits:  # the sequence cuts its text here (DecodeSequence: the earliest match wins)
            return text[: min(hits)]
        if self.hold_back:
            text = text[: max(0, len(text) - self.hold_back)]
        return text[: len(text) - _partial_tag_length(text)] if self.thinking else text

    def _send(self, index: int, reasoning: str, content: str) -> None:
        self._start(index)
        sent = self._sent[index]
        for slot, key, text in ((0, "reasoning_content", reasoning), (1, "content", content)):
            if text.startswith(sent[slot]) and len(text) > len(sent[slot]):
                self.emit({"type": "delta", "chunk": self._chunk(index, {key: text[len(sent[slot]):]})})
                sent[slot] = text
            elif not text.startswith(sent[slot]) and (index, key) not in self._diverged:
                # Once per choice and field: a divergence persists for the rest of the stream.
                self._diverged.add((index, key))
                log.warning("streamed %s of choice %d diverged from the final text", key, index)

    def pump_once(self) -> None:
        """Wait briefly for new tokens, then relay the new text of every request (the caller loops
        until every request is done, then settles each result)."""
        self._wake.wait(0.05)
        self._wake.clear()
        for index, ids in enumerate(self._latest):
            if ids is None or len(ids) == self._seen[index]:
                continue
            snapshot = list(ids)
            self._seen[index] = len(snapshot)
            text = self.tokenizer.decode(snapshot, skip_special_tokens=True).rstrip("\ufffd")
            self._send(index, *self._split(self._visible(text)))

    def settle(self, index: int, result) -> None:
        """Stream whatever the final result holds beyond what was sent."""
        self._send(index, result.reasoning_content or "", result.content)
