"""/v1/chat/completions and /v1/models in the web process, with a stand-in GPU worker: a heartbeat that
says the model is loaded, the `infer` send captured, and the worker's events scripted.

A stream answers the same 4xx as a whole response before any chunk (values the schema bounds, and a
refusal that only the worker can make, which arrives as its first event); `model` naming a published
adapter serves it; /v1/models lists the adapters beside the base model."""

from __future__ import annotations

import json
import os
import socket

import pytest
from asgiref.sync import async_to_sync
from django.test import AsyncClient
from django.utils import timezone

from adapters.serving import api as serving_api
from adapters.serving.tasks import run_chat_completion
from core.contracts.sampling import MAX_SEED
from core.jobs.models import WorkerHeartbeat
from tests.adapters.support import error, ok, publish, send

BASE_ID = "tiny-base"
ASGI = pytest.mark.django_db(transaction=True)  # see _stream
HI = [{"role": "user", "content": "hi"}]
DELTA = {"type": "delta", "chunk": {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant"},
                                                              "finish_reason": None}]}}
DONE = {"type": "done", "final_chunks": [{"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}]}


@pytest.fixture
def worker(db, monkeypatch):
    """A live GPU worker with the model loaded; `worker.sent` holds the bodies sent to it and
    `worker.events` the events it answers with."""
    now = timezone.now()
    WorkerHeartbeat.objects.create(worker_id="gpu-1", hostname=socket.gethostname(), pid=os.getpid(),
                                   queues=["gpu", "infer"], started_at=now, last_seen=now,
                                   status={"model": {"loaded": True, "served_model_id": BASE_ID}})

    class Worker:
        sent: list[dict] = []
        events: list[dict] = [DELTA, DONE]

    monkeypatch.setattr(run_chat_completion, "send", lambda request_id, body: Worker.sent.append(body))

    def read_events(request_id, **kwargs):
        async def events():
            for event in Worker.events:
                yield event

        return events()

    monkeypatch.setattr(serving_api, "read_events", read_events)
    return Worker


def _stream(api, body: dict) -> list:
    """POST a streamed completion and read its events, the view and the stream in one event loop as
    under daphne (the sync test client would read the stream in a second loop). The ASGI handler
    reads rows from its own thread: the test needs django_db(transaction=True)."""

    async def post() -> bytes:
        response = await AsyncClient().post("/v1/chat/completions", data=json.dumps(body),
                                            content_type="application/json",
                                            headers={"Authorization": api.defaults["HTTP_AUTHORIZATION"]})
        assert response.status_code == 200 and response["Content-Type"] == "text/event-stream", response.content
        return b"".join([part async for part in response.streaming_content])

    text = async_to_sync(post)().decode()
    return [json.loads(line[6:]) if line != "data: [DONE]" else "[DONE]"
            for line in text.split("\n\n") if line.startswith("data: ")]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(("extra", "where", "says"), [
    ({"stop": ["x" * 20000]}, "stop", "stop sequences exceed 16384 bytes"),
    ({"stop": ["é" * 5000, "é" * 4000]}, "stop", "stop sequences exceed 16384 bytes"),  # bytes, not characters
    ({"n": 2, "seed": MAX_SEED}, "", "seed + n - 1 must be at most"),
    ({"n": 3, "seed": MAX_SEED - 1}, "", f"the seed can be at most {MAX_SEED - 2}"),
])
def test_values_only_the_worker_checked_are_refused_before_anything_streams(api, worker, stream, extra, where, says):
    response = send(api, "post", "/v1/chat/completions", {"messages": HI, "stream": stream, **extra})
    assert response["Content-Type"].startswith("application/json")
    message = error(response, 422, "validation_error")
    assert message.startswith(where) and says in message
    assert worker.sent == []


@ASGI
def test_the_last_seed_a_request_of_n_choices_may_use_is_accepted(api, worker):
    _stream(api, {"messages": HI, "n": 2, "seed": MAX_SEED - 1, "stream": True})
    assert worker.sent[-1]["seed"] == MAX_SEED - 1


@pytest.mark.parametrize(("options", "stream", "says"), [
    ({"include_usage": "yes"}, True, "include_usage"),
    ({"include_usage": 1}, True, "include_usage"),
    ("include_usage", True, "stream_options"),
    ({"include_usage": True}, False, "stream_options is only allowed with stream: true"),
])
def test_stream_options_are_validated(api, worker, options, stream, says):
    body = {"messages": HI, "stream": stream, "stream_options": options}
    assert says in error(send(api, "post", "/v1/chat/completions", body), 422, "validation_error")


@pytest.mark.parametrize(("extra", "field", "says"), [
    ({"max_tokens": "5"}, "max_tokens", "must be a JSON integer, not a string"),
    ({"max_tokens": True}, "max_tokens", "must be a JSON integer, not a boolean"),  # was read as 1
    ({"n": "2"}, "n", "not a string"),
    ({"seed": True}, "seed", "not a boolean"),
    ({"chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking", "boolean"),
    ({"rollout_provenance": "false"}, "rollout_provenance", "boolean"),
    ({"stream": 1}, "stream", "boolean"),
])
def test_integers_and_booleans_are_not_coerced_from_other_json_types(api, worker, extra, field, says):
    """QA: "max_tokens": "5" and true were served (as 5 and 1), and "enable_thinking": "no" read as false
    (where a chat template would read the string as true)."""
    message = error(send(api, "post", "/v1/chat/completions", {"messages": HI, **extra}), 422, "validation_error")
    assert message.startswith(field) and says in message, message
    assert worker.sent == []


@ASGI
def test_the_developer_role_is_read_as_system(api, worker):
    """OpenAI's newer name for the system role (QA: refused 422); the chat template knows "system"."""
    _stream(api, {"messages": [{"role": "developer", "content": "Be brief."}, *HI], "stream": True})
    assert [m["role"] for m in worker.sent[-1]["messages"]] == ["system", "user"]
    assert worker.sent[-1]["messages"][0]["content"] == "Be brief."


@ASGI
def test_stream_options_reach_the_worker(api, worker):
    body = {"messages": HI, "stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}}
    _stream(api, body)
    assert worker.sent[-1]["stream_options"] == {"include_usage": True}


def test_a_stream_the_worker_refuses_at_once_is_an_http_error_not_200(api, worker):
    """A prompt over the context length is known only on the GPU worker: the stream waits for its
    first event, so the refusal is a 400 like the whole response's, with the worker's hint."""
    worker.events = [{"type": "error", "code": "context_length_exceeded", "status": 400,
                      "message": "The prompt has 9000 tokens; the model allows 4096.", "hint": ""}]
    for stream in (True, False):
        response = send(api, "post", "/v1/chat/completions", {"messages": HI, "stream": stream})
        assert response["Content-Type"].startswith("application/json")
        error(response, 400, "context_length_exceeded")
        assert response.json()["error"]["hint"] == "shorten the messages or lower max_tokens"


@ASGI
def test_an_error_after_the_first_chunk_is_an_event_with_a_hint(api, worker):
    worker.events = [DELTA, {"type": "error", "code": "generation_failed", "status": 500, "message": "boom"}]
    events = _stream(api, {"messages": HI, "stream": True})
    assert events[0] == DELTA["chunk"] and events[-1] == "[DONE]"
    refusal = events[1]["error"]
    assert refusal["code"] == "generation_failed" and refusal["hint"]  # never an empty hint


@ASGI
def test_model_naming_a_published_adapter_serves_it(api, home, peft_adapter, worker, monkeypatch):
    from adapters.serving import selectors

    monkeypatch.setattr(selectors, "default_adapter", lambda: "active-one")
    publish(home, peft_adapter, "ad2")
    chat = {"messages": HI, "stream": True}
    served = []
    for body in ({"model": "ad2"}, {"model": "ad2", "adapter": "base"}, {"model": "Qwen3.5-4B"},
                 {"model": BASE_ID}, {}):
        _stream(api, {**chat, **body})
        served.append(worker.sent[-1]["adapter"])
    # by `model`; an explicit `adapter` wins; any other `model` selects nothing (the active adapter serves)
    assert served == ["ad2", "base", "active-one", "active-one", "active-one"]


def test_models_lists_the_servable_adapters_beside_the_base_model(api, home, peft_adapter, worker, settings):
    from adapters.models import Adapter

    publish(home, peft_adapter, "ad2")
    publish(home, peft_adapter, "bad")
    Adapter.objects.filter(name="bad").update(quarantined=True)
    models = ok(api.get("/v1/models"))["data"]
    assert [(m["id"], m["owned_by"], m.get("parent")) for m in models] == [(BASE_ID, "kiln", None),
                                                                           ("ad2", "kiln", BASE_ID)]
    assert ok(api.get("/v1/models/ad2"))["parent"] == BASE_ID
    assert models[1]["created"] == int(Adapter.objects.get(name="ad2").published_at.timestamp())
    # QA: the base model's `created` was always 0; it is when its files were written
    from dataclasses import replace

    model_dir = home / "a-model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    os.utime(model_dir / "config.json", (1_700_000_000, 1_700_000_000))
    settings.KILN = replace(settings.KILN, model_path=model_dir)
    assert ok(api.get("/v1/models"))["data"][0]["created"] == 1_700_000_000
    error(api.get("/v1/models/bad"), 404, "model_not_found")
    error(send(api, "post", "/v1/chat/completions", {"messages": HI, "model": "bad"}), 409, "adapter_quarantined")
