"""/v1/openenv/runs: persisted OpenEnv runs (reference-spec §1.6, §4.9-4.12). Web-facing: no torch.

POST validates the body once into `OpenEnvRunRequest` (openenv.runs.request; unknown fields
rejected, 400 `openenv_invalid_request` naming the field), applies the server's own rules
(loopback-only URLs unless allowed, 403; server credential handles, 400; a published adapter,
400), then records the run: 202 a new run, 200 an exact idempotent retry, 409 a changed reuse of
the key, 503 a full tracked map. Admission comes before discovery: nothing here contacts an
environment. A new `kind: "train"` run is first preflighted (openenv.training.preflight: its
refusals keep their training codes) and carries the sealed training contract from its first row.
The steps after the body-size check are one service, `openenv.runs.services.run_create` (the
dashboard's form calls it too). GET lists and reads runs (`kiln.openenv-run.v5`); DELETE cancels one; the artifact route streams a
manifest-bound file after re-checking it on the open descriptor (openenv.runs.downloads).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import StreamingHttpResponse
from ninja import Router, Status

from core.accounts.auth import require_permission
from core.errors import KilnError
from openenv.api_support import check_body_size, documented, json_body
from openenv.runs.request import FIELDS

router = Router(tags=["openenv"])

RUN_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["kind", "environment_urls"],
    "description": "OpenEnvRunRequest (reference-spec §1.6); environments is an alias of environment_urls",
    "properties": {field: {} for field in FIELDS} | {
        "kind": {"enum": ["rollout", "train"]},
        "idempotency_key": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
        "environment_urls": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 64},
        "credential_ids": {"type": "array", "items": {"type": ["string", "null"]}},
        "adapter": {"type": "string", "default": "base"},
        "groups": {"type": "integer", "default": 8}, "group_size": {"type": "integer", "default": 4},
        "seed_start": {"type": "integer", "default": 0}, "reset_options": {"type": "object", "default": {}},
        "environment_reset_options": {"type": "array", "items": {"type": ["object", "null"]}},
        "max_steps": {"type": "integer", "default": 8}, "concurrency": {"type": "integer", "default": 4},
        "max_action_tokens": {"type": "integer", "default": 256}, "temperature": {"type": "number", "default": 1.0},
        "thinking": {"type": "boolean", "default": True}, "thinking_budget_tokens": {"type": ["integer", "null"]},
        "protocol_error_reward": {"type": "number", "default": -1.0},
        "max_recoverable_errors": {"type": "integer", "default": 3},
        "capacity_wait_seconds": {"type": "number", "default": 300},
        "auto_load": {"type": "boolean", "default": True},
    }}
RUN_SCHEMA: dict[str, Any] = {"type": "object", "required": ["schema", "run_id", "kind", "state"],
                              "description": "OpenEnvRunStatus (kiln.openenv-run.v5)"}
LIST_SCHEMA: dict[str, Any] = {"type": "object", "required": ["schema", "runs"],
                               "properties": {"schema": {"const": "kiln.openenv-run-list.v5"},
                                              "runs": {"type": "array", "items": RUN_SCHEMA}}}


OpenEnvRunRequest = documented("OpenEnvRunRequest", RUN_REQUEST_SCHEMA, __name__)
OpenEnvRunStatusOut = documented("OpenEnvRunStatusOut", RUN_SCHEMA, __name__, title="OpenEnvRunStatus")
OpenEnvRunListOut = documented("OpenEnvRunListOut", LIST_SCHEMA, __name__, title="OpenEnvRunList")


def require_enabled() -> None:
    if not settings.KILN.openenv_enabled:
        raise KilnError("openenv_disabled", "OpenEnv is disabled on this server", status=404,
                        hint="set [openenv] enabled = true in kiln.toml (or KILN_OPENENV_ENABLED=true)")


def _run_or_404(run_id: str):
    from openenv.runs.selectors import run_get

    run = run_get(run_id=run_id)
    if run is None:
        raise KilnError("openenv_run_not_found", f"no OpenEnv run {run_id[:64]!r}", status=404,
                        hint="list runs with GET /v1/openenv/runs (kiln openenv runs)")
    return run


@router.get("", summary="OpenEnv runs, newest first", response=OpenEnvRunListOut)
def runs_list(request):
    from openenv.runs.selectors import runs_status_list

    require_enabled()
    return runs_status_list()


@router.post("", summary="Submit an OpenEnv run (202 new, 200 an exact idempotent retry)",
             response={200: OpenEnvRunStatusOut, 202: OpenEnvRunStatusOut})
def runs_create(request, body: OpenEnvRunRequest):
    from openenv.runs.selectors import run_status
    from openenv.runs.services import run_create

    require_enabled()
    require_permission(request, "submit_job")
    check_body_size(request, "an OpenEnv run request")
    raw = json_body(request, "openenv_invalid_request", hint="send one JSON object (OpenEnvRunRequest)")
    run, created = run_create(body=raw, user=request.user)
    return Status(202 if created else 200, run_status(run))


@router.get("/{run_id}", summary="One OpenEnv run's status", response=OpenEnvRunStatusOut)
def runs_get(request, run_id: str):
    from openenv.runs.selectors import run_status

    require_enabled()
    return run_status(_run_or_404(run_id))


@router.delete("/{run_id}", summary="Cancel an OpenEnv run (the current phase stops at its next boundary)",
               response=OpenEnvRunStatusOut)
def runs_cancel(request, run_id: str):
    from openenv.runs.selectors import run_status
    from openenv.runs.services import run_cancel

    require_enabled()
    require_permission(request, "submit_job")
    return run_status(run_cancel(run=_run_or_404(run_id), user=request.user))


@router.get("/{run_id}/artifacts/{kind}", summary="Download a manifest-bound artifact of a run (re-checked)")
def runs_artifact(request, run_id: str, kind: str):
    from openenv.runs.downloads import open_artifact, stream

    require_enabled()
    run = _run_or_404(run_id)
    fd, entry = open_artifact(run, kind)
    extension = "jsonl" if entry["file"].endswith(".jsonl") else "json"
    response = StreamingHttpResponse(stream(fd, entry["bytes"]),
                                     content_type="application/x-ndjson" if extension == "jsonl"
                                     else "application/json")
    response["Content-Length"] = str(entry["bytes"])
    response["ETag"] = f'"{entry["sha256"]}"'
    response["Cache-Control"] = "private, no-store"
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Disposition"] = f'attachment; filename="openenv-{run.id}-{kind}.{extension}"'
    return response
