"""Job markup shared by pages and live consumers, so both render exactly the same HTML.

Pages include the partials of templates/ui/jobs/table.html and detail.html; the consumers render
the same partials with hx-swap-oob set so htmx's ws extension swaps them in place. Reads go
through core.jobs.selectors only. Web-facing: never imports torch or gpu_runtime.
"""

from __future__ import annotations

from django.template.loader import render_to_string

from core.jobs import selectors
from core.jobs.kinds import get_job_kind

TABLE = "ui/jobs/table.html"
DETAIL = "ui/jobs/detail.html"
DEFAULT_LIMIT = 100
PAGE_EVENTS = 25  # the job page shows the newest; the API pages through all of them
# What an empty table says, by UI category (None: the all-jobs table).
EMPTY_TEXT = {
    None: "No jobs yet.",
    "training": "No GRPO training jobs yet.",
    "openenv": "No OpenEnv runs yet.",
    "evaluation": "No evaluation jobs yet.",
}


def jobs_for_table(*, category: str | None = None, state: str | None = None, limit: int = DEFAULT_LIMIT):
    """The newest jobs (optionally of one UI category, or in one state) with their submitters, for one table."""
    return list(selectors.job_list(category=category, state=state, limit=limit).select_related("submitted_by"))


def jobs_page(*, state: str | None = None, before=None, limit: int = DEFAULT_LIMIT):
    """One page of the all-jobs table, newest first: the `limit` jobs just older than the job `before`
    (a Job; None: the newest), and the job to pass as the next page's `before` (None: no older job)."""
    # job_list without its slice (limit=None) is every job in the table's order; the page is cut here.
    rows = selectors.job_list(state=state, limit=None)
    if before is not None:
        rows = rows.filter(id__lt=before.id)
    jobs = list(rows.select_related("submitted_by")[:limit + 1])
    return jobs[:limit], (jobs[limit - 1] if len(jobs) > limit else None)


def job_in_table(job, *, category: str | None = None, state: str | None = None) -> bool:
    """Whether a job belongs on a table filtered to a category and/or a state (None: any)."""
    return job_in_category(job, category) and (not state or job.state == state)


def job_in_category(job, category: str | None) -> bool:
    """Whether a job belongs on a table filtered to a category (None: every table shows it)."""
    if not category:
        return True
    kind = get_job_kind(job.kind)
    return kind is not None and kind.category == category


def job_detail_context(job) -> dict:
    """Everything the live part of the job page shows, plus the section its kind declares."""
    kind = get_job_kind(job.kind)
    section = kind.section(job) if kind is not None else None
    context = {
        "job": job,
        "events": selectors.job_events(job=job, limit=PAGE_EVENTS),
        "events_total": selectors.job_event_count(job=job),
        "queue_position": selectors.job_queue_position(job=job),
        "metrics": job.metrics or {},
        "section_template": None,
    }
    if section is not None:
        context.update(section.context, section_template=section.template,
                       section_page_template=section.page_template,
                       section_update_template=section.update_template, section_links=section.links)
        if section.metrics is not None:
            context["metrics"] = section.metrics
    return context


def category_page(request, *, category: str, template: str):
    """A page that lists one UI category's jobs (an app's landing page until it has more to show)."""
    from django.shortcuts import render

    return render(request, template, table_context(jobs_for_table(category=category), category=category))


def table_context(jobs, *, category: str | None = None, state: str | None = None, limit: int = DEFAULT_LIMIT,
                  live: bool = True) -> dict:
    """What templates/ui/jobs/table.html needs: rows, empty text and its live socket's URL (None: a
    page of older jobs, which stays as loaded)."""
    query = "&".join(part for part in (f"category={category}" if category else "",
                                       f"state={state}" if state else "",
                                       f"limit={limit}" if limit != DEFAULT_LIMIT else "") if part)
    empty_text = EMPTY_TEXT.get(category, EMPTY_TEXT[None])
    if state:
        empty_text = f"No {state} jobs."
    return {
        "jobs": jobs,
        "empty_text": empty_text,
        "ws_url": ("/ws/ui/jobs/" + (f"?{query}" if query else "")) if live else None,
    }


def render_jobs_body(jobs, *, category: str | None = None, state: str | None = None) -> str:
    """The whole <tbody> as a live snapshot: it replaces the page's table body."""
    return render_to_string(f"{TABLE}#jobs_body",
                            {**table_context(jobs, category=category, state=state), "body_oob": True, "live": True})


def render_job_row(job, *, new: bool) -> str:
    """One row: swapped in place by id, or (new) prepended to the table body."""
    partial = "job_row_new" if new else "job_row"
    return render_to_string(f"{TABLE}#{partial}", {"job": job, "row_oob": not new})


def render_job_row_removal(job) -> str:
    """Takes a job's row off a table it no longer belongs on (a state filter it has left)."""
    return f'<tr id="job-row-{job.uuid}" hx-swap-oob="delete"></tr>'


def render_job_update(job) -> str:
    """The live part of the job page (plus removal of the cancel form once the job has ended)."""
    return render_to_string(f"{DETAIL}#job_update", {**job_detail_context(job), "live_oob": True, "live": True})
