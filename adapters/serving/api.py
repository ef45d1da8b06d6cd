"""/v1/chat/completions and /v1/models: OpenAI-compatible routes served by the GPU worker.

Web-facing: validates, checks that a worker can serve, enqueues on `infer` and relays the
worker's events (JSON or server-sent events). Imports no torch or gpu_runtime.
"""

from __future__ import annotations

import json
import uuid

from asgiref.sync import sync_to_async
from django.http import StreamingHttpResponse
from ninja import Router

from adapters.serving import selectors
from adapters.serving.limits import check_caps, error_from_event, hint_for
from adapters.serving.schemas import ChatCompletionRequest
from adapters.serving.transport import FIRST_EVENT_TIMEOUT, IDLE_TIMEOUT, WorkerLost, read_events
from core.errors import KilnError
from core.profiles import require_profile_allows

router = Router(tags=["inference"])


async def _start(body: ChatCompletionRequest) -> str:
    require_profile_allows("inference")
    check_caps(body)
    if body.adapter is None and "model" in body.model_fields_set:
        # `model` naming a published adapter serves it, as vLLM serves a LoRA by its name; any other
        # `model` (the base id, a name from a guide's request file) selects nothing.
        body.adapter = await sync_to_async(selectors.adapter_named_by_model)(body.model)
    if body.adapter is not None:
        await sync_to_async(selectors.require_servable_adapter)(body.adapter)
    await sync_to_async(selectors.require_inference_ready)()
    if body.adapter is None:
        # No adapter named: serve the registry's active adapter ("base" or "" asks for the base model).
        body.adapter = await sync_to_async(selectors.default_adapter)()
    request_id = uuid.uuid4().hex
    from adapters.serving.tasks import run_chat_completion

    await sync_to_async(run_chat_completion.send)(request_id, body.model_dump(mode="json"))
    return request_id


@router.post("/chat/completions", summary="OpenAI-compatible chat completion (optionally streamed)")
async def chat_completions(request, body: ChatCompletionRequest):
    request_id = await _start(body)
    events = read_events(request_id, first_event_timeout=FIRST_EVENT_TIMEOUT, idle_timeout=IDLE_TIMEOUT,
                         worker_dead=sync_to_async(selectors.worker_dead))
    if body.stream:
        # The status line waits for the worker's first event (a choice's first token): a request the
        # worker refuses at once (a prompt over the context length) is an HTTP error, not 200 + an event.
        first = await _first_event(events)
        return StreamingHttpResponse(_sse(first, events), content_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    try:
        async for event in events:
            if event["type"] == "done":
                return event["response"]
            if event["type"] == "error":
                raise error_from_event(event)
    except TimeoutError as exc:
        raise _timeout(exc) from None
    except WorkerLost as exc:
        raise _worker_lost(exc) from None
    raise _no_answer()


def _timeout(exc: TimeoutError) -> KilnError:
    return KilnError("inference_timeout", str(exc), status=504, hint=hint_for("inference_timeout"))


def _worker_lost(exc: WorkerLost) -> KilnError:
    return KilnError("inference_worker_lost", f"the GPU worker stopped while answering ({exc})", status=503,
                     hint=hint_for("inference_worker_lost"))


def _no_answer() -> KilnError:
    return KilnError("inference_failed", "the worker ended without an answer", status=500,
                     hint=hint_for("inference_failed"))


async def _first_event(events) -> dict:
    """The worker's first event; its refusal (or none in time) raised as the HTTP error."""
    try:
        event = await anext(events)
    except StopAsyncIteration:
        raise _no_answer() from None
    except TimeoutError as exc:
        raise _timeout(exc) from None
    except WorkerLost as exc:
        raise _worker_lost(exc) from None
    if event["type"] == "error":
        await events.aclose()  # closes the request's event list now, not when the generator is collected
        raise error_from_event(event)
    return event


async def _sse(first: dict, events):
    """Relay worker events as OpenAI chunk events; an error mid-stream becomes an error event."""

    async def all_events():
        yield first
        async for event in events:
            yield event

    try:
        async for event in all_events():
            if event["type"] == "delta":
                yield f"data: {json.dumps(event['chunk'])}\n\n"
            elif event["type"] == "done":
                for chunk in event.get("final_chunks", []):
                    yield f"data: {json.dumps(chunk)}\n\n"
            elif event["type"] == "error":
                yield f"data: {json.dumps(error_from_event(event).envelope())}\n\n"
    except TimeoutError as exc:
        yield f"data: {json.dumps(_timeout(exc).envelope())}\n\n"
    except WorkerLost as exc:
        yield f"data: {json.dumps(_worker_lost(exc).envelope())}\n\n"
    yield "data: [DONE]\n\n"


@router.get("/models", summary="Models and adapters this server can sample from")
def list_models(request):
    return {"object": "list", "data": selectors.served_models()}


@router.get("/models/{model_id}", summary="One model or adapter this server can sample from")
def retrieve_model(request, model_id: str):
    # The openai client's models.retrieve(id): the entry of GET /v1/models with that id.
    for model in selectors.served_models():
        if model.get("id") == model_id:
            return model
    raise KilnError("model_not_found", f"this server serves no model or adapter with id {model_id!r}", status=404,
                    hint="list them with GET /v1/models; adapters are listed by name beside the base model")
