"""The chain verifier's link for an adapter an OpenEnv environment gate judged (`adapters.verify` sits
below openenv and cannot import it; `adapters.verify` discovers this module, as it does training's).

`environment_gate`: the newest environment-evaluation receipt row about these bytes (its candidate's
content revision is the adapter's) must be intact; the run's published `receipt.json` must be its
canonical bytes; the two side summaries must be the files the receipt names (sha256); and the gate
decision recomputed from them (`paired_return_sign_test_v1`, `final_outcome`) must equal the recorded
evidence and outcome. QA found `kiln adapters verify` said "no gate decided" for an adapter an
environment gate promoted, and accepted its activation from a free-text reason.
`environment_gate.activation`: an activation Kiln queued for an environment-evaluation job must be
the one a `promoted` receipt of that job names.
"""

from __future__ import annotations

import json
from pathlib import Path

from adapters.verify import Chain, broken, ok, register_link, row_intact
from core.canonical import canonical_json, sha256_digest
from core.models import Receipt, ReceiptKind
from openenv.environment_eval_records import FILES
from openenv.environment_gate import (
    EnvironmentGateError,
    GateThresholds,
    final_outcome,
    group_returns_of,
    paired_return_sign_test_v1,
)

LINK = "environment_gate"
MAX_SUMMARY_BYTES = 256 * 1024 * 1024


def _rows_about(chain: Chain) -> list[Receipt]:
    """This adapter's environment-evaluation rows whose candidate is these bytes, oldest first."""
    rows = Receipt.objects.filter(kind=ReceiptKind.ENVIRONMENT_EVAL, subject=chain.name).order_by("created_at", "id")
    content = chain.adapter.content_sha256 if chain.adapter is not None else None
    return [row for row in rows if isinstance(row.body, dict) and content
            and (row.body.get("candidate") or {}).get("adapter_content_revision") == content]


def _read(path: Path, expected: str | None) -> tuple[dict | None, str]:
    """The JSON document at `path` if its bytes hash to `expected`; else None and why."""
    try:
        if path.stat().st_size > MAX_SUMMARY_BYTES:
            return None, f"{path} is larger than {MAX_SUMMARY_BYTES} bytes"
        data = path.read_bytes()
    except OSError:
        return None, f"{path} is missing"
    actual = sha256_digest(data)
    if actual != expected:
        return None, f"{path} hashes to {actual}, the receipt names {expected}"
    try:
        return json.loads(data), ""
    except ValueError:
        return None, f"{path} is not JSON"


def _recomputed(body: dict, folder: Path) -> tuple[str | None, dict | None, str]:
    """(outcome, evidence, why not) of the gate recomputed from the side summaries the receipt names."""
    summaries = {}
    for side in ("baseline", "candidate"):
        summaries[side], why = _read(folder / side / FILES["summary"], body.get(f"{side}_summary_sha256"))
        if summaries[side] is None:
            return None, None, why
    try:
        thresholds = GateThresholds.of((body.get("config") or {}).get("gate"))  # the receipt's own config
        gate = paired_return_sign_test_v1(baseline=group_returns_of(summaries["baseline"]),
                                          candidate=group_returns_of(summaries["candidate"]), gate=thresholds)
    except (EnvironmentGateError, ValueError, TypeError, KeyError, AttributeError) as exc:
        return None, None, f"the gate cannot be recomputed: {exc}"
    auto_load = bool((body.get("promotion") or {}).get("auto_load", True))
    return final_outcome(gate.decision, auto_load), gate.evidence, ""


@register_link(LINK, after="post_eval.gate_decision")
def environment_gate(chain: Chain):
    from openenv.runs.selectors import run_dir_for, run_get
    from openenv.training.evaluation import OUT_DIR

    rows = _rows_about(chain)
    if not rows:
        return ok(LINK, "no environment evaluation of these bytes")
    row = rows[-1]
    if not row_intact(row):
        return broken(LINK, f"environment-evaluation receipt row {row.id} was altered", row.sha256, None)
    body = row.body
    run = run_get(run_id=body.get("run_id") or "")
    if run is None:
        return broken(LINK, f"receipt row {row.id} names OpenEnv run {body.get('run_id')}, which is gone")
    folder = run_dir_for(run) / OUT_DIR
    try:
        published = (folder / "receipt.json").read_bytes()
    except OSError:
        return broken(LINK, f"the run's {OUT_DIR}/receipt.json is missing")
    if published != canonical_json(body):
        return broken(LINK, f"the run's {OUT_DIR}/receipt.json is not receipt row {row.id}",
                      sha256_digest(canonical_json(body)), sha256_digest(published))
    outcome, evidence, why = _recomputed(body, folder)
    if outcome is None:
        return broken(LINK, why)
    if evidence != body.get("evidence"):
        recorded = body.get("evidence") or {}
        changed = sorted(k for k in set(evidence) | set(recorded) if evidence.get(k) != recorded.get(k))
        return broken(LINK, f"recomputed from the side summaries the gate differs in {', '.join(changed)}",
                      {k: evidence.get(k) for k in changed}, {k: recorded.get(k) for k in changed})
    recorded_outcome = body.get("outcome")
    if recorded_outcome != outcome and not (recorded_outcome == "error" and outcome == "promoted"):
        # (a passed gate whose promotion could not be requested is recorded `error`: nothing was served)
        return broken(LINK, f"the receipt says {recorded_outcome!r}, the recomputed gate {outcome!r}", outcome,
                      recorded_outcome)
    return ok(LINK, f"receipt row {row.id} (run {run.id}): recomputed {evidence.get('policy_version')} gives "
              f"{outcome} ({evidence.get('improved_groups')} improved, {evidence.get('regressed_groups')} regressed, "
              f"{evidence.get('paired_groups')} paired groups)", outcome, recorded_outcome)


@register_link(f"{LINK}.activation", after=LINK)
def environment_gate_activation(chain: Chain):
    """An activation row Kiln wrote for a job that is an environment evaluation's must be the activation
    that evaluation's `promoted` receipt queued, for these bytes."""
    link = f"{LINK}.activation"
    by_job = {str(row.job.uuid): row for row in _rows_about(chain) if row.job is not None}
    checked = 0
    for activation in chain.activation_rows:
        body = activation.body if isinstance(activation.body, dict) else {}
        origin = body.get("origin_job_id")
        if origin is None or origin not in by_job:
            continue
        receipt = by_job[origin].body
        promotion = receipt.get("promotion") or {}
        queued = promotion.get("activation_job_id")
        if receipt.get("outcome") != "promoted" or activation.job is None or str(activation.job.uuid) != queued:
            return broken(link, f"activation row {activation.id} names environment-evaluation job {origin}, whose "
                          f"receipt (outcome {receipt.get('outcome')!r}) queued activation {queued}, not this one",
                          queued, str(activation.job.uuid) if activation.job is not None else None)
        if body.get("content_sha256") not in (None, chain.adapter.content_sha256):
            return broken(link, f"activation row {activation.id} activated other bytes", chain.adapter.content_sha256,
                          body.get("content_sha256"))
        checked += 1
    if not checked:
        return ok(link, "no activation by an environment gate")
    return ok(link, f"{checked} activation(s) queued by a promoted environment gate, for these bytes")
