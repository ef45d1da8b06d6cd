"""The behavior policy of a train run, held to its sealed contract (reference-spec §4.6, guide "Collect and train").

- `snapshot_behavior_adapter(run, directory)`: before the first episode, a named behavior adapter
  is copied privately into the run directory (`behavior-adapter/`: its config and weights) while
  its registry row is locked (the adapter mutation barrier: the registry's writers lock the same
  row), and the copy's content digest must equal the registry's and the contract's. Base: nothing.
- `ContractPolicy`: every policy reply during collection must carry exactly the contract's
  behavior policy (served model, base weights, inference config, implementation, adapter digest),
  else the collection fails closed.
- `check_before_training(run)`: after collection, before anything is submitted, the served model
  (the GPU worker's heartbeat) must still be the contract's, the registry's adapter must still
  hold the snapshot's bytes and the snapshot must still hash the same.
Every drift is a `BehaviorDrift` that the run records as `training_evidence_invalid` (fail closed).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from core.content_identity import adapter_content_sha256, adapter_files, file_manifest
from core.errors import KilnError
from openenv.collector import CollectionError

SNAPSHOT_DIR = "behavior-adapter"
SERVED_FIELDS = ("served_model_id", "base_model_sha256", "inference_config_sha256", "implementation")
HINT = "the served model or the behavior adapter changed under the run; submit the run again"


class BehaviorDrift(Exception):
    def __init__(self, message: str, *, code: str = "training_evidence_invalid", retryable: bool = False,
                 hint: str = HINT):
        super().__init__(message)
        self.message, self.code, self.retryable, self.hint = message, code, retryable, hint


def expected_policy(run) -> dict | None:
    return (run.training_contract or {}).get("behavior_policy")


def snapshot_behavior_adapter(run, directory: Path) -> dict | None:
    """Copy the contract's behavior adapter into the run directory; its record (None for base)."""
    from django.db import transaction

    from adapters.models import Adapter, AdapterState

    expected = (expected_policy(run) or {}).get("adapter")
    if expected is None:
        return None
    target = Path(directory) / SNAPSHOT_DIR
    staging = Path(directory) / f".{SNAPSHOT_DIR}.partial"
    with transaction.atomic():
        row = Adapter.objects.select_for_update().filter(name=expected["name"]).first()
        if row is None or row.state != AdapterState.PUBLISHED or not row.path:
            raise BehaviorDrift(f"behavior adapter {expected['name']!r} is no longer published")
        if row.content_sha256 != expected["content_sha256"]:
            raise BehaviorDrift(f"behavior adapter {row.name!r} now holds {row.content_sha256}, not the contract's "
                                f"{expected['content_sha256']}")
        source = Path(row.path)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for name in adapter_files(source):
            shutil.copyfile(source / name, staging / name)
        digest = adapter_content_sha256(staging)
        if digest != expected["content_sha256"]:
            shutil.rmtree(staging, ignore_errors=True)
            raise BehaviorDrift(f"the files of behavior adapter {row.name!r} hash to {digest}, not the registry's "
                                f"{expected['content_sha256']}")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return {"name": expected["name"], "content_sha256": digest, "path": str(target),
            "files": file_manifest(target, adapter_files(target))}


class ContractPolicy:
    """The run's policy, refusing any reply whose behavior policy is not the contract's."""

    def __init__(self, policy, expected: dict):
        self.policy, self.expected = policy, dict(expected)

    async def __call__(self, request):
        reply = await self.policy(request)
        found = getattr(reply, "behavior_policy", None)
        if found != self.expected:
            changed = sorted(k for k in set(self.expected) | set(found or {})
                             if self.expected.get(k) != (found or {}).get(k))
            raise CollectionError(
                "openenv_behavior_policy_changed",
                f"group {request.group_index} candidate {request.candidate_index} step {request.step_index}: the "
                f"behavior policy is not the sealed contract's ({', '.join(changed) or 'shape'})",
                stage="collection", failure_code="training_evidence_invalid", hint=HINT)
        return reply


def check_before_training(run) -> None:
    from adapters.selectors import adapter_get
    from openenv.training.preflight import served_behavior_identity

    expected = expected_policy(run)
    if expected is None:
        raise BehaviorDrift("the sealed contract names no behavior policy")
    try:
        served = served_behavior_identity()
    except KilnError as exc:
        raise BehaviorDrift(f"the served model cannot be checked against the contract: {exc.code}: {exc.message}",
                            code="run_admission_failed", retryable=True,
                            hint="start the GPU worker (kiln serve), then submit the run again") from None
    changed = [key for key in SERVED_FIELDS if served.get(key) != expected.get(key)]
    if changed:
        raise BehaviorDrift(f"the served model changed since the contract was sealed ({', '.join(changed)})")
    adapter = expected.get("adapter")
    if adapter is None:
        return
    snapshot = run.behavior_snapshot or {}
    row = adapter_get(name=adapter["name"])
    if row is None or row.content_sha256 != adapter["content_sha256"]:
        now = "gone" if row is None else row.content_sha256
        raise BehaviorDrift(f"behavior adapter {adapter['name']!r} changed during the run (registry: {now}; "
                            f"contract: {adapter['content_sha256']})")
    path = Path(snapshot.get("path") or "")
    if not path.is_dir() or adapter_content_sha256(path) != adapter["content_sha256"]:
        raise BehaviorDrift(f"the run's private snapshot of {adapter['name']!r} no longer matches the contract")
