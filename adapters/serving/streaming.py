"""Token-by-token streaming of chat completions, on the GPU worker side.

The sampler calls each request's `on_token` on its own thread with the completion ids so far; this
relay only records them and wakes the actor thread, which decodes, splits reasoning from content and
emits the new text as OpenAI chunk events. Text that a stop string might still cut (the last
len(stop)-1 characters) and half-decoded characters are held back, and the final result settles
whatever is left, so the streamed text always equals the non-streamed text.
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class StreamRelay:
    def __init__(self, *, tokenizer, n: int, thinking: bool, stops: list[str], meta: dict, emit):
        self.tokenizer = tokenizer
        self.thinking = thinking
        self.hold_back = max((len(s) for s in stops), default=1) - 1
        self.meta = meta  # id, object, created, model of every chunk
        self.emit = emit
        self._latest: list[list[int] | None] = [None] * n
        self._seen = [0] * n
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

    def start(self) -> None:
        for index in range(len(self._latest)):
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

    def _send(self, index: int, reasoning: str, content: str) -> None:
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
            if self.hold_back:
                text = text[: max(0, len(text) - self.hold_back)]
            self._send(index, *self._split(text))

    def settle(self, index: int, result) -> None:
        """Stream whatever the final result holds beyond what was sent."""
        self._send(index, result.reasoning_content or "", result.content)
