"""A streamed chat completion on the real tiny model (the GPU worker's handler, no HTTP): its text is
the non-streamed text, its usage chunk comes only when asked for, and a request refused at admission
has its error as the first event (so the web process can answer it with an HTTP status)."""

from __future__ import annotations

import dataclasses
import logging

import pytest
from django.conf import settings

pytestmark = pytest.mark.django_db

QUESTION = [{"role": "user", "content": "What is 47 + 13?"}]
# The probe's requests: thinking on (the default), so the text splits at `</think>`.
STOPS = ["60", ["0"], "4", " + ", "\n\n", "Observation:", "ZZZZZZZ"]


@pytest.fixture
def handle(tiny_model_dir, monkeypatch):
    from adapters.serving import runtime_host

    monkeypatch.setattr(settings, "KILN", dataclasses.replace(settings.KILN, model_path=tiny_model_dir))
    host = runtime_host.ModelHost()
    host.start()
    monkeypatch.setattr(runtime_host, "start_model_host", lambda: host)
    host.wait_ready(timeout=120)

    def run(body: dict) -> list[dict]:
        events: list[dict] = []
        runtime_host.handle_chat_completion(body, events.append)
        return events

    yield run
    host.stop()


def _streamed_text(events: list[dict]) -> dict:
    text = {"reasoning_content": "", "content": ""}
    for event in events:
        chunks = [event["chunk"]] if event["type"] == "delta" else event.get("final_chunks", [])
        for chunk in chunks:
            for choice in chunk["choices"]:
                for key in text:
                    text[key] += choice["delta"].get(key) or ""
    return text


@pytest.mark.parametrize("stop", STOPS)
def test_the_streamed_text_is_the_non_streamed_text_with_stop_strings(handle, stop, caplog):
    body = {"messages": QUESTION, "adapter": "base", "max_tokens": 40, "seed": 1, "stop": stop}
    whole = handle(body)[-1]["response"]["choices"][0]["message"]
    with caplog.at_level(logging.WARNING, logger="adapters.serving.streaming"):
        events = handle(dict(body, stream=True))
    assert events[-1]["type"] == "done"
    assert _streamed_text(events) == {"reasoning_content": whole.get("reasoning_content") or "",
                                      "content": whole["content"]}
    assert "diverged" not in caplog.text


def test_the_usage_chunk_comes_only_with_include_usage(handle):
    body = {"messages": QUESTION, "adapter": "base", "max_tokens": 12, "seed": 1, "stream": True}
    plain = handle(body)
    chunks = [e["chunk"] for e in plain if e["type"] == "delta"] + plain[-1]["final_chunks"]
    assert all(chunk["choices"] for chunk in chunks)  # `chunk.choices[0]` works on every chunk
    assert not any("usage" in chunk for chunk in chunks)

    asked = handle(dict(body, stream_options={"include_usage": True}))
    whole = handle(dict(body, stream=False))[-1]["response"]
    chunks = [e["chunk"] for e in asked if e["type"] == "delta"] + asked[-1]["final_chunks"]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == whole["usage"]
    assert all(chunk["choices"] and chunk["usage"] is None for chunk in chunks[:-1])  # OpenAI: null until the last


def test_a_prompt_over_the_context_length_is_refused_before_any_chunk(handle):
    events = handle({"messages": [{"role": "user", "content": "7 + " * 5000}], "max_tokens": 4, "stream": True})
    assert [(e["type"], e.get("code"), e.get("status")) for e in events] == [("error", "context_length_exceeded", 400)]
    assert events[0]["hint"] == "shorten the messages or lower max_tokens"
