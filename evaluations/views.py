"""Dashboard pages of evaluations (/ui/evaluations/): the hub, datasets (upload, re-split with a
preview, rows, synthesis of a suite, delete), eval suites (create from JSON, examples, delete) and
the evaluation jobs: the Jobs tab (state, mode, suite, targets, accuracy, progress), the compare
view of one job (targets side by side per example, with the completions) and the suite page's
"Run evaluation" form (evaluations.eval_services.eval_submit).

The views only move form fields and uploads into the services (evaluations.dataset_services,
evaluations.suite_services; the form text to body translation is evaluations.forms) and render what
the selectors read. A KilnError is shown next to the field it names with its stable code, and
nothing is written. Writes need the submit_job permission, as on /v1/eval; deleting another user's
dataset or suite also needs jobs.delete_others_jobs (the services decide). Web-facing: never imports
torch, transformers, peft or gpu_runtime.
"""

from __future__ import annotations

import json

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from core.errors import KilnError
from core.jobs.fragments import jobs_for_table, table_context
from evaluations import (
    dataset_selectors,
    dataset_services,
    eval_selectors,
    eval_services,
    forms,
    suite_selectors,
    suite_services,
)
from evaluations.datasets.formats import FORMATS
from evaluations.datasets.split import PARTITIONS
from evaluations.datasets.synthesize import PROVENANCE_KEY, STRATEGIES
from evaluations.example_scorers import SCORER_TYPES

PERMISSION_TEXT = ("You lack the submit_job permission, so you cannot {what}. "
                   "An administrator can grant it in /admin/ (Users → permissions).")
FORMAT_HINTS = {
    "grpo_groups": "one GRPO group per line: messages and scored completions (trainable with GRPO)",
    "sft_chat": "one chat per line: messages ending with the assistant's answer",
    "raw": "any JSON object per line (messages or a prompt, and a reference/answer/target)",
}
ROWS_PAGE = 50
EXAMPLES_PAGE = 100
PREVIEW_CHARS = 240


def _can_submit(request) -> bool:
    return request.user.has_perm("jobs.submit_job")


def _forbidden(request, what: str) -> str:
    return "" if _can_submit(request) else PERMISSION_TEXT.format(what=what)


def _delete_refusal(check) -> KilnError | None:
    """Why the service would refuse this user's delete or re-split (another user's object, without
    jobs.delete_others_jobs), so the page disables its button and says so; None: allowed."""
    try:
        check()
    except KilnError as exc:
        return exc
    return None


def _offset(request) -> int:
    try:
        return max(0, int(request.GET.get("offset", "0")))
    except ValueError:
        return 0


def _pager(offset: int, limit: int, total: int) -> dict:
    return {"offset": offset, "limit": limit, "total": total, "first": offset + 1 if total else 0,
            "last": min(offset + limit, total), "previous": max(0, offset - limit) if offset else None,
            "next": offset + limit if offset + limit < total else None}


# ---- the hub -----------------------------------------------------------------------------------

@login_required
def evaluations(request):
    """Datasets and suites at a glance, and the evaluation jobs with their live progress."""
    context = {
        **table_context(jobs_for_table(category="evaluation"), category="evaluation"),
        "datasets": list(dataset_selectors.dataset_list()),
        "suites": list(suite_selectors.suite_list()),
        "tab": "hub",
    }
    return render(request, "ui/evaluations.html", context)


# ---- datasets ----------------------------------------------------------------------------------

def _datasets_render(request, *, values: dict, error: KilnError | None = None, forbidden: str = "",
                     status: int = 200):
    context = {
        "tab": "datasets",
        "datasets": list(dataset_selectors.dataset_list()),
        "values": values,
        "error": error,
        "error_field": forms.upload_error_field(error) if error else "",
        "forbidden": forbidden,
        "formats": [(fmt, FORMAT_HINTS[fmt]) for fmt in FORMATS],
        "can_submit": _can_submit(request),
        "partitions": PARTITIONS,
    }
    return render(request, "ui/evaluations/datasets.html", context, status=status)


@login_required
def datasets_page(request):
    """GET: the datasets with their split counts and the upload form. POST: upload one."""
    if request.method != "POST":
        return _datasets_render(request, values=forms.blank_upload())
    values = forms.upload_values(request.POST)
    if not _can_submit(request):
        return _datasets_render(request, values=values, forbidden=_forbidden(request, "upload datasets"),
                                status=403)
    try:
        upload = request.FILES.get("file")
        if upload is None:
            raise forms.form_error("choose the JSONL file to upload", "file")
        dataset = dataset_services.dataset_upload(name=values["name"].strip(), fmt=values["format"],
                                                  description=values["description"],
                                                  content=forms.upload_bytes(upload, "file"), user=request.user)
    except KilnError as exc:
        return _datasets_render(request, values=values, error=exc, status=exc.status)
    counts = dataset.split_counts
    messages.success(request, f"Uploaded dataset {dataset.name}: {dataset.rows} rows, split "
                     f"{counts.get('train', 0)} train / {counts.get('validation', 0)} validation / "
                     f"{counts.get('holdout', 0)} holdout.")
    return redirect("ui:evaluation_dataset", name=dataset.name)


def _dataset_or_404(name: str):
    dataset = dataset_selectors.dataset_get(name=name)
    if dataset is None:
        raise Http404("no such dataset")
    return dataset


def _row_view(entry: dict) -> dict:
    text = json.dumps(entry["data"], ensure_ascii=False, separators=(",", ":"))
    return {"row": entry["row"], "partition": entry["partition"], "preview": text[:PREVIEW_CHARS],
            "truncated": len(text) > PREVIEW_CHARS, "full": json.dumps(entry["data"], ensure_ascii=False, indent=2)}


def _dataset_render(request, dataset, *, split_values: dict | None = None, split_error: KilnError | None = None,
                    preview: dict | None = None, synth_values: dict | None = None,
                    synth_error: KilnError | None = None, delete_error: KilnError | None = None,
                    forbidden: str = "", status: int = 200):
    strategies = STRATEGIES.get(dataset.format, ())
    partition = request.GET.get("partition") or None
    rows_error = ""
    if partition is not None and partition not in PARTITIONS:
        rows_error = f"partition must be one of {', '.join(PARTITIONS)}, not {partition!r}; showing every row"
        partition = None
    manifest, rows, read_error = None, None, None
    try:
        manifest = dataset_selectors.dataset_manifest(dataset=dataset)
        rows = dataset_selectors.dataset_rows(dataset=dataset, offset=_offset(request), limit=ROWS_PAGE,
                                              partition=partition)
    except KilnError as exc:
        read_error = exc
    context = {
        "tab": "datasets",
        "dataset": dataset,
        "manifest": manifest,
        "read_error": read_error,
        "rows": [_row_view(entry) for entry in rows["rows"]] if rows else [],
        "pager": _pager(rows["offset"], rows["limit"], rows["total"]) if rows else None,
        "partition": partition or "",
        "rows_error": rows_error,
        "partitions": PARTITIONS,
        "split_values": split_values or forms.split_values(current=dataset.split_config),
        "split_error": split_error,
        "split_error_field": forms.split_error_field(split_error) if split_error else "",
        "preview": preview,
        "synth_values": synth_values or forms.blank_synth(strategies[0] if strategies else ""),
        "synth_error": synth_error,
        "synth_error_field": forms.synth_error_field(synth_error) if synth_error else "",
        "strategies": strategies,
        "scorer_types": SCORER_TYPES,
        "delete_error": delete_error,
        "delete_refusal": _delete_refusal(lambda: dataset_services.dataset_check_delete(dataset=dataset,
                                                                                        user=request.user)),
        "split_refusal": _delete_refusal(lambda: dataset_services.dataset_check_split(dataset=dataset,
                                                                                      user=request.user)),
        "forbidden": forbidden,
        "can_submit": _can_submit(request),
        "suites_from_here": [s for s in suite_selectors.suite_list() if (s.source or {}).get("dataset") == dataset.name],
    }
    return render(request, "ui/evaluations/dataset_detail.html", context, status=status)


@login_required
def dataset_page(request, name):
    return _dataset_render(request, _dataset_or_404(name))


@login_required
@require_POST
def dataset_split_view(request, name):
    """Preview (counts only, nothing written) or Apply (re-split and republish) a split config."""
    dataset = _dataset_or_404(name)
    values = forms.split_values(request.POST)
    apply = request.POST.get("action") == "apply"
    if apply and not _can_submit(request):
        return _dataset_render(request, dataset, split_values=values, status=403,
                               forbidden=_forbidden(request, "re-split datasets"))
    try:
        if not apply:
            preview = dataset_services.dataset_split_preview(dataset=dataset, config=forms.split_config(values))
            return _dataset_render(request, dataset, split_values=values, preview=preview)
        dataset = dataset_services.dataset_split_update(dataset=dataset, config=forms.split_config(values),
                                                        user=request.user)
    except KilnError as exc:
        return _dataset_render(request, dataset, split_values=values, split_error=exc, status=exc.status)
    counts = dataset.split_counts
    messages.success(request, f"Re-split {dataset.name} with seed {dataset.split_config['seed']}: "
                     f"{counts['train']} train / {counts['validation']} validation / {counts['holdout']} holdout.")
    return redirect("ui:evaluation_dataset", name=dataset.name)


@login_required
@require_POST
def dataset_synthesize_view(request, name):
    """Create (or with force replace) an eval suite from one partition of the dataset."""
    dataset = _dataset_or_404(name)
    values = forms.synth_values(request.POST)
    if not _can_submit(request):
        return _dataset_render(request, dataset, synth_values=values, status=403,
                               forbidden=_forbidden(request, "create suites"))
    try:
        suite = dataset_services.dataset_synthesize(dataset=dataset, body=forms.synth_body(values), user=request.user)
    except KilnError as exc:
        return _dataset_render(request, dataset, synth_values=values, synth_error=exc, status=exc.status)
    messages.success(request, f"Created suite {suite.name} with {suite.examples} example"
                     f"{'' if suite.examples == 1 else 's'} from the "
                     f"{values['source_split'] or 'holdout'} partition of {dataset.name}.")
    return redirect("ui:evaluation_suite", name=suite.name)


@login_required
@require_POST
def dataset_delete_view(request, name):
    dataset = _dataset_or_404(name)
    if not _can_submit(request):
        return _dataset_render(request, dataset, status=403, forbidden=_forbidden(request, "delete datasets"))
    if not forms.checked(request.POST, "confirm"):
        error = forms.form_error("tick the box to confirm that the dataset and its files are deleted", "confirm")
        return _dataset_render(request, dataset, delete_error=error, status=400)
    try:
        dataset_services.dataset_delete(dataset=dataset, user=request.user)
    except KilnError as exc:  # another user's dataset (dataset_delete_forbidden): nothing was deleted
        return _dataset_render(request, dataset, delete_error=exc, status=exc.status)
    messages.success(request, f"Deleted dataset {name} and its files.")
    return redirect("ui:evaluation_datasets")


# ---- suites ------------------------------------------------------------------------------------

def _suites_render(request, *, values: dict, error: KilnError | None = None, forbidden: str = "",
                   status: int = 200):
    context = {
        "tab": "suites",
        "suites": list(suite_selectors.suite_list()),
        "values": values,
        "error": error,
        "forbidden": forbidden,
        "can_submit": _can_submit(request),
    }
    return render(request, "ui/evaluations/suites.html", context, status=status)


@login_required
def suites_page(request):
    """GET: the suites and the create form. POST: register a suite from pasted JSON or a file."""
    if request.method != "POST":
        return _suites_render(request, values={"suite_json": "", "force": False})
    values = {"suite_json": request.POST.get("suite_json", ""), "force": forms.checked(request.POST, "force")}
    if not _can_submit(request):
        return _suites_render(request, values=values, forbidden=_forbidden(request, "create suites"), status=403)
    try:
        body = forms.suite_body(values["suite_json"], request.FILES.get("suite_file"))
        suite = suite_services.suite_store(body=body, force=values["force"], user=request.user)
    except KilnError as exc:
        return _suites_render(request, values=values, error=exc, status=exc.status)
    messages.success(request, f"Registered suite {suite.name} ({suite.examples} examples).")
    return redirect("ui:evaluation_suite", name=suite.name)


def _suite_or_404(name: str):
    suite = suite_selectors.suite_get(name=name)
    if suite is None:
        raise Http404("no such suite")
    return suite


def _last_user_message(messages_: list) -> str:
    for message in reversed(messages_ or []):
        if isinstance(message, dict) and message.get("role") == "user":
            return message.get("content") or ""
    return ""


def _example_view(example: dict) -> dict:
    provenance = (example.get("metadata") or {}).get(PROVENANCE_KEY) or {}
    return {"id": example["id"], "prompt": _last_user_message(example.get("messages")),
            "turns": len(example.get("messages") or []), "target": example.get("target"),
            "has_target": "target" in example, "scorer": example.get("scorer"),
            "provenance": provenance if isinstance(provenance, dict) else {}}


def _suite_render(request, suite, *, error: KilnError | None = None, forbidden: str = "", status: int = 200,
                  run_values: dict | None = None, run_error: KilnError | None = None):
    document, read_error = None, None
    try:
        document = suite_selectors.suite_document(suite=suite)
    except KilnError as exc:
        read_error = exc
    examples = (document or {}).get("examples") or []
    offset = _offset(request)
    context = {
        "tab": "suites",
        "suite": suite,
        "document": document,
        "read_error": read_error,
        "examples": [_example_view(e) for e in examples[offset:offset + EXAMPLES_PAGE]],
        "pager": _pager(offset, EXAMPLES_PAGE, len(examples)),
        "delete_error": error,
        "delete_refusal": _delete_refusal(lambda: suite_services.suite_check_delete(suite=suite, user=request.user)),
        "forbidden": forbidden,
        "can_submit": _can_submit(request),
        "run_values": run_values or forms.blank_run(),
        "run_error": run_error,
        "run_error_field": forms.run_error_field(run_error) if run_error else "",
        "target_choices": eval_selectors.eval_target_choices(),
    }
    return render(request, "ui/evaluations/suite_detail.html", context, status=status)


@login_required
def suite_page(request, name):
    return _suite_render(request, _suite_or_404(name))


@login_required
@require_POST
def suite_delete_view(request, name):
    suite = _suite_or_404(name)
    if not _can_submit(request):
        return _suite_render(request, suite, status=403, forbidden=_forbidden(request, "delete suites"))
    if not forms.checked(request.POST, "confirm"):
        error = forms.form_error("tick the box to confirm that the suite is deleted", "confirm")
        return _suite_render(request, suite, error=error, status=400)
    try:
        suite_services.suite_delete(suite=suite, user=request.user)
    except KilnError as exc:  # another user's suite (suite_delete_forbidden): nothing was deleted
        return _suite_render(request, suite, error=exc, status=exc.status)
    messages.success(request, f"Deleted suite {name}.")
    return redirect("ui:evaluation_suites")


@login_required
@require_POST
def suite_run_view(request, name):
    """Queue an eval job of this suite: one target is a run, two to eight a compare (paired by example)."""
    suite = _suite_or_404(name)
    values = forms.run_values(request.POST)
    if not _can_submit(request):
        return _suite_render(request, suite, run_values=values, status=403,
                             forbidden=_forbidden(request, "run evaluations"))
    try:
        mode, body = forms.run_request(values, suite_name=suite.name)
        job = eval_services.eval_submit(body=body, mode=mode, user=request.user)
    except KilnError as exc:
        return _suite_render(request, suite, run_values=values, run_error=exc, status=exc.status)
    messages.success(request, f"Queued {job.title}.")
    return redirect("ui:job_detail", job_id=job.uuid)


# ---- eval jobs ---------------------------------------------------------------------------------

@login_required
def eval_jobs_page(request):
    """Evaluations → Jobs: every eval job with its mode, suite, targets, accuracy and progress. While a
    job is queued or running the table body re-reads itself (`?fragment=rows`) every few seconds."""
    rows = eval_selectors.eval_job_rows()
    context = {"tab": "jobs", "rows": rows, "active": any(not row["job"].is_terminal for row in rows)}
    if request.GET.get("fragment") == "rows":
        return render(request, "ui/evaluations/jobs.html#eval_jobs_body", context)
    return render(request, "ui/evaluations/jobs.html", context)


@login_required
def eval_compare_page(request, job_id):
    """One eval job's targets side by side: a row per example id, each target's outcome and completion."""
    job = eval_selectors.eval_job_get(job_id=str(job_id))
    if job is None:
        raise Http404("no such eval job")
    differing = request.GET.get("show") == "differing"
    compare = eval_selectors.eval_compare(job, differing_only=differing, offset=_offset(request))
    context = {"tab": "jobs", "job": job, "compare": compare, "show": "differing" if differing else "all",
               "pager": _pager(compare["offset"], compare["limit"], compare["rows_total"])}
    return render(request, "ui/evaluations/compare.html", context)
