"""Dashboard Training → OpenEnv (/ui/training/openenv/): the run form, Inspect, and live run cards.

- The page's form carries every `OpenEnvRunRequest` field (kiln_project/ui/openenv_form.py turns
  it into the POST /v1/openenv/runs body) and a fresh idempotency key per rendering, so the same
  page submitted twice is one run. `run_submit_checked` hands that body to
  openenv.runs.services.run_create, the one service POST /v1/openenv/runs calls too, so the rules
  are the route's by construction (the request validated once by openenv.runs.request.normalize,
  the server's checks, a train run's preflight, then run_submit). A KilnError is shown next to the
  form with its code, message and hint, and nothing is recorded.
- Inspect (htmx, one environment row) calls the same client functions as POST /v1/openenv/inspect
  and /tasks (openenv.api) and shows the identity, its hashes, the schema and the task catalog.
- `?fragment=runs` answers the run cards (`kiln.openenv-run.v5` documents from
  openenv.runs.selectors); the cards poll it every 2 s while any run is not terminal. Cancel is a
  POST to openenv.runs.services.run_cancel. Artifact links are the API's download route (the
  browser session authenticates it), which re-checks every file before streaming it.
- The cards are the newest CARD_LIMIT runs; "Older runs" pages on with `?before=<sequence>`, and
  `?run=<id>` (each card's id links there) shows that one run, however old.

The OpenEnv app sits above training in the layers, so its page lives in the wiring; this module
holds no run rule. Web-facing: never imports torch, transformers, peft or gpu_runtime.
"""

from __future__ import annotations

import json
import uuid

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from adapters.models import AdapterState
from adapters.selectors import adapter_list
from core.errors import KilnError
from core.jobs.fragments import jobs_for_table, table_context
from evaluations.suite_selectors import suite_list
from kiln_project.ui import openenv_form as form

PAGE = "ui/training_openenv.html"
CARDS = "ui/openenv/runs.html"
INSPECTION = "ui/openenv/inspection.html"
ROW = "ui/openenv/environment_row.html"
CARD_LIMIT = 20
TERMINAL = ("rollout_ready", "completed", "failed", "cancelled")
TERMINATIONS = ("done", "max_steps", "invalid_model_action", "protocol_error")
TASK_PAGE = 20
PERMISSION_TEXT = ("You lack the submit_job permission, so you cannot {what}. "
                   "An administrator can grant it in /admin/ (Users → permissions).")
DATA_SCOPES = (
    ("held-out", "held-out: the suite must not overlap the training data"),
    ("train-set-eval", "train-set-eval: diagnostic only, on training data"),
)


# --- submission ---------------------------------------------------------------------------------

def run_submit_checked(*, request, body: dict) -> tuple[dict, bool]:
    """(the run's status document, created) for a POST /v1/openenv/runs body, through the route's own
    service (openenv.runs.services.run_create) as the signed-in user. Its KilnError propagates."""
    from openenv.runs.api import require_enabled
    from openenv.runs.selectors import run_status
    from openenv.runs.services import run_create

    require_enabled()
    run, created = run_create(body=body, user=request.user)
    return run_status(run), created


# --- run cards ----------------------------------------------------------------------------------

def _uuid(value) -> str | None:
    try:
        return str(uuid.UUID(str(value)))
    except (TypeError, ValueError, AttributeError):
        return None


def _percent(done, total) -> int:
    try:
        return max(0, min(100, round(100 * done / total))) if total else 0
    except TypeError:
        return 0


def card(status: dict) -> dict:
    """What one run card shows, read from its `kiln.openenv-run.v5` document (every part optional)."""
    progress = status.get("progress") or {}
    stats = status.get("rollout_stats") or None
    training = status.get("training") if isinstance(status.get("training"), dict) else None
    evaluation = status.get("environment_evaluation") if isinstance(status.get("environment_evaluation"),
                                                                    dict) else None
    training_job = _uuid(status.get("training_job_id") or (training or {}).get("job_id"))
    evidence = (evaluation or {}).get("evidence") if isinstance((evaluation or {}).get("evidence"), dict) else None
    return {
        "status": status,
        "run_id": status.get("run_id"),
        "state": status.get("state"),
        "active": status.get("state") not in TERMINAL,
        "request": status.get("request") or {},
        "progress": progress,
        "groups_percent": _percent(progress.get("groups_completed"), progress.get("groups_total")),
        "stats": stats,
        "terminations": [(name, stats.get(f"{name}_count")) for name in TERMINATIONS
                         if stats.get(f"{name}_count") is not None] if stats else [],
        "job_id": _uuid(status.get("job_id")),
        "training": training,
        "training_job_id": training_job,
        "training_job_label": status.get("training_job_id") or (training or {}).get("job_id"),
        "contract": status.get("training_contract"),
        "evaluation": evaluation,
        "evidence": evidence,
        "evidence_rows": [(k, v) for k, v in (evidence or {}).items() if not isinstance(v, dict | list)],
        "post_evaluations": [p for p in status.get("post_evaluations") or [] if isinstance(p, dict)],
        "warnings": status.get("warnings") or ((status.get("training_selection") or {}).get("warnings") if
                                               isinstance(status.get("training_selection"), dict) else None) or [],
    }


def _with_curves(item: dict) -> dict:
    """The card's trainer curves (loss, reward, KL), read from its training job's metric histories."""
    from core.jobs.selectors import job_get
    from training.fragments import training_curves

    job = job_get(job_id=item["training_job_id"]) if item["training_job_id"] else None
    item["curves"] = [c for c in training_curves(job.metrics or {}) if c["line"].count] if job is not None else []
    return item


def _selection(query) -> dict:
    """Which cards the page shows: `?run=<id>` that run alone, `?before=<sequence>` the page of runs
    older than it, else the newest. A malformed value shows the newest (a stale link, not an error)."""
    run_id = _uuid(query.get("run"))
    if run_id:
        return {"run": run_id}
    before = query.get("before", "")
    return {"before": int(before)} if before.isdigit() else {}


def cards_context(selection: dict | None = None) -> dict:
    from openenv.runs.selectors import run_get, run_owner_ids, run_status, runs_status_list

    selection = selection or {}
    older = None
    if "run" in selection:
        run = run_get(run_id=selection["run"])
        if run is None:
            raise Http404("no such OpenEnv run")
        statuses = [run_status(run)]
    else:
        # one more than a page: whether an older page exists, without a count
        statuses = runs_status_list(limit=CARD_LIMIT + 1, before=selection.get("before"))["runs"]
        if len(statuses) > CARD_LIMIT:
            statuses = statuses[:CARD_LIMIT]
            older = statuses[-1]["admission"]["sequence"]
    cards = [_with_curves(card(status)) for status in statuses]
    # who may cancel: the run document names no user, so the owners are read beside it (QA: every card
    # offered Cancel to users the service then refused with openenv_run_cancel_forbidden)
    owners = run_owner_ids([c["run_id"] for c in cards])
    for c in cards:
        c["owner_id"] = owners.get(str(c["run_id"]))
    # the polling fragment keeps the page's selection, so a refresh does not jump back to the newest
    return {"cards": cards, "any_active": any(c["active"] for c in cards), "older_before": older,
            "selection_query": "".join(f"&{key}={value}" for key, value in selection.items())}


# --- pages --------------------------------------------------------------------------------------

def _published_adapters():
    return [adapter for adapter in adapter_list() if adapter.state == AdapterState.PUBLISHED]


def _render(request, *, values: dict, error: KilnError | None = None, status: int = 200):
    from openenv.runs.request import MIN_GATE_GROUPS

    values = {**values, "idempotency_key": form.new_idempotency_key()}
    context = {
        "values": values,
        "error": error,
        "error_field": form.error_field(error, values) if error else "",
        "can_submit": request.user.has_perm("jobs.submit_job"),
        "no_model": settings.KILN.model_path is None,  # kind train would be refused with 503 mock_mode
        "adapters": _published_adapters(),
        "suites": list(suite_list()),
        "data_scopes": DATA_SCOPES,
        "min_gate_groups": MIN_GATE_GROUPS,
        "credential_handles": _credential_handles(),
        **cards_context(_selection(request.GET)),
        **table_context(jobs_for_table(category="openenv"), category="openenv"),
    }
    return render(request, PAGE, context, status=status)


@login_required
def openenv_page(request):
    """GET: the form and the run cards (`?fragment=runs`: the cards alone). POST: submit a run."""
    if request.method != "POST":
        if request.GET.get("fragment") == "runs":
            return render(request, f"{CARDS}#runs", {**cards_context(_selection(request.GET)),
                                                     "can_submit": request.user.has_perm("jobs.submit_job")})
        return _render(request, values=form.blank_values())
    values = form.form_values(request.POST)
    if not request.user.has_perm("jobs.submit_job"):
        error = KilnError("permission_denied", PERMISSION_TEXT.format(what="start OpenEnv runs"), status=403)
        return _render(request, values=values, error=error, status=403)
    try:
        status, created = run_submit_checked(request=request, body=form.request_body(values))
    except KilnError as exc:
        return _render(request, values=values, error=exc, status=exc.status)
    run_id, state = status["run_id"], status["state"]
    if created:
        messages.success(request, f"OpenEnv run {run_id[:8]} submitted ({state}).")
    else:
        messages.info(request, f"This form was already submitted: run {run_id[:8]} ({state}).")
    return redirect(reverse("ui:training_openenv") + f"#run-{run_id}")


@login_required
@require_GET
def environment_row(request):
    """One more empty environment row for the form (htmx: appended to the rows)."""
    return render(request, ROW, {"row": {"url": "", "credential": "", "reset": ""}, "index": None,
                                 "row_id": uuid.uuid4().hex[:8], "removable": True,
                                 "credential_handles": _credential_handles()})


def _credential_handles() -> list[str]:
    """The `[openenv.credentials.<id>]` handles this server has (never their origins or tokens)."""
    from django.conf import settings

    return sorted(settings.KILN.openenv_credentials)


def _inspected_row(post) -> tuple[str, str | None]:
    """The URL and credential handle of the row whose Inspect was clicked (the whole form is posted,
    rows as aligned lists with their `row_id`; without `row`, the first row)."""
    urls, handles, ids = post.getlist("environment_url"), post.getlist("credential_id"), post.getlist("row_id")
    index = ids.index(post["row"]) if post.get("row") in ids else 0
    chosen = {"url": urls[index] if index < len(urls) else "",
              "credential": handles[index] if index < len(handles) else ""}
    return chosen["url"].strip(), chosen["credential"].strip() or None


@login_required
@require_POST
def inspect_view(request):
    """Inspect one environment row: identity, hashes, schema and the task catalog (`part=catalog` with
    `split` and `start`: one page of tasks). Errors are shown in the fragment (200, so htmx swaps it)."""
    from openenv import api as openenv_api
    from openenv.client.discovery import inspect
    from openenv.client.tasks import task_catalog

    url, handle = _inspected_row(request.POST)
    split = request.POST.get("split", "").strip() or None
    name = request.POST.get("environment_name", "").strip() or None
    part = request.POST.get("part", "")
    context: dict = {"url": url, "split": split, "environment_name": name, "row_id": request.POST.get("row", "")}
    try:
        openenv_api.require_enabled()
        if not request.user.has_perm("jobs.submit_job"):
            raise KilnError("permission_denied", PERMISSION_TEXT.format(what="inspect environments"), status=403)
        if not url:
            raise KilnError("openenv_invalid_request", "request: url: enter the environment's base URL first",
                            status=400, hint="e.g. http://127.0.0.1:8990")
        try:
            start = max(0, int(request.POST.get("start") or 0))
        except ValueError:
            raise KilnError("openenv_invalid_task_page", "request: start must be an integer", status=400) from None
        [endpoint] = openenv_api._endpoints([url])
        [credential] = openenv_api._credentials([handle], [endpoint])
        if part != "catalog":
            context["inspection"] = openenv_api._run(inspect(endpoint, credential=credential),
                                                        "openenv_inspection_failed").to_json()
    except KilnError as exc:
        context["error"] = exc
        return render(request, INSPECTION, context)
    try:
        catalog = openenv_api._run(task_catalog(endpoint, credential=credential, environment_name=name,
                                                split=split, start=start, limit=TASK_PAGE),
                                    "openenv_task_catalog_failed")
        tasks = catalog.get("tasks") or []
        end = start + len(tasks)
        context.update(catalog=catalog, tasks=[json.dumps(t, sort_keys=True, ensure_ascii=False) for t in tasks],
                       catalog_end=end, next_start=end if tasks and end < (catalog.get("num_tasks") or 0) else None)
    except KilnError as exc:
        context["catalog_error"] = exc
    return render(request, f"{INSPECTION}#catalog" if part == "catalog" else INSPECTION, context)


@login_required
@require_POST
def run_cancel_view(request, run_id):
    from openenv.runs.api import require_enabled
    from openenv.runs.selectors import run_get
    from openenv.runs.services import run_cancel

    run = run_get(run_id=str(run_id))
    if run is None:
        raise Http404("no such OpenEnv run")
    try:
        require_enabled()
        if not request.user.has_perm("jobs.submit_job"):
            raise KilnError("permission_denied", PERMISSION_TEXT.format(what="cancel OpenEnv runs"), status=403)
        run = run_cancel(run=run, user=request.user)
    except KilnError as exc:
        messages.error(request, f"{exc.code}: {exc.message}" + (f" ({exc.hint})" if exc.hint else ""))
    else:
        messages.success(request, f"OpenEnv run {str(run.id)[:8]}: " + (
            "cancelled." if run.state == "cancelled" else "cancel requested; it stops at the next boundary."))
    return redirect(reverse("ui:training_openenv") + f"#run-{run.id}")
