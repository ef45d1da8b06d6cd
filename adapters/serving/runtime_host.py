"""The GPU worker's resident model: loaded once at boot, sampled by one runner thread.

Runs only in the GPU worker process (it imports torch through gpu_runtime). `infer` actor threads
call handle_chat_completion(), which submits one sampler request per choice and turns the results
into an OpenAI-shaped response. The load status goes into the worker heartbeat so /health and the
web process can answer "model unavailable, and why" without importing torch.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid

from django.conf import settings

from core.errors import KilnError
from core.jobs.worker_state import beat, set_worker_status, set_worker_status_source

log = logging.getLogger(__name__)

# SampleRequestError codes -> HTTP status the web process answers with.
_STATUS = {"invalid_request": 400, "context_length_exceeded": 400, "adapter_not_found": 404,
           "adapter_content_mismatch": 409, "adapter_load_failed": 500, "sampler_stopped": 503, "server_shutting_down": 503,
           "generation_failed": 500, "registry_unavailable": 503}


def served_adapter_bytes(name: str):
    """The sampler's registry look-up (its folder and digest), on the sampler's long-lived thread.

    No request cycle recycles this thread's database connection, so one that dropped (a PostgreSQL
    restart or failover, an idle timeout) is closed and opened again once; a database that stays down is
    `registry_unavailable` (503), never a missing adapter, which the serving canary would quarantine."""
    from django.db import Error as DatabaseFault
    from django.db import close_old_connections, connection

    from adapters.selectors import adapter_served_bytes
    from gpu_runtime.sample_types import SampleRequestError

    close_old_connections()
    try:
        return adapter_served_bytes(name=name)
    except DatabaseFault:  # OperationalError, or InterfaceError once the connection is known closed
        connection.close()
    try:
        return adapter_served_bytes(name=name)
    except DatabaseFault as exc:
        raise SampleRequestError("registry_unavailable",
                                 f"the adapter registry could not be read for {name!r}: {exc}") from exc


def _shutting_down_error():
    from gpu_runtime.sample_types import SampleRequestError

    return SampleRequestError("server_shutting_down", "the GPU worker is shutting down")


class ModelHost:
    def __init__(self):
        self.loaded = None
        self.sampler = None
        self.error: KilnError | None = None
        self._ready = threading.Event()
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._load_and_run, name="kiln-model-host", daemon=True).start()

    def _load_and_run(self) -> None:
        from gpu_runtime.model_loading import ModelLoadError, load_model
        from gpu_runtime.sampler import Sampler

        set_worker_status(model={"loaded": False, "loading": True, "path": str(settings.KILN.model_path or "")})
        try:
            self.loaded = load_model(settings.KILN.model_path)
        except ModelLoadError as exc:
            self.error = KilnError("model_unavailable", f"{exc.code}: {exc.message}", status=503)
            set_worker_status(model={"loaded": False, "code": exc.code, "error": exc.message})
            log.warning("model not loaded: %s", exc)
        else:
            self.sampler = Sampler(self.loaded, served_adapter_bytes,
                                   max_batch_size=settings.KILN.sampler_max_batch_size)
            set_worker_status(model={"loaded": True, "served_model_id": self.loaded.served_model_id,
                                     "device": str(self.loaded.device), "dtype": str(self.loaded.dtype),
                                     "identity": self.loaded.identity,
                                     "max_batch_size": self.sampler.max_batch_size,
                                     "kernels": self.sampler.kernels.to_record(),  # triton or torch, and why
                                     # oneDNN-packed projection weights on the CPU, or why not
                                     "packed_matmul": {"packed": self.sampler.packing_problem is None,
                                                       "reason": self.sampler.packing_problem}})
            if self.loaded.device.type == "cuda":
                from gpu_runtime.device_memory import AcceleratorMemory

                # read at every beat: the training memory preflight's budget (training.memory_preflight)
                set_worker_status_source("memory", AcceleratorMemory(self.loaded.device).read)
            log.info("model %s loaded on %s", self.loaded.served_model_id, self.loaded.device)
        finally:
            # The heartbeat first: GPU work waits on _ready, so once a job can run, /health already
            # says whether the model loaded (the other order let a job start while it said loading).
            _safe_beat()
            self._ready.set()
        if self.sampler is not None:
            self._run_sampler()

    def _run_sampler(self) -> None:
        """Step the sampler under the GPU writer lock, so training groups and decoding interleave."""
        from gpu_runtime.writer_lock import gpu_writer

        try:
            while not self._stop.is_set():
                with gpu_writer():
                    worked = self.sampler.step()
                if not worked:
                    self._stop.wait(0.005)
        finally:
            self.sampler.fail_all(_shutting_down_error())

    def submit(self, request):
        """Queue `request` on the sampler; once the host is stopping, it fails with server_shutting_down
        (spec §1.0, 503) instead of waiting on a sampler loop that no longer runs."""
        if self._stop.is_set():
            raise _shutting_down_error()
        handle = self.sampler.submit(request)
        if self._stop.is_set():  # stopped between the check and the submit: the loop's last fail_all missed it
            self.sampler.fail_all(_shutting_down_error())
        return handle

    @property
    def settled(self) -> bool:
        """Loading has finished, one way or the other (the model is resident, or why not is known)."""
        return self._ready.is_set()

    def wait_settled(self, should_stop) -> bool:
        """Block until loading finished (True) or `should_stop()` said to give up (False)."""
        while not self._ready.wait(0.2):
            if should_stop():
                return False
        return True

    def wait_ready(self, timeout: float = 600) -> None:
        if not self._ready.wait(timeout):
            raise KilnError("model_loading", "the model is still loading", status=503, hint="retry shortly")
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        self._stop.set()


def _safe_beat() -> None:
    try:
        beat()
    except Exception as exc:  # noqa: BLE001 - the heartbeat thread will publish it a few seconds later
        log.warning("could not publish model status: %s", exc)


_host: ModelHost | None = None
_host_lock = threading.Lock()


def start_model_host() -> ModelHost:
    global _host
    with _host_lock:
        if _host is None:
            _host = ModelHost()
            _host.start()
    return _host


def current_host_settled() -> bool:
    """Whether this process's model host exists and has finished loading (the gpu queue's gate)."""
    return _host is not None and _host.settled


def resident_base():
    """The resident model's base weights (`gpu_runtime.shared_base.SharedBase`) for a trainer in this
    process to build on instead of loading a second copy; None while no model is resident here."""
    loaded = _host.loaded if _host is not None else None
    return loaded.shared_base if loaded is not None else None


def stop_model_host() -> None:
    if _host is not None:
        _host.stop()


def _sample_requests(body, *, seed_base: int | None):
    from gpu_runtime.sample_types import SampleRequest
    from gpu_runtime.sampling import SamplingParams

    params = SamplingParams(
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p,
        max_tokens=body.effective_max_tokens or 256, repetition_penalty=body.repetition_penalty,
        presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty, stop=tuple(body.stop),
    )
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    return messages, [
        SampleRequest(messages=messages, sampling=params, adapter=body.adapter_name,
                      seed=None if seed_base is None else seed_base + index,
                      enable_thinking=body.chat_template_kwargs.enable_thinking,
                      thinking_budget_tokens=body.thinking_budget_tokens,
                      thinking_budget_ms=body.thinking_budget_ms)
        for index in range(body.n)
    ]


def _choice(index: int, result, *, messages, with_provenance: bool) -> dict:
    from core.contracts.provenance import build_rollout_provenance

    message = {"role": "assistant", "content": result.content}
    if result.reasoning_content is not None:
        message["reasoning_content"] = result.reasoning_content
    choice = {"index": index, "message": message, "finish_reason": result.finish_reason, "logprobs": None,
              "seed": str(result.seed), "adapter": result.adapter}
    if with_provenance:
        choice["rollout_provenance"] = build_rollout_provenance(result, prompt_messages=messages,
                                                                text=result.text)
    return choice


class ReaderGone(Exception):
    """Nobody waits for the answer any more (the client disconnected, or its reader gave up)."""


READER_CHECK_SECONDS = 0.5  # how often a running request asks whether its reader is still there


def _wait_for(handles, reader_gone, relay=None) -> None:
    """Until every request is done: relay streamed text, and cancel them all (ReaderGone) once
    `reader_gone()` says nobody waits: an abandoned stream stops generating within a check."""
    last_check = time.monotonic()
    while not all(handle.done() for handle in handles):
        if relay is not None:
            relay.pump_once()
        else:
            time.sleep(0.05)
        if reader_gone is not None and time.monotonic() - last_check >= READER_CHECK_SECONDS:
            last_check = time.monotonic()
            if reader_gone():
                for handle in handles:
                    handle.cancel()
                raise ReaderGone()
    if relay is not None:
        relay.pump_once()


def chat_completion(body, *, emit=None, reader_gone=None) -> dict:
    """Run one validated ChatCompletionRequest to an OpenAI chat.completion object.

    With `emit` (streaming), the text is relayed token by token as it is sampled. With `reader_gone`,
    the requests are cancelled (ReaderGone) once it says nobody waits for the answer."""
    from adapters.serving.limits import hint_for
    from adapters.serving.streaming import StreamRelay
    from gpu_runtime.sample_types import SampleRequestError

    host = start_model_host()
    host.wait_ready()
    messages, requests = _sample_requests(body, seed_base=body.seed)
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": _answered_model(body, host.loaded.served_model_id)}
    if body.include_usage:
        meta["usage"] = None  # OpenAI: with include_usage every chunk but the last has usage: null
    relay = None
    if emit is not None:
        relay = StreamRelay(tokenizer=host.loaded.tokenizer, n=len(requests), meta=meta, emit=emit,
                            thinking=body.chat_template_kwargs.enable_thinking, stops=list(body.stop))
        for index, request in enumerate(requests):
            request.on_token = relay.on_token(index)
    try:
        handles = []
        for request in requests:
            handles.append(host.submit(request))
        _wait_for(handles, reader_gone, relay)
        results = [handle.result(timeout=600) for handle in handles]
    except SampleRequestError as exc:
        for handle in handles:
            handle.cancel()
        raise KilnError(exc.code, exc.message, status=_STATUS.get(exc.code, 500), hint=hint_for(exc.code)) from None
    set_worker_status(resident_adapters=host.sampler.resident_adapters())  # the heartbeat carries it
    choices = [_choice(i, r, messages=messages, with_provenance=body.rollout_provenance) for i, r in enumerate(results)]
    usage = {key: sum(r.usage.get(key, 0) for r in results)
             for key in ("prompt_tokens", "completion_tokens", "total_tokens")}
    usage["prompt_tokens"] = results[0].usage.get("prompt_tokens", 0)  # one prompt, shared by every choice
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    if relay is not None:
        for index, result in enumerate(results):
            relay.settle(index, result)
    return {"id": meta["id"], "object": "chat.completion", "created": meta["created"],
            "model": meta["model"], "choices": choices, "usage": usage,
            "system_fingerprint": host.loaded.identity.get("inference_config_sha256")}


def _answered_model(body, base_model_id: str) -> str:
    """The response's `model`: the adapter's name when the request's `model` named it (the web process
    resolved it into `adapter`), as vLLM answers a LoRA by its name; else the resident base model's id,
    whatever name a guide's request file used. Each choice's `adapter` says which adapter served it."""
    if body.adapter and body.adapter != "base" and body.model == body.adapter:
        return body.adapter
    return base_model_id


def _final_chunks(response: dict, *, include_usage: bool) -> list[dict]:
    """After the streamed text: each choice's finish (with its provenance record), then, when the request
    asked for it (stream_options.include_usage), the usage in a chunk with no choices (OpenAI's order:
    a client that reads choices[0] of every chunk breaks on a chunk it did not ask for)."""
    base = {"id": response["id"], "object": "chat.completion.chunk", "created": response["created"],
            "model": response["model"]}
    if include_usage:
        base["usage"] = None
    chunks = []
    for choice in response["choices"]:
        index = choice["index"]
        final = {"index": index, "delta": {}, "finish_reason": choice["finish_reason"]}
        if "rollout_provenance" in choice:
            final["rollout_provenance"] = choice["rollout_provenance"]
        chunks.append({**base, "choices": [final]})
    if include_usage:
        chunks.append({**base, "choices": [], "usage": response["usage"]})
    return chunks


def handle_chat_completion(raw_body: dict, emit, reader_gone=None) -> None:
    """The `infer` actor's work: ends with exactly one `done` or `error` event, or with none when
    `reader_gone()` says nobody waits any more (its requests are then cancelled, not finished)."""
    from adapters.metrics import count_inference
    from adapters.serving.limits import hint_for
    from adapters.serving.schemas import ChatCompletionRequest

    started = time.monotonic()
    try:
        body = ChatCompletionRequest.model_validate(raw_body)
        response = chat_completion(body, emit=emit if body.stream else None, reader_gone=reader_gone)
    except ReaderGone:
        log.info("chat completion abandoned by its reader: generation stopped")
        count_inference("abandoned", time.monotonic() - started)
        return
    except KilnError as exc:
        count_inference("failed", time.monotonic() - started)
        emit({"type": "error", "code": exc.code, "message": exc.message, "hint": exc.hint or hint_for(exc.code),
              "status": exc.status})
        return
    except Exception as exc:  # noqa: BLE001 - reported to the caller, logged here
        log.exception("chat completion failed")
        count_inference("failed", time.monotonic() - started)
        emit({"type": "error", "code": "inference_failed", "message": f"{type(exc).__name__}: {exc}"[:500],
              "hint": hint_for("inference_failed"), "status": 500})
        return
    count_inference("completed", time.monotonic() - started, response["usage"])
    if body.stream:
        emit({"type": "done", "final_chunks": _final_chunks(response, include_usage=body.include_usage)})
    else:
        emit({"type": "done", "response": response})
