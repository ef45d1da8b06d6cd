"""The GPU worker's model host sizes its sampler's cohort from `[sampler] max_batch_size`."""

from __future__ import annotations

import dataclasses

import pytest
from django.conf import settings

from core.jobs import worker_state


@pytest.mark.django_db
def test_the_sampler_decodes_as_many_rows_a_step_as_configured(tiny_model_dir, monkeypatch):
    from adapters.serving.runtime_host import ModelHost

    monkeypatch.setattr(settings, "KILN", dataclasses.replace(
        settings.KILN, model_path=tiny_model_dir, sampler_max_batch_size=3))
    host = ModelHost()
    host.start()
    try:
        host.wait_ready(timeout=120)
        assert host.sampler.max_batch_size == 3
        assert worker_state._worker_status["model"]["max_batch_size"] == 3
        # The sampler packs even the tiny model's projections (batch invariance), and the status says so.
        packed = worker_state._worker_status["model"]["packed_matmul"]
        assert packed == {"packed": True, "reason": None}
        # Five requests, at most three rows a step: all five complete, each to its token budget.
        from gpu_runtime.sample_types import SampleRequest
        from gpu_runtime.sampling import SamplingParams

        results = host.sampler.generate([
            SampleRequest(messages=[{"role": "user", "content": f"What is {i} + 1?"}],
                          sampling=SamplingParams(temperature=1.0, max_tokens=4), seed=i,
                          enable_thinking=False, ignore_eos=True)
            for i in range(5)
        ], timeout=60)
        assert [len(r.completion_token_ids) for r in results] == [4] * 5
    finally:
        host.stop()


@pytest.mark.django_db
@pytest.mark.parametrize("stream", [True, False])
def test_a_request_whose_reader_left_stops_generating(tiny_model_dir, monkeypatch, stream):
    """A client that disconnects (an abandoned stream, a reader that gave up) cancels its requests
    within a reader check, emits nothing more, and the sampler is free for the next request."""
    import time

    from adapters.serving import runtime_host

    monkeypatch.setattr(settings, "KILN", dataclasses.replace(settings.KILN, model_path=tiny_model_dir))
    # Checked at once: asked 0.1 s in, a run whose four rows all drew the end token within a few tokens
    # had already finished (seen under xdist, where the thread count changes what a seed draws).
    monkeypatch.setattr(runtime_host, "READER_CHECK_SECONDS", 0.0)
    host = runtime_host.ModelHost()
    host.start()
    monkeypatch.setattr(runtime_host, "start_model_host", lambda: host)
    try:
        host.wait_ready(timeout=120)
        events, gone_at = [], {}
        # Temperature 2 on the tiny model: near-uniform tokens, so the rows run to their token budget
        # (the end token is one in hundreds) unless cancelled.
        body = {"messages": [{"role": "user", "content": "Count to a thousand."}], "n": 4, "max_tokens": 4000,
                "temperature": 2.0, "seed": 3, "stream": stream}

        def reader_gone():  # the reader left right after the request started
            gone_at.setdefault("t", time.monotonic())
            return True

        from adapters.metrics import INFERENCE

        before = INFERENCE.pending()
        runtime_host.handle_chat_completion(body, events.append, reader_gone)
        stopped = time.monotonic()
        assert "t" in gone_at, f"ended before its reader was asked: {[e for e in events if e['type'] != 'delta'][-1:]}"
        assert stopped - gone_at["t"] < 2.0  # cancelled at the next check, not after 4 x 4000 tokens
        assert not any(e["type"] in ("done", "error") for e in events)
        after = len(events)
        time.sleep(0.3)
        assert len(events) == after  # nothing emitted once it returned
        # The sampler is free: a short request is answered at once.
        quick = dict(body, n=1, max_tokens=4, stream=False)
        answered = []
        runtime_host.handle_chat_completion(quick, answered.append)
        assert answered[-1]["type"] == "done"
        # GET /metrics will count one abandoned and one completed request (the worker writes them later)
        counted = {key: value - before.get(key, 0) for key, value in INFERENCE.pending().items()}
        assert counted[("kiln_inference_requests_total", 'outcome="abandoned"')] == 1
        assert counted[("kiln_inference_requests_total", 'outcome="completed"')] == 1
        assert counted[("kiln_inference_completion_tokens_total", "")] == \
            answered[-1]["response"]["usage"]["completion_tokens"] > 0
        assert counted[("kiln_inference_request_seconds_total", "")] > 0
    finally:
        host.stop()


@pytest.mark.django_db
def test_a_request_in_flight_or_new_while_the_worker_stops_is_server_shutting_down(tiny_model_dir, monkeypatch):
    """Spec §1.0 names `server_shutting_down` 503: a completion still decoding when the GPU worker stops,
    and one that arrives after, both end with it (and a Retry-After), not a wait on a stopped loop."""
    import threading

    from adapters.serving import runtime_host
    from adapters.serving.limits import error_from_event

    monkeypatch.setattr(settings, "KILN", dataclasses.replace(settings.KILN, model_path=tiny_model_dir))
    host = runtime_host.ModelHost()
    host.start()
    monkeypatch.setattr(runtime_host, "start_model_host", lambda: host)
    try:
        host.wait_ready(timeout=120)
        body = {"messages": [{"role": "user", "content": "Count to a thousand."}], "max_tokens": 4000,
                "temperature": 2.0, "seed": 5}
        events: list[dict] = []
        first_token = threading.Event()

        def collect(event):
            events.append(event)
            first_token.set()

        worker = threading.Thread(target=runtime_host.handle_chat_completion, args=(dict(body, stream=True), collect))
        worker.start()
        assert first_token.wait(60)
        host.stop()
        worker.join(30)
        assert not worker.is_alive()
        error = events[-1]
        assert error["type"] == "error" and error["code"] == "server_shutting_down" and error["status"] == 503
        refusal = error_from_event(error)
        assert refusal.status == 503 and refusal.headers == {"Retry-After": "5"} and "GET /health" in refusal.hint

        late: list[dict] = []
        runtime_host.handle_chat_completion(dict(body, max_tokens=4), late.append)
        assert [(e["type"], e.get("code")) for e in late] == [("error", "server_shutting_down")]
    finally:
        host.stop()
