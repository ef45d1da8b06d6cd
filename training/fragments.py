"""Training markup shared by pages and live consumers: the GRPO queue and a training job's section.

Reads go through training.selectors and adapters.selectors only; nothing here decides anything
about training. The job page and JobDetailConsumer both render the section through
fragments.job_detail_context, and the GRPO page and TrainingQueueConsumer both render the queue
through queue_context, so a page and its live updates share one markup.
Web-facing: never imports torch, transformers, peft, gpu_runtime or training.services.
"""

from __future__ import annotations

from django.template.loader import render_to_string
from django.urls import reverse

from adapters import selectors as adapter_selectors
from adapters.receipt_view import receipt_view
from core.jobs.kinds import JobSection
from core.sparkline import sparkline
from training import selectors
from training.payloads import GrpoJobPayload

QUEUE = "ui/training/queue.html"
# (id, label, metrics history key, value key inside each history entry)
CURVES = (
    ("loss", "Loss", "loss_history", "loss"),
    ("reward", "Reward (mean)", "reward_history", "reward_mean"),
    ("kl", "KL (mean)", "kl_history", "kl_mean"),
)
HISTORY_KEYS = frozenset(history for _, _, history, _ in CURVES)
def is_training_job(job) -> bool:
    return job.kind in selectors.TRAINING_KINDS


def metrics_without_histories(job) -> dict:
    """A training job's scalar metrics: its histories are drawn as curves, not dumped as JSON."""
    return {name: value for name, value in (job.metrics or {}).items() if name not in HISTORY_KEYS}


def job_section(job) -> JobSection:
    """The GRPO part of a training job's page (JobKind.detail_section of training.grpo)."""
    return JobSection("ui/training/job_section.html", {"training": training_section(job)},
                      metrics=metrics_without_histories(job), links=(("GRPO training", reverse("ui:training_grpo")),))


def _detail(job) -> tuple[dict, str]:
    """The selector's detail, or (if the receipt file cannot be read yet) the status without it.

    Receipt writes are not atomic (spec §2.9): a page that catches one half-written must still render.
    """
    try:
        return selectors.training_detail(job, strict_receipt=True), ""
    except (ValueError, OSError) as exc:
        metrics = job.metrics or {}
        detail = {**selectors.training_status(job), "adapter_path": job.result.get("adapter_path"),
                  "effective_config": GrpoJobPayload.of(job).config.to_dict(), "train_receipt": None,
                  **{history: metrics.get(history, []) for history in HISTORY_KEYS}}
        return detail, f"the training receipt could not be read yet ({type(exc).__name__}: {exc})"


def training_curves(histories: dict) -> list[dict]:
    """The loss, reward and KL sparklines from a training job's histories (`loss_history`, ...)."""
    return [{"id": name, "label": label, "line": sparkline(histories.get(history), key)}
            for name, label, history, key in CURVES]


def training_section(job) -> dict:
    """Everything the training part of a job page shows (curves, filter stats, adapter, receipt)."""
    detail, receipt_error = _detail(job)
    metrics = job.metrics or {}
    curves = training_curves({history: detail.get(history) or metrics.get(history) for history in HISTORY_KEYS})
    name = detail.get("adapter_name")
    registered = adapter_selectors.adapter_get(name=name) if name else None
    # The registry row is this job's output only if this job reserved it: a failed job's released
    # name may since have been published by another job, whose adapter and receipt are not this job's.
    adapter = registered if registered is not None and registered.training_job_id == job.id else None
    config = detail.get("effective_config") or {}
    kept, filtered = _group_counts(metrics, detail.get("train_receipt"))
    seen = (kept or 0) + (filtered or 0) if isinstance(kept, int) and isinstance(filtered, int) else None
    return {
        "detail": detail,
        "curves": curves,
        "loss": metrics.get("loss", detail.get("current_loss")),
        "step": metrics.get("step"),
        "total_steps": metrics.get("total_steps"),
        "kept_groups": kept,
        "filtered_groups": filtered,
        "kept_pct": round(100 * kept / seen) if seen else None,
        "config": config,
        "adapter": adapter,
        "adapter_name": name,
        "name_taken_by": registered if registered is not None and adapter is None else None,
        "receipt": receipt_view(detail.get("train_receipt")),
        "receipt_error": receipt_error,
        "receipt_url": f"/v1/adapters/{name}/receipt" if adapter is not None else f"/v1/train/jobs/{job.uuid}",
        "warnings": selectors.submission_warnings(job),
    }


def _group_counts(metrics: dict, receipt: dict | None) -> tuple[int | None, int | None]:
    """(kept, filtered) groups: live from the trainer's progress, else from the receipt's data block
    (a run that failed before its first step, e.g. zero_groups, reported no progress)."""
    kept, filtered = metrics.get("kept_groups"), metrics.get("filtered_groups")
    data = (receipt or {}).get("data") if isinstance(receipt, dict) else None
    if isinstance(data, dict) and isinstance(data.get("groups_read"), int) and isinstance(
        data.get("groups_filtered"), int
    ):
        if filtered is None:
            filtered = data["groups_filtered"]
        if kept is None:
            kept = data["groups_read"] - data["groups_filtered"]
    return kept, filtered


def queue_context() -> dict:
    """The GRPO training queue: the running job, queued jobs with positions, recently finished."""
    return {"queue": selectors.training_queue()}


def render_queue(*, live: bool = True) -> str:
    """The whole queue block as a live snapshot: it replaces the page's #training-queue."""
    return render_to_string(f"{QUEUE}#training_queue", {**queue_context(), "queue_oob": True, "live": live})
