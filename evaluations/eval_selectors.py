"""Reads about eval jobs (`eval.run`): the pinned suite, the published results, the API's
`EvalResult` and list rows, and the job-page section.

The job row is the truth about state; per-example outcomes and completions live in the file the
handler published atomically when the job completed (`HomeLayout.eval_job(uuid)/results.json`,
its sha256 recorded in the job result and re-checked on every read). While a job runs, the counts
so far come from its metrics. Imports no torch (web-facing modules read through it).
"""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.urls import reverse

from core.canonical import sha256_digest
from core.errors import KilnError
from core.jobs.error_hints import job_error
from core.jobs.kinds import JobSection
from core.jobs.models import Job, JobState
from evaluations.eval_payloads import KIND, OUTCOME_KINDS, EvalJobPayload, target_label

RESULTS_FILE = "results.json"
RESULTS_SCHEMA = "kiln.eval-results.v1"
SECTION_ROWS = 200
SECTION_COMPLETION_CHARS = 120


def eval_job_dir(*, job_id: str) -> Path:
    return settings.KILN.layout.eval_job(str(job_id))


def eval_results_path(*, job_id: str) -> Path:
    return eval_job_dir(job_id=job_id) / RESULTS_FILE


def pinned_suite(*, payload: EvalJobPayload) -> dict | None:
    """The suite document a job was pinned to, or None if it is gone or no longer its sha256."""
    return None if pinned_suite_problem(payload=payload) else json.loads(Path(payload.suite["path"]).read_bytes())


def pinned_suite_problem(*, payload: EvalJobPayload) -> str | None:
    """Why the suite a job was pinned to cannot be used (gone, or no longer its recorded sha256), or None."""
    return _file_problem(Path(payload.suite["path"]), payload.suite["sha256"], "the pinned suite")


def _file_problem(path: Path, recorded: str | None, what: str) -> str | None:
    try:
        data = path.read_bytes()
    except OSError as exc:
        return f"{what} {path.name} cannot be read ({exc.strerror or exc})"
    if sha256_digest(data) != recorded:
        return f"{what} {path.name} no longer hashes to {recorded}, the digest recorded when the job ran"
    return None


def results_problem(*, job) -> str | None:
    """Why a completed job's published results cannot be trusted (moved, gone, or changed since the
    job recorded their sha256), or None; None too for a job that published nothing (yet)."""
    result = job.result or {}
    if job.state != JobState.COMPLETED or not result.get("results_path"):
        return None
    expected = eval_results_path(job_id=str(job.uuid))
    if Path(result["results_path"]) != expected:
        return f"its results path {result['results_path']} is not the registry's {expected}"
    return _file_problem(expected, result.get("results_sha256"), "its results file")


def eval_jobs(*, limit: int = 200):
    return list(Job.objects.filter(kind=KIND, deleted_at__isnull=True).select_related("submitted_by")
                .order_by("-id")[:limit])


def eval_job_get(*, job_id: str) -> Job | None:
    from core.jobs.selectors import job_get

    job = job_get(job_id=job_id)
    return job if job is not None and job.kind == KIND else None


def eval_results_document(*, job) -> dict | None:
    """A completed job's published results (checked against the sha256 in its result), or None."""
    result = job.result or {}
    if job.state != JobState.COMPLETED or not result.get("results_path"):
        return None
    if results_problem(job=job):
        return None
    return json.loads(eval_results_path(job_id=str(job.uuid)).read_bytes())


def eval_records(*, job) -> list[dict] | None:
    document = eval_results_document(job=job)
    return None if document is None else document["records"]


def empty_counts() -> dict:
    return {kind: 0 for kind in OUTCOME_KINDS}


def _targets(payload: EvalJobPayload, result: dict) -> list[dict]:
    per_target = {t.get("index"): t for t in result.get("targets") or []}
    out = []
    for index, target in enumerate(payload.targets):
        summary = per_target.get(index) or {}
        out.append({"index": index, "adapter": target.get("adapter"), "label": target_label(target.get("adapter")),
                    "content_sha256": target.get("content_sha256"), "counts": summary.get("counts"),
                    "total": summary.get("total"), "accuracy": summary.get("accuracy")})
    return out


def _replay(job, payload: EvalJobPayload) -> dict | None:
    if payload.mode != "replay":
        return None
    of = (payload.origin or {}).get("job_id")
    if job.state == JobState.COMPLETED and isinstance((job.result or {}).get("replay"), dict):
        return {"of": of, **job.result["replay"]}
    if job.state in (JobState.FAILED, JobState.CANCELLED):
        return {"of": of, "status": "error", "message": f"the replay job ended {job.state}: "
                f"{job.error_code}: {job.error_message}"}
    return {"of": of, "status": "pending"}


def eval_summary(job) -> dict:
    """One row of GET /v1/eval/jobs."""
    payload, result, metrics = EvalJobPayload.of(job), job.result or {}, job.metrics or {}
    counts = result.get("counts") or ({k: metrics.get(k, 0) for k in OUTCOME_KINDS} if metrics else None)
    replay = _replay(job, payload)
    targets = _targets(payload, result) if result.get("targets") else None
    # Several targets: a pooled accuracy or count mixes adapters and means nothing alone, so the
    # top-level figures are null and each target's are given, in `targets` order.
    pooled = len(payload.targets) > 1
    return {
        "job_id": str(job.uuid), "mode": payload.mode, "state": job.state, "progress": job.progress,
        "progress_message": job.progress_message, "suite_name": payload.suite["name"],
        "suite_hash": payload.suite["suite_hash"], "effective_generation_hash": payload.effective_generation_hash,
        "targets": payload.labels, "counts": None if pooled else counts,
        "total": result.get("total", payload.suite["examples"] * len(payload.targets)),
        "accuracy": None if pooled else result.get("accuracy"),
        "target_accuracies": [t["accuracy"] for t in targets] if targets else None,
        "target_counts": [t["counts"] for t in targets] if targets else None,
        "replay_status": replay["status"] if replay else None,
        "origin": payload.origin, "created_at": job.created_at, "finished_at": job.finished_at,
        "error": job_error(job),
    }


def eval_result(job, *, include_examples: bool = True) -> dict:
    """GET /v1/eval/jobs/{id}: the `EvalResult`."""
    payload, result = EvalJobPayload.of(job), job.result or {}
    document = eval_results_document(job=job) if include_examples else None
    return {
        **eval_summary(job),
        "started_at": job.started_at, "source_suite_hash": payload.suite.get("source_suite_hash"),
        "suite_source": payload.suite.get("source"), "generation": payload.generation, "model": payload.model,
        "targets": _targets(payload, result), "examples": document["records"] if document else [],
        "table": document.get("table", []) if document else [], "replay": _replay(job, payload),
        "results_path": result.get("results_path"), "results_sha256": result.get("results_sha256"),
        "metrics": job.metrics or {},
        # Set when the published evidence changed or went after the job finished: its examples are then
        # not shown (they no longer are what was scored) and replay/rerun refuse.
        "evidence_error": _evidence_error(job),
    }


def evidence_integrity_error(job) -> KilnError | None:
    """What is wrong with a completed eval job's evidence (its results file or pinned suite gone or
    changed since the job ran), as the 409 eval_evidence_integrity_failed replay and rerun refuse with;
    None when it is intact or the job has not completed."""
    if job.state != JobState.COMPLETED:
        return None
    problem = results_problem(job=job) or pinned_suite_problem(payload=EvalJobPayload.of(job))
    if not problem:
        return None
    return KilnError("eval_evidence_integrity_failed", f"eval job {job.uuid}: {problem}", status=409, field="job",
                     hint="the job's evidence changed after it finished: restore the file from a backup, or run "
                          "the suite again as a new eval job (POST /v1/eval/run, kiln eval run)")


def _evidence_error(job) -> dict | None:
    error = evidence_integrity_error(job)
    return error.envelope()["error"] if error else None


# -- the job page -----------------------------------------------------------------------------

def _clip(text: str | None, limit: int = SECTION_COMPLETION_CHARS) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def eval_section(job) -> dict:
    """What the eval part of an `eval.run` job's page shows."""
    data = eval_result(job)
    labels = [t["label"] for t in data["targets"]]
    rows = [{"example_id": r["example_id"], "target": r.get("target") or labels[r.get("target_index", 0)],
             "outcome": r["outcome"], "detail": _clip(r.get("detail"), 160), "completion": _clip(r.get("completion")),
             "finish_reason": r.get("finish_reason")} for r in data["examples"][:SECTION_ROWS]]
    metrics = job.metrics or {}
    counts = data["counts"] or empty_counts()
    for target in data["targets"]:  # a comparison shows its outcomes per target, never pooled
        target["count_items"] = [(k, (target["counts"] or {}).get(k, 0)) for k in OUTCOME_KINDS]
    return {
        **data, "counts": counts, "rows": rows, "rows_total": len(data["examples"]),
        "rows_truncated": len(data["examples"]) > SECTION_ROWS, "compare": len(labels) > 1, "labels": labels,
        "examples_done": metrics.get("examples_done"), "examples_total": metrics.get("examples_total"),
        "count_items": [(k, counts.get(k, 0)) for k in OUTCOME_KINDS],
    }


def job_section(job) -> JobSection:
    """The eval part of an eval job's page (JobKind.detail_section of eval.run)."""
    section = eval_section(job)
    metrics = {k: v for k, v in (job.metrics or {}).items() if k not in OUTCOME_KINDS}
    return JobSection("ui/evaluations/eval_job_section.html", {"evaluation": section}, metrics=metrics,
                      links=(("Evaluations", reverse("ui:evaluations")),))


# -- the Evaluations pages: the jobs list and the compare view --------------------------------

COMPARE_PAGE_ROWS = 100
COMPARE_PREVIEW_CHARS = 80


def eval_job_rows(*, limit: int = 200) -> list[dict]:
    """The Evaluations → Jobs table: each eval job with its `eval_summary` (no results file is read)."""
    return [{"job": job, "summary": eval_summary(job)} for job in eval_jobs(limit=limit)]


def _last_user_text(messages) -> str:
    for message in reversed(messages or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
    return ""


def _compare_cell(record: dict | None) -> dict | None:
    if record is None:
        return None
    completion = record.get("completion")
    return {"outcome": record["outcome"], "completion": completion, "preview": _clip(completion, COMPARE_PREVIEW_CHARS),
            "detail": record.get("detail") or "", "finish_reason": record.get("finish_reason")}


def eval_compare(job, *, differing_only: bool = False, offset: int = 0, limit: int = COMPARE_PAGE_ROWS) -> dict:
    """The compare view of an eval job: one row per example id (suite order) with each target's outcome
    and completion side by side, the example's prompt and reference target from the pinned suite, and
    the per-target counts. `differs` is true when the targets' outcomes are not all the same; with
    `differing_only` only those rows are kept. Rows are paged (`offset`, `limit`) after filtering."""
    payload = EvalJobPayload.of(job)
    targets = _targets(payload, job.result or {})
    document = eval_results_document(job=job)
    suite = pinned_suite(payload=payload) or {}
    examples = {e.get("id"): e for e in suite.get("examples") or [] if isinstance(e, dict)}
    n = len(targets)
    by_example: dict[str, list] = {}
    for record in (document or {}).get("records") or []:
        cells = by_example.setdefault(record["example_id"], [None] * n)
        index = record.get("target_index", 0)
        if 0 <= index < n:
            cells[index] = record
    rows = []
    for example_id, records in by_example.items():
        outcomes = [r["outcome"] if r else None for r in records]
        example = examples.get(example_id) or {}
        rows.append({"example_id": example_id, "prompt": _last_user_text(example.get("messages")),
                     "has_reference": "target" in example, "reference": example.get("target"),
                     "cells": [_compare_cell(r) for r in records], "outcomes": outcomes,
                     "differs": len(set(outcomes)) > 1})
    differing = sum(1 for row in rows if row["differs"])
    shown = [row for row in rows if row["differs"]] if differing_only else rows
    offset = max(0, min(offset, max(len(shown) - 1, 0)))
    labels = [t["label"] for t in targets]
    for target in targets:
        target["header"] = target["label"] if labels.count(target["label"]) == 1 else \
            f"{target['label']} #{target['index'] + 1}"
        target["count_items"] = [(k, (target["counts"] or {}).get(k, 0)) for k in OUTCOME_KINDS]
    return {
        "job": job, "payload": payload, "mode": payload.mode, "suite_name": payload.suite["name"],
        "suite_hash": payload.suite["suite_hash"], "effective_generation_hash": payload.effective_generation_hash,
        "generation": payload.generation, "targets": targets, "available": document is not None,
        "suite_readable": bool(examples), "examples_total": len(rows), "differing_total": differing,
        "differing_only": differing_only, "rows_total": len(shown), "rows": shown[offset:offset + limit],
        "offset": offset, "limit": limit,
    }


def eval_target_choices() -> list[str]:
    """The adapters an eval job can target besides the base model: the published ones, by name."""
    from adapters.models import Adapter, AdapterState

    return list(Adapter.objects.filter(state=AdapterState.PUBLISHED).order_by("name").values_list("name", flat=True))
