"""Job markup shared by pages and live consumers, so both render exactly the same HTML.

Pages include the partials of templates/ui/jobs/table.html and detail.html; the consumers render
the same partials with hx-swap-oob set so htmx's ws extension swaps them in place. Reads go
through kiln_project.jobs.selectors only. Web-facing: never imports torch or gpu_runtime.
"""

from __future__ import annotations

from django.template.loader import render_to_string

from kiln_project.jobs import selectors
from kiln_project.jobs.kinds import get_job_kind
from kiln_project.ui import training_fragments
from training import rollout_selectors

TABLE = "ui/jobs/table.html"
DETAIL = "ui/jobs/detail.html"
DEFAULT_LIMIT = 100
# What an empty table says, by UI category (None: the all-jobs table).
EMPTY_TEXT = {
    None: "No jobs yet.",
    "training": "No GRPO training jobs yet.",
    "openenv": "No OpenEnv runs yet.",
    "evaluation": "No evaluation jobs yet.",
}


def jobs_for_table(*, category: str | None = None, limit: int = DEFAULT_LIMIT):
    """The newest jobs (optionally of one UI category) with their submitters, for one table."""
    return list(selectors.job_list(category=category, limit=limit).select_related("submitted_by"))


def job_in_category(job, category: str | None) -> bool:
    """Whether a job belongs on a table filtered to a category (None: every table shows it)."""
    if not category:
        return True
    kind = get_job_kind(job.kind)
    return kind is not None and kind.category == category


def job_detail_context(job) -> dict:
    """Everything the live part of the job page shows (plus its training section for GRPO jobs, and
    its rollouts section for rollout generation jobs)."""
    training = training_fragments.is_training_job(job)
    return {
        "job": job,
        "events": selectors.job_events(job=job),
        "queue_position": selectors.job_queue_position(job=job),
        "metrics": training_fragments.metrics_without_histories(job) if training else (job.metrics or {}),
        "training": training_fragments.training_section(job) if training else None,
        "rollouts": rollout_selectors.rollouts_section(job) if rollout_selectors.is_rollouts_job(job) else None,
    }


def table_context(jobs, *, category: str | None = None, limit: int = DEFAULT_LIMIT) -> dict:
    """What templates/ui/jobs/table.html needs: rows, empty text and its live socket's URL."""
    query = "&".join(part for part in (f"category={category}" if category else "",
                                       f"limit={limit}" if limit != DEFAULT_LIMIT else "") if part)
    return {
        "jobs": jobs,
        "empty_text": EMPTY_TEXT.get(category, EMPTY_TEXT[None]),
        "ws_url": "/ws/ui/jobs/" + (f"?{query}" if query else ""),
    }


def render_jobs_body(jobs, *, category: str | None = None) -> str:
    """The whole <tbody> as a live snapshot: it replaces the page's table body."""
    return render_to_string(f"{TABLE}#jobs_body",
                            {**table_context(jobs, category=category), "body_oob": True, "live": True})


def render_job_row(job, *, new: bool) -> str:
    """One row: swapped in place by id, or (new) prepended to the table body."""
    partial = "job_row_new" if new else "job_row"
    return render_to_string(f"{TABLE}#{partial}", {"job": job, "row_oob": not new})


def render_job_update(job) -> str:
    """The live part of the job page (plus removal of the cancel form once the job has ended)."""
    return render_to_string(f"{DETAIL}#job_update", {**job_detail_context(job), "live_oob": True, "live": True})
