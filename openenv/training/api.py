"""POST /v1/openenv/training/preflight (reference-spec §1.6). Web-facing: no torch.

The body (`adapter` [base], `output_adapter`, `training_config`, `auto_load` [true], `post_eval`;
unknown fields rejected) is checked by openenv.training.preflight, which answers the
`kiln.openenv-training-preflight.v1` receipt with the sealed `kiln.openenv-training-contract.v1`.
Failures use the training codes (400 `training_invalid_request`, 503 `mock_mode`, 503
`training_queue_full`, ...). Nothing is reserved and no environment is contacted.
"""

from __future__ import annotations

import json
from typing import Any

from ninja import Router
from pydantic import BaseModel, ConfigDict

from core.accounts.auth import require_permission
from core.errors import KilnError

router = Router(tags=["openenv"])

MAX_BODY_BYTES = 1024 * 1024
PREFLIGHT_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object", "additionalProperties": False, "required": ["output_adapter"],
    "description": "OpenEnvTrainingPreflightRequest (reference-spec §1.6)",
    "properties": {"adapter": {"type": "string", "default": "base"}, "output_adapter": {"type": "string"},
                   "training_config": {"type": ["object", "null"], "description": "GrpoConfig"},
                   "auto_load": {"type": "boolean", "default": True},
                   "post_eval": {"type": ["object", "null"], "description": "PostEvalConfig"}}}
PREFLIGHT_RECEIPT_SCHEMA: dict[str, Any] = {
    "type": "object", "description": "OpenEnvTrainingPreflightReceipt (kiln.openenv-training-preflight.v1)",
    "required": ["schema", "effective_config", "behavior_policy", "capacity", "capacity_reserved",
                 "training_contract", "training_contract_sha256"]}


class _Documented(BaseModel):
    model_config = ConfigDict(extra="allow")


class PreflightRequest(_Documented):
    model_config = ConfigDict(extra="allow", title="OpenEnvTrainingPreflightRequest",
                              json_schema_extra=lambda schema, cls: schema.update(PREFLIGHT_REQUEST_SCHEMA))


class PreflightReceipt(_Documented):
    model_config = ConfigDict(extra="allow", title="OpenEnvTrainingPreflightReceipt",
                              json_schema_extra=lambda schema, cls: schema.update(PREFLIGHT_RECEIPT_SCHEMA))


@router.post("/preflight", summary="Seal the training contract of an OpenEnv train run (nothing is reserved)",
             response=PreflightReceipt)
def training_preflight_route(request, body: PreflightRequest):
    from openenv.runs.api import require_enabled
    from openenv.training.preflight import preflight_request, training_preflight

    require_enabled()
    require_permission(request, "submit_job")
    if len(request.body) > MAX_BODY_BYTES:
        raise KilnError("request_too_large", f"a preflight request may hold at most {MAX_BODY_BYTES} bytes",
                        status=413, hint="send a smaller JSON object")
    try:
        value = json.loads(request.body)
    except ValueError:
        raise KilnError("training_invalid_request", "request: is not JSON", status=400) from None
    return training_preflight(**preflight_request(value))
