"""Reads about `rollouts.generate` jobs: where their files live, the job-page section, the download files.

The job row is the truth: the section is built from the job's payload and result (the statistics
the handler returned), and a file is only offered for download when the job completed and the
file sits where the handler published it (KILN_HOME/rollouts/<job uuid>/). Imports no torch and
no gpu_runtime (web-facing modules read through it).
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.urls import reverse

from core.jobs.kinds import JobSection
from core.jobs.models import Job, JobState
from evaluations.payloads import RolloutsJobPayload

ROLLOUTS_KIND = "rollouts.generate"
ROLLOUTS_FILE = "rollouts.jsonl"
SUMMARY_FILE = "summary.json"
DOWNLOADS = {ROLLOUTS_FILE: "application/x-ndjson", SUMMARY_FILE: "application/json"}
RESULT_KEYS = {ROLLOUTS_FILE: "rollouts_path", SUMMARY_FILE: "summary_path"}


def rollouts_root() -> Path:
    return settings.KILN.layout.rollouts


def rollouts_job_dir(*, job_id: str) -> Path:
    """Where a generation job publishes its files (one directory per job)."""
    return rollouts_root() / str(job_id)


def is_rollouts_job(job) -> bool:
    return job is not None and job.kind == ROLLOUTS_KIND


def rollout_jobs(*, limit: int = 20):
    return list(Job.objects.filter(kind=ROLLOUTS_KIND).select_related("submitted_by").order_by("-id")[:limit])


def rollout_file(*, job, name: str) -> Path | None:
    """A completed job's published file by name (rollouts.jsonl or summary.json), or None."""
    if not is_rollouts_job(job) or job.state != JobState.COMPLETED or name not in RESULT_KEYS:
        return None
    recorded = (job.result or {}).get(RESULT_KEYS[name])
    expected = rollouts_job_dir(job_id=str(job.uuid)) / name
    if not recorded or Path(recorded) != expected or not expected.is_file():
        return None
    return expected


def _histogram_bars(histogram) -> list[dict]:
    if not isinstance(histogram, dict) or not isinstance(histogram.get("buckets"), list):
        return []
    buckets = [b for b in histogram["buckets"] if isinstance(b, dict)]
    top = max((b.get("count") or 0 for b in buckets), default=0) or 1
    bars = []
    for bucket in buckets:
        if histogram.get("kind") == "values":
            label = f"{bucket.get('value'):.4g}" if isinstance(bucket.get("value"), int | float) else "?"
        else:
            low = bucket.get("min_inclusive")
            high = bucket.get("max_inclusive", bucket.get("max_exclusive"))
            label = f"{low:.3g} – {high:.3g}" if isinstance(low, int | float) and isinstance(high, int | float) else "?"
        count = bucket.get("count") or 0
        bars.append({"label": label, "count": count, "pct": max(1.0, 100 * count / top) if count else 0})
    return bars


def training_runs_from(*, rollouts_path: str):
    """GRPO jobs that trained on a given rollouts file (dataset_path submissions)."""
    if not rollouts_path:
        return []
    return list(Job.objects.filter(kind="training.grpo", payload__training_data__path=rollouts_path)
                .order_by("-id")[:10])


def job_section(job) -> JobSection:
    """The rollouts part of a generation job's page (JobKind.detail_section of rollouts.generate)."""
    return JobSection("ui/training/rollouts_section.html", {"rollouts": rollouts_section(job)},
                      page_template="ui/training/rollouts_train.html",
                      update_template="ui/training/rollouts_train.html#train_button",
                      links=(("Rollouts", reverse("ui:training_rollouts")),))


def rollouts_section(job) -> dict:
    """What the rollouts part of a generation job's page shows."""
    payload, result, metrics = RolloutsJobPayload.of(job), job.result or {}, job.metrics or {}
    stats = result.get("stats") if isinstance(result.get("stats"), dict) else None
    files = []
    for name in DOWNLOADS:
        path = rollout_file(job=job, name=name)
        if path is not None:
            files.append({"name": name, "size": path.stat().st_size})
    rollouts_path = str(rollout_file(job=job, name=ROLLOUTS_FILE) or "")
    adapter = payload.adapter
    return {
        "adapter": adapter,
        "from_base": adapter == "base",
        "scorer": payload.scorer,
        "seeds": payload.to_dict()["seeds"],
        "tasks": payload.inputs.get("tasks") or {},
        "thinking": payload.thinking,
        "requests_total": metrics.get("requests_total", payload.requests),
        "requests_done": metrics.get("requests_done"),
        "running_mean_reward": metrics.get("mean_reward"),
        "stats": stats,
        "histogram": _histogram_bars(stats.get("reward_histogram")) if stats else [],
        "histogram_kind": (stats.get("reward_histogram") or {}).get("kind") if stats else None,
        "no_contrast_ids": (stats.get("groups_without_contrast_ids") or [])[:50] if stats else [],
        "all_flat": bool(stats) and stats.get("groups") and stats.get("groups_without_contrast") == stats.get("groups"),
        "output": result.get("output") or {},
        "scorer_result": result.get("scorer") or {},
        "files": files,
        "rollouts_path": rollouts_path,
        "trainable": bool(rollouts_path),
        "training_runs": training_runs_from(rollouts_path=rollouts_path),
    }
