"""POST /v1/openenv/training/preflight (reference-spec §1.6). Web-facing: no torch.

The body (`adapter` [base], `output_adapter`, `training_config`, `auto_load` [true], `post_eval`;
unknown fields rejected) is checked by openenv.training.preflight, which answers the
`kiln.openenv-training-preflight.v1` receipt with the sealed `kiln.openenv-training-contract.v1`.
Failures use the training codes (400 `training_invalid_request`, 503 `mock_mode`, 503
`training_queue_full`, ...). Nothing is reserved and no environment is contacted.
"""

from __future__ import annotations

from typing import Any

from ninja import Router

from core.accounts.auth import require_permission
from openenv.api_support import check_body_size, documented, json_body

router = Router(tags=["openenv"])

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


PreflightRequest = documented("PreflightRequest", PREFLIGHT_REQUEST_SCHEMA, __name__,
                              title="OpenEnvTrainingPreflightRequest")
PreflightReceipt = documented("PreflightReceipt", PREFLIGHT_RECEIPT_SCHEMA, __name__,
                              title="OpenEnvTrainingPreflightReceipt")


@router.post("/preflight", summary="Seal the training contract of an OpenEnv train run (nothing is reserved)",
             response=PreflightReceipt)
def training_preflight_route(request, body: PreflightRequest):
    from openenv.runs.api import require_enabled
    from openenv.training.preflight import preflight_request, training_preflight

    require_enabled()
    require_permission(request, "submit_job")
    check_body_size(request, "a preflight request")
    value = json_body(request, "training_invalid_request")
    return training_preflight(**preflight_request(value))
