"""/v1/eval/*: datasets with their splits, eval suites, and eval jobs (run, compare, rerun, replay)
(spec §1.3, §1.4).

Web-facing: no torch. Handlers only call services (writes) and selectors (reads); the rules are
the pure modules evaluations.datasets.* and evaluations.suites.
"""

from __future__ import annotations

from django.conf import settings
from ninja import File, Form, Router, UploadedFile

from core.accounts.auth import require_permission
from core.errors import KilnError
from evaluations import (
    dataset_selectors,
    dataset_services,
    eval_selectors,
    eval_services,
    suite_selectors,
    suite_services,
)
from evaluations.datasets.split import PARTITIONS
from evaluations.eval_payloads import EvalJobPayload
from evaluations.schemas import (
    DatasetManifest,
    DatasetRows,
    Deleted,
    EvalCompareRequest,
    EvalJobDeleted,
    EvalJobSummary,
    EvalReplayRequest,
    EvalRerunRequest,
    EvalResult,
    EvalRunRequest,
    EvalRunResponse,
    SplitPreview,
    SplitRequest,
    SuiteDetail,
    SuiteRequest,
    SuiteSummary,
    SynthesizeRequest,
)

router = Router(tags=["evals"])


def _dataset_or_404(name: str):
    dataset = dataset_selectors.dataset_get(name=name)
    if dataset is None:
        raise KilnError("dataset_not_found", f"no dataset named {name!r}", status=404,
                        hint="list datasets with GET /v1/eval/datasets")
    return dataset


def _suite_or_404(name: str):
    suite = suite_selectors.suite_get(name=name)
    if suite is None:
        raise KilnError("eval_suite_not_found", f"no eval suite named {name!r}", status=404,
                        hint="list suites with GET /v1/eval/suites")
    return suite


@router.post("/datasets/upload", summary="Upload a JSONL dataset and split it", response=DatasetManifest)
def dataset_upload(request, name: str | None = Form(None), format: str | None = Form(None),
                   description: str = Form(""), file: UploadedFile | None = File(None)):  # noqa: B008
    require_permission(request, "submit_job")
    if file is None:
        raise dataset_services.invalid("a JSONL file is required (multipart field file)", "file")
    limit = settings.KILN.max_request_bytes
    if file.size is not None and file.size > limit:
        raise KilnError("request_too_large", f"file: the file is {file.size} bytes; an upload may hold at most "
                        f"{limit}", status=413, hint="raise KILN_MAX_REQUEST_BYTES, or split the file")
    dataset = dataset_services.dataset_upload(name=name, fmt=format, description=description,
                                              content=file.read(), user=request.user)
    return dataset_selectors.dataset_manifest(dataset=dataset)


@router.get("/datasets", summary="List datasets with their split counts", response=list[DatasetManifest])
def dataset_list(request):
    return [dataset_selectors.dataset_manifest(dataset=d) for d in dataset_selectors.dataset_list()]


@router.get("/datasets/{name}", summary="One dataset's manifest", response=DatasetManifest)
def dataset_get(request, name: str):
    return dataset_selectors.dataset_manifest(dataset=_dataset_or_404(name))


@router.delete("/datasets/{name}", summary="Delete a dataset (its folder and row)", response=Deleted)
def dataset_delete(request, name: str):
    require_permission(request, "submit_job")
    dataset_services.dataset_delete(dataset=_dataset_or_404(name), user=request.user)
    return {"name": name, "status": "deleted"}


@router.get("/datasets/{name}/rows", summary="A page of a dataset's rows", response=DatasetRows)
def dataset_rows(request, name: str, offset: int = 0, limit: int = 100, partition: str | None = None):
    dataset = _dataset_or_404(name)
    if partition is not None and partition not in PARTITIONS:
        raise dataset_services.invalid(f"must be one of {', '.join(PARTITIONS)}", "partition")
    if offset < 0 or limit < 1:
        raise dataset_services.invalid("offset must be ≥ 0 and limit ≥ 1", "offset")
    return dataset_selectors.dataset_rows(dataset=dataset, offset=offset, limit=limit, partition=partition)


@router.get("/datasets/{name}/split", summary="The dataset's split manifest (every row's identity and partition)")
def dataset_split(request, name: str):
    return dataset_selectors.dataset_split_manifest(dataset=_dataset_or_404(name))


@router.put("/datasets/{name}/split", summary="Re-split the dataset with a new seed and percentages",
            response=DatasetManifest)
def dataset_split_update(request, name: str, body: SplitRequest):
    require_permission(request, "submit_job")
    dataset = dataset_services.dataset_split_update(dataset=_dataset_or_404(name), config=body.as_dict(),
                                                   user=request.user)
    return dataset_selectors.dataset_manifest(dataset=dataset)


@router.post("/datasets/{name}/preview", summary="The counts a split config would give (writes nothing)",
             response=SplitPreview)
def dataset_preview(request, name: str, body: SplitRequest):
    return dataset_services.dataset_split_preview(dataset=_dataset_or_404(name), config=body.as_dict())


@router.post("/datasets/{name}/synthesize", summary="Create an eval suite from one partition's rows",
             response=SuiteSummary)
def dataset_synthesize(request, name: str, body: SynthesizeRequest):
    require_permission(request, "submit_job")
    suite = dataset_services.dataset_synthesize(dataset=_dataset_or_404(name), body=body.as_dict(),
                                                user=request.user)
    return suite_selectors.suite_summary(suite)


@router.post("/suites", summary="Register an eval suite (force=true replaces one of the same name)",
             response=SuiteSummary)
def suite_create(request, body: SuiteRequest, force: bool = False):
    require_permission(request, "submit_job")
    suite = suite_services.suite_store(body=body.as_dict(), force=force, user=request.user)
    return suite_selectors.suite_summary(suite)


@router.get("/suites", summary="List eval suites", response=list[SuiteSummary])
def suite_list(request):
    return [suite_selectors.suite_summary(s) for s in suite_selectors.suite_list()]


@router.get("/suites/{name}", summary="One eval suite with its examples", response=SuiteDetail)
def suite_get(request, name: str):
    return suite_selectors.suite_document(suite=_suite_or_404(name))


@router.delete("/suites/{name}", summary="Delete an eval suite", response=Deleted)
def suite_delete(request, name: str):
    require_permission(request, "submit_job")
    suite_services.suite_delete(suite=_suite_or_404(name), user=request.user)
    return {"name": name, "status": "deleted"}


# -- eval jobs --------------------------------------------------------------------------------

def _queued(job) -> dict:
    payload = EvalJobPayload.of(job)
    return {"job_id": str(job.uuid), "state": job.state, "mode": payload.mode, "suite_name": payload.suite["name"],
            "suite_hash": payload.suite["suite_hash"], "effective_generation_hash": payload.effective_generation_hash,
            "seed": str(payload.generation["seed"]), "targets": [t["adapter"] for t in payload.targets],
            "origin_job_id": (payload.origin or {}).get("job_id")}


def _eval_job_or_404(job_id: str):
    job = eval_selectors.eval_job_get(job_id=job_id)
    if job is None:
        raise KilnError("eval_job_not_found", f"no eval job with id {job_id!r}", status=404,
                        hint="list eval jobs with GET /v1/eval/jobs")
    return job


@router.post("/run", summary="Queue an eval job: one suite (registered or inline) against one target",
             response=EvalRunResponse)
def eval_run(request, body: EvalRunRequest):
    require_permission(request, "submit_job")
    return _queued(eval_services.eval_submit(body=body.as_dict(), mode="run", user=request.user))


@router.post("/compare", summary="Queue a compare job: one suite against up to 8 targets, paired by example id",
             response=EvalRunResponse)
def eval_compare(request, body: EvalCompareRequest):
    require_permission(request, "submit_job")
    return _queued(eval_services.eval_submit(body=body.as_dict(), mode="compare", user=request.user))


@router.get("/jobs", summary="Eval jobs, newest first", response=list[EvalJobSummary])
def eval_jobs(request, limit: int = 200):
    if not 1 <= limit <= 1000:
        raise eval_services.invalid("must be between 1 and 1000", "limit")
    return [eval_selectors.eval_summary(job) for job in eval_selectors.eval_jobs(limit=limit)]


@router.get("/jobs/{job_id}", summary="One eval job: state, counts, accuracy, per-example outcomes and completions",
            response=EvalResult)
def eval_job(request, job_id: str, examples: bool = True):
    """`examples=false` leaves out the per-example records and the outcome table (the counts stay)."""
    return eval_selectors.eval_result(_eval_job_or_404(job_id), include_examples=examples)


@router.delete("/jobs/{job_id}", summary="Cancel a queued or running eval job; delete a finished one",
               response=EvalJobDeleted)
def eval_job_delete(request, job_id: str):
    require_permission(request, "submit_job")
    status = eval_services.eval_cancel_or_delete(job=_eval_job_or_404(job_id), user=request.user)
    return {"job_id": job_id, "status": status}


@router.post("/jobs/{job_id}/rerun", summary="A new eval job over the examples with the selected outcome kinds",
             response=EvalRunResponse)
def eval_job_rerun(request, job_id: str, body: EvalRerunRequest | None = None):
    require_permission(request, "submit_job")
    job = eval_services.eval_rerun(job=_eval_job_or_404(job_id), body=body.as_dict() if body else {},
                                   user=request.user)
    return _queued(job)


@router.post("/jobs/{job_id}/replay", summary="Strict replay of a completed eval job (matched | mismatch | error)",
             response=EvalRunResponse)
def eval_job_replay(request, job_id: str, body: EvalReplayRequest | None = None):
    require_permission(request, "submit_job")
    extra = sorted(body.as_dict()) if body else []
    if extra:
        raise eval_services.invalid("a strict replay takes no options", extra[0])
    return _queued(eval_services.eval_replay(job=_eval_job_or_404(job_id), user=request.user))
