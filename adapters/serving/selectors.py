"""What the web process knows about inference readiness, read from worker heartbeats."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

from core.errors import KilnError, clip
from core.jobs.selectors import silent_worker_note, workers_alive


def _inference_workers():
    return [w for w in workers_alive() if "infer" in w.queues]


def require_inference_ready() -> None:
    """503 with a stable code unless a live GPU worker has the model loaded."""
    workers = _inference_workers()
    if not workers:
        silent = silent_worker_note("infer")
        if silent:
            raise KilnError("inference_unavailable", f"no GPU worker is serving the infer queue: {silent}", status=503,
                            hint="free disk space if it is full (the worker reports again by itself), else restart "
                                 "kiln serve")
        raise KilnError("inference_unavailable", "no GPU worker is serving the infer queue", status=503,
                        hint="kiln serve starts one; or run: kiln worker --queues gpu,infer")
    models = [w.status.get("model") or {} for w in workers]
    if not any(m.get("loaded") for m in models):
        reason = next((m.get("error") for m in models if m.get("error")), None)
        if reason:
            raise KilnError("model_unavailable", f"the model is not loaded: {reason}", status=503,
                            hint="set KILN_MODEL_PATH or [model] path in kiln.toml, then restart")
        raise KilnError("model_loading", "the GPU worker is still loading the model", status=503,
                        hint="retry in a few seconds; /health shows progress")


def worker_dead(worker_id: str) -> bool:
    """Whether the worker that claimed an inference request has died (its heartbeat, and /proc here)."""
    from core.jobs.liveness import worker_is_dead
    from core.jobs.models import WorkerHeartbeat

    return worker_is_dead(WorkerHeartbeat.objects.filter(worker_id=worker_id).first())


def served_base_model_id() -> str | None:
    """The id of the base model a live GPU worker has loaded; None while none has."""
    for worker in _inference_workers():
        model = worker.status.get("model") or {}
        if model.get("loaded"):
            return model.get("served_model_id", "kiln")
    return None


def _servable_adapters():
    """Published adapters a chat completion may name (require_servable_adapter admits them): not
    quarantined, unless an operator loaded one anyway."""
    from django.db.models import Q

    from adapters.models import Adapter, AdapterState

    return (Adapter.objects.filter(state=AdapterState.PUBLISHED).exclude(path="")
            .filter(Q(quarantined=False) | Q(loaded=True)).order_by("name"))


def served_models() -> list[dict]:
    """GET /v1/models: the base model, then each servable adapter (`parent` names the base, as vLLM
    lists LoRA adapters); empty while no GPU worker has the model loaded."""
    base = served_base_model_id()
    if base is None:
        return []
    models = [{"id": base, "object": "model", "created": _model_created(settings.KILN.model_path), "owned_by": "kiln",
               "root": str(settings.KILN.model_path or "")}]
    for adapter in _servable_adapters():
        published = adapter.published_at or adapter.created_at
        models.append({"id": adapter.name, "object": "model", "created": int(published.timestamp()),
                       "owned_by": "kiln", "root": adapter.path, "parent": base})
    return models


def _model_created(model_path) -> int:
    """When the base model's files were written (its config.json's modification time), as the Unix time
    OpenAI's `created` is; 0 when it cannot be read (QA saw 0 always)."""
    try:
        return int((Path(model_path) / "config.json").stat().st_mtime) if model_path else 0
    except OSError:
        return 0


def adapter_named_by_model(model: str) -> str | None:
    """The adapter a request's `model` names: a published adapter of that name (the base model's own id
    names the base model's default service); None otherwise, and the field then selects nothing."""
    from adapters.models import Adapter, AdapterState

    if model in ("", "base") or model == served_base_model_id():
        return None
    published = Adapter.objects.filter(name=model, state=AdapterState.PUBLISHED).exclude(path="").exists()
    return model if published else None


def resident_adapters() -> set[str]:
    """The adapters a live GPU worker holds in memory (its heartbeat's `resident_adapters`)."""
    names = set()
    for worker in _inference_workers():
        names.update(n for n in worker.status.get("resident_adapters") or [] if isinstance(n, str))
    return names


def require_servable_adapter(name: str | None) -> None:
    """404 `adapter_not_found` for a name the registry has not published; 409 `adapter_quarantined` for a
    named adapter whose serving canary failed: it is not served (its bytes may have changed, or it does
    not load) until an operator loads it again anyway."""
    if name in (None, "", "base"):
        return
    from adapters.models import Adapter, AdapterState

    adapter = Adapter.objects.filter(name=name).only("quarantined", "loaded", "state", "path").first()
    if adapter is None or adapter.state != AdapterState.PUBLISHED or not adapter.path:
        # Known before anything is queued: a stream answers 404 too, not 200 and then an error event.
        raise KilnError("adapter_not_found", f"no published adapter is named {clip(name)!r}", status=404,
                        hint="list published adapters with GET /v1/adapters; leave adapter out for the active one, "
                             "or send \"base\" for the base model")
    if adapter.quarantined and not adapter.loaded:
        raise KilnError(
            "adapter_quarantined",
            f"adapter {clip(name)!r} is quarantined: its serving canary failed, so it is not served",
            status=409,
            hint=f"see why with `kiln adapters verify {name}` and GET /v1/adapters/{name}/detail (canary); "
            f"serve it anyway with `kiln adapters load {name} --allow-quarantined`",
        )


def default_adapter() -> str:
    """What a chat completion without `adapter` is served with: the active adapter, else the base model.
    Read per request from the registry, so a GPU worker serves what the registry says after a restart too."""
    from adapters.selectors import adapter_active

    active = adapter_active()
    return active.name if active is not None else "base"


def served_model_identity() -> dict | None:
    """The identity (base weights, tokenizer, template digests) of the model a live GPU worker loaded."""
    for worker in _inference_workers():
        model = worker.status.get("model") or {}
        if model.get("loaded") and model.get("identity"):
            return model["identity"]
    return None


MODEL_WAIT_SECONDS = 300.0  # a freshly started GPU worker may still be loading the model
WORKER_WAIT_SECONDS = 60.0  # after a restart the control worker may start before the GPU worker


def wait_for_inference_ready(ctx, *, timeout: float = MODEL_WAIT_SECONDS, worker_timeout: float = WORKER_WAIT_SECONDS,
                             poll: float = 2.0) -> None:
    """For a job that samples: wait (bounded, cancellable, one progress line) while the model loads,
    or for a while until a GPU worker is up (kiln serve starts its workers side by side); a model
    that failed to load raises at once."""
    import time

    started = time.monotonic()
    reported = None
    while True:
        try:
            require_inference_ready()
            return
        except KilnError as exc:
            waited = time.monotonic() - started
            if exc.code == "model_loading" and waited <= timeout:
                message = "waiting for the GPU worker to load the model"
            elif exc.code == "inference_unavailable" and waited <= worker_timeout:
                message = "waiting for a GPU worker to start"
            else:
                raise
        ctx.raise_if_stopped()
        if reported != message:
            ctx.report_progress(0.0, message)
            reported = message
        time.sleep(poll)

