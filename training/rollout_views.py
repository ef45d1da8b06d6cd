"""Dashboard Training → Rollouts (/ui/training/rollouts/): generate scored rollouts, register scorers,
download a run's files, and train on them with one click.

The views only move form fields and uploads into the services (training.rollout_services,
evaluations.services) and render what the selectors read; a KilnError is shown next to the field
it names and nothing is queued or stored. Web-facing: never imports torch, transformers, peft or
gpu_runtime (the services reach the pure `core.contracts.provenance` through `evaluations.generation`).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from adapters.models import AdapterState
from adapters.selectors import adapter_list
from core.errors import KilnError
from core.jobs import fragments
from core.jobs.selectors import job_get
from evaluations import rollout_selectors
from evaluations.rollout_services import MAX_CONCURRENCY, MAX_SEEDS, ROUTE, rollouts_submit
from evaluations.selectors import scorer_list
from evaluations.services import scorer_register
from training.rollout_services import rollouts_train_submit

PERMISSION_TEXT = ("You lack the submit_job permission, so you cannot {what}. "
                   "An administrator can grant it in /admin/ (Users → permissions).")
TEXT_FIELDS = ("scorer", "adapter", "seeds", "seed_start", "thinking_budget_tokens", "concurrency", "request_json")
SCORER_FIELDS = ("scorer_name", "scorer_description")
FORM_FIELDS = ("tasks", "request_template", "scorer", "adapter", "seeds", "seed_start", "thinking",
               "thinking_budget_tokens", "concurrency")


def _blank_values() -> dict:
    return {"scorer": "", "adapter": "base", "seeds": "4", "seed_start": "0", "thinking_budget_tokens": "",
            "concurrency": "4", "request_json": "", "thinking": False, "scorer_name": "", "scorer_description": ""}


def _published_adapters():
    return [adapter for adapter in adapter_list() if adapter.state == AdapterState.PUBLISHED]


def _error_field(error: KilnError | None, fields) -> str:
    field = (error.field or "") if error else ""
    return field if field in fields else ""


def _render(request, *, values: dict, error: KilnError | None = None, scorer_error: KilnError | None = None,
            forbidden: str = "", status: int = 200):
    context = {
        "values": values,
        "error": error,
        "error_field": _error_field(error, FORM_FIELDS),
        "scorer_error": scorer_error,
        "scorer_error_field": {"name": "scorer_name", "file": "scorer_file",
                               "description": "scorer_description"}.get(scorer_error.field or "", "")
        if scorer_error else "",
        "forbidden": forbidden,
        "scorers": list(scorer_list()),
        "adapters": _published_adapters(),
        "can_submit": request.user.has_perm("jobs.submit_job"),
        "no_model": settings.KILN.model_path is None,  # generation would be refused with 503 mock_mode
        "max_seeds": MAX_SEEDS,
        "max_concurrency": MAX_CONCURRENCY,
        "recent": rollout_selectors.rollout_jobs(),
    }
    return render(request, "ui/training_rollouts.html", context, status=status)


def _upload_bytes(files, name: str) -> tuple[bytes | None, str]:
    upload = files.get(name)
    if upload is None:
        return None, ""
    return upload.read(), upload.name


@login_required
def rollouts_page(request):
    if request.method != "POST":
        values = _blank_values()
        if request.GET.get("scorer"):
            values["scorer"] = request.GET["scorer"]
        return _render(request, values=values)
    values = {**_blank_values(), **{name: request.POST.get(name, "") for name in TEXT_FIELDS},
              "thinking": request.POST.get("thinking") in ("on", "true", "1")}
    if not request.user.has_perm("jobs.submit_job"):
        return _render(request, values=values, forbidden=PERMISSION_TEXT.format(what="generate rollouts"), status=403)
    tasks, tasks_name = _upload_bytes(request.FILES, "tasks_file")
    template, template_name = _upload_bytes(request.FILES, "request_file")
    try:
        job = rollouts_submit(
            tasks=tasks, tasks_filename=tasks_name, template_upload=template, template_text=values["request_json"],
            template_filename=template_name or "request.json (pasted)", scorer=values["scorer"],
            adapter=values["adapter"], seeds=values["seeds"], seed_start=values["seed_start"],
            thinking=values["thinking"], thinking_budget_tokens=values["thinking_budget_tokens"] or None,
            concurrency=values["concurrency"], user=request.user, route=ROUTE)
    except KilnError as exc:
        return _render(request, values=values, error=exc, status=exc.status)
    return redirect("ui:job_detail", job_id=job.uuid)


@login_required
@require_POST
def scorer_register_view(request):
    values = {**_blank_values(), **{name: request.POST.get(name, "") for name in SCORER_FIELDS}}
    if not request.user.has_perm("jobs.submit_job"):
        return _render(request, values=values, forbidden=PERMISSION_TEXT.format(what="register scorers"), status=403)
    upload = request.FILES.get("scorer_file")
    try:
        if upload is None:
            raise KilnError("scorer_invalid", "file: choose the scorer script to upload", status=400, field="file")
        scorer = scorer_register(name=values["scorer_name"].strip(), filename=upload.name, content=upload.read(),
                                 description=values["scorer_description"], user=request.user)
    except KilnError as exc:
        return _render(request, values=values, scorer_error=exc, status=exc.status)
    messages.success(request, f"Registered scorer {scorer.name} ({scorer.sha256[:19]}…). It runs in the sandbox.")
    return redirect(f"{ROUTE}?scorer={scorer.name}")


def _rollouts_job_or_404(job_id):
    job = job_get(job_id=str(job_id))
    if not rollout_selectors.is_rollouts_job(job):
        raise Http404("no such rollouts job")
    return job


@login_required
@require_GET
def rollout_file_view(request, job_id, name):
    job = _rollouts_job_or_404(job_id)
    path = rollout_selectors.rollout_file(job=job, name=name)
    if path is None:
        raise Http404("no such file for this job")
    response = FileResponse(open(path, "rb"), as_attachment=True,
                            filename=f"rollouts-{str(job.uuid)[:8]}-{name}",
                            content_type=rollout_selectors.DOWNLOADS[name])
    return response


@login_required
@require_POST
def rollouts_train_view(request, job_id):
    job = _rollouts_job_or_404(job_id)
    output_name = request.POST.get("output_name", "")
    context = {**fragments.job_detail_context(job), "train_values": {"output_name": output_name}}
    if not request.user.has_perm("jobs.submit_job"):
        context["forbidden"] = PERMISSION_TEXT.format(what="start training")
        return render(request, "ui/jobs/detail.html", context, status=403)
    try:
        training_job = rollouts_train_submit(job=job, output_name=output_name, user=request.user, route=ROUTE)
    except KilnError as exc:
        return render(request, "ui/jobs/detail.html", {**context, "train_error": exc}, status=exc.status)
    return redirect("ui:job_detail", job_id=training_job.uuid)
