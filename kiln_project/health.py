"""What /health reports: serving profile, database, broker, workers, and model/training readiness.

Web-facing: the model check only looks at files; the GPU worker reports whether it really loaded
the weights in its heartbeat status, and that is shown beside the file check.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db import connection

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


def check_database() -> dict:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return {"ok": True, "engine": connection.vendor}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "engine": connection.vendor, "error": str(exc)[:300]}


def check_broker() -> dict:
    import redis

    try:
        client = redis.Redis.from_url(settings.KILN.effective_redis_url, socket_connect_timeout=2, socket_timeout=2)
        client.ping()
        return {"ok": True, "url": settings.KILN.public_dict()["redis_url"]}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "url": settings.KILN.public_dict()["redis_url"], "error": str(exc)[:300]}


def check_model_files(model_path: Path | None) -> dict:
    """Whether real weights are configured and look loadable, with the reason when not."""
    if model_path is None:
        return {"configured": False, "loadable": False, "path": None,
                "reason": "no model configured: set KILN_MODEL_PATH or [model] path in kiln.toml, "
                          "or build the tiny model with: kiln model create-tiny"}
    if not model_path.is_dir():
        return {"configured": True, "loadable": False, "path": str(model_path),
                "reason": f"{model_path} is not a directory"}
    missing = []
    if not (model_path / "config.json").is_file():
        missing.append("config.json")
    if not any(next(model_path.glob(p), None) for p in WEIGHT_PATTERNS):
        missing.append("weights (*.safetensors)")
    if not any((model_path / f).is_file() for f in TOKENIZER_FILES):
        missing.append("tokenizer (tokenizer.json)")
    if missing:
        return {"configured": True, "loadable": False, "path": str(model_path),
                "reason": f"{model_path} lacks {', '.join(missing)}"}
    return {"configured": True, "loadable": True, "path": str(model_path), "reason": ""}


def check_workers() -> dict:
    from core.jobs.selectors import workers_alive

    try:
        alive = workers_alive()
    except Exception as exc:  # noqa: BLE001 - the database check reports the cause
        return {"ok": False, "error": str(exc)[:300], "workers": []}
    served = sorted({q for w in alive for q in w.queues})
    return {
        "ok": {"gpu", "control"} <= set(served),
        "queues_served": served,
        "workers": [
            {"id": w.worker_id, "queues": w.queues, "last_seen": w.last_seen.isoformat(), "status": w.status}
            for w in alive
        ],
    }


def public_view(body: dict) -> dict:
    """What /health tells a caller without credentials: status fields only (no pids, paths,
    URLs, versions or error texts, which a probe could use)."""
    workers = body["workers"]
    out = {
        "status": body["status"],
        "serving_profile": body["serving_profile"],
        "database": {"ok": body["database"]["ok"]},
        "broker": {"ok": body["broker"]["ok"]},
        "workers": {"ok": workers["ok"], "queues_served": workers["queues_served"]},
        "model": {"configured": body["model"]["configured"], "loadable": body["model"]["loadable"]},
        "training_backend": {"ready": body["training_backend"]["ready"]},
        "inference": {"available": body["inference"]["available"]},
        "detail": "send Authorization: Bearer <token> (or log in) for the full report",
    }
    if "error" in body:
        out["error"] = body["error"]
    return out


def _silent_worker_note(queue: str) -> str | None:
    from core.jobs.selectors import silent_worker_note

    try:
        return silent_worker_note(queue)
    except Exception:  # noqa: BLE001 - the database check reports the cause
        return None


def health_report() -> tuple[int, dict]:
    database = check_database()
    broker = check_broker()
    workers = check_workers() if database["ok"] else {"ok": False, "queues_served": [], "workers": []}
    model = check_model_files(settings.KILN.model_path)
    gpu_status = next((w["status"] for w in workers["workers"] if "gpu" in w["queues"]), {})
    worker_model = gpu_status.get("model")
    if worker_model is not None:
        model["worker"] = worker_model
    training_ready = model["loadable"] and "gpu" in workers["queues_served"] and bool(
        worker_model and worker_model.get("loaded"))
    reasons = []
    if not model["loadable"]:
        reasons.append(model["reason"])
    if "gpu" not in workers["queues_served"]:
        silent = _silent_worker_note("gpu") if database["ok"] else None
        reasons.append(f"no GPU worker is serving: {silent}" if silent else
                       "no GPU worker is running (kiln serve starts one; or kiln worker --queues gpu,infer)")
    if "gpu" in workers["queues_served"] and not (worker_model and worker_model.get("loaded")):
        if worker_model and worker_model.get("error"):
            reasons.append(f"the GPU worker could not load the model: {worker_model['error']}")
        else:
            reasons.append("the GPU worker is still loading the model")
    serving = settings.KILN.serving_profile
    ok = database["ok"] and broker["ok"]
    body = {
        "status": ("ok" if workers["ok"] and training_ready else "degraded") if ok else "unavailable",
        "serving_profile": serving,
        "database": database,
        "broker": broker,
        "workers": workers,
        "model": model,
        "training_backend": {"ready": training_ready, "reason": "; ".join(reasons)},
        "inference": {
            "available": training_ready and serving != "maintenance",
            "reason": "the maintenance profile refuses inference" if serving == "maintenance" else "; ".join(reasons),
        },
    }
    if not ok:
        body["error"] = {"code": "service_unavailable",
                         "message": "the database or the message broker is unreachable",
                         "hint": "see database.error and broker.error"}
    return (200 if ok else 503), body
