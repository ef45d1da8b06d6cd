"""The streaming relay never emits text the final (non-streamed) result will not hold.

A stand-in tokenizer whose ids index a list of token strings drives the relay the way the sampler does:
`on_token` with the ids so far (also for the token that completed a stop string, which the sampler
reports before the request is done), a pump, and finally `settle` with the result the sequence builds
(text cut at the earliest stop, split at `</think>`)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from adapters.serving.streaming import StreamRelay

TOKENS = ["47", " +", " ", "1", "3", " =", " ", "6", "0", "\n", "</think>", "\n", "\n", "6", "0"]


class Tokenizer:
    def decode(self, ids, skip_special_tokens=True):
        return "".join(TOKENS[i] for i in ids)


def _final(text: str, stops: list[str]) -> SimpleNamespace:
    """What DecodeSequence.result() gives: the text up to the earliest stop, split at `</think>`."""
    hits = [text.find(s) for s in stops if s in text]
    if hits:
        text = text[: min(hits)]
    reasoning, _, content = text.partition("</think>")
    return SimpleNamespace(reasoning_content=reasoning, content=content)


def _stream(stops: list[str], *, pump_every_token: bool = True, n_tokens: int = len(TOKENS)):
    events = []
    relay = StreamRelay(tokenizer=Tokenizer(), n=1, thinking=True, stops=stops, meta={"id": "c"}, emit=events.append)
    record = relay.on_token(0)
    ids = []
    for token in range(n_tokens):
        ids.append(token)
        record(ids)
        text = Tokenizer().decode(ids)
        if any(s in text for s in stops):
            break  # the sequence finished with the token that completed the stop (on_token was still called)
        if pump_every_token:
            relay.pump_once()
    relay.pump_once()  # the last pump after every request is done (runtime_host._wait_for)
    final = _final(Tokenizer().decode(ids), stops)
    relay.settle(0, final)
    streamed = {"reasoning_content": "", "content": ""}
    for event in events:
        for key, piece in event["chunk"]["choices"][0]["delta"].items():
            if key in streamed:
                streamed[key] += piece
    return events, streamed, final


@pytest.mark.parametrize("stops", [["60"], ["0"], ["4"], [" + "], ["\n\n"], ["Observation:"], ["ZZZZZZZ"],
                                   ["3", "= 6"], ["0\n</"]])
@pytest.mark.parametrize("pump_every_token", [True, False])
def test_the_streamed_text_is_the_final_text(stops, pump_every_token, caplog):
    events, streamed, final = _stream(stops, pump_every_token=pump_every_token)
    assert streamed == {"reasoning_content": final.reasoning_content, "content": final.content}
    assert "diverged" not in caplog.text


def test_a_stop_completed_by_the_last_token_is_not_streamed_before_the_result_is_done():
    """The probe's case: stop "60" streamed '47 + 13 = 6' where the answer says '47 + 13 = '."""
    events = []
    relay = StreamRelay(tokenizer=Tokenizer(), n=1, thinking=True, stops=["60"], meta={}, emit=events.append)
    relay.on_token(0)(list(range(9)))  # ... " 6", "0": the stop is complete; the request is not done yet
    relay.pump_once()
    pieces = [e["chunk"]["choices"][0]["delta"].get("reasoning_content") for e in events]
    assert "".join(p for p in pieces if p) == "47 + 13 = "


def test_a_hold_back_never_cuts_through_the_think_tag():
    """A stop of 2+ characters held back the end of the raw text, `</think>` included: its start
    ('<', '</thin') was streamed as reasoning before the tag was whole."""
    for length in range(2, 12):
        events, streamed, final = _stream(["Z" * length], n_tokens=11)  # up to and with "</think>"
        assert "<" not in streamed["reasoning_content"], length
        assert streamed["reasoning_content"] == final.reasoning_content == "47 + 13 = 60\n"


def test_each_choice_starts_with_its_role_at_its_first_token_not_before():
    """No event before a choice's first token: a request refused at admission has its error first."""
    events = []
    relay = StreamRelay(tokenizer=Tokenizer(), n=2, thinking=True, stops=[], meta={}, emit=events.append)
    relay.pump_once()
    assert events == []
    relay.on_token(1)([0])
    relay.pump_once()
    deltas = [(e["chunk"]["choices"][0]["index"], e["chunk"]["choices"][0]["delta"]) for e in events]
    assert deltas == [(1, {"role": "assistant"}), (1, {"reasoning_content": "47"})]
    relay.settle(0, SimpleNamespace(reasoning_content="4", content=""))
    assert [e["chunk"]["choices"][0]["delta"] for e in events[2:]] == [{"role": "assistant"},
                                                                        {"reasoning_content": "4"}]
