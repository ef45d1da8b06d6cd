"""The chain verifier's own links, in walking order (see adapters/verify.py for the chain and
how links are registered). Apps above `adapters` add theirs in their own `verify_links.py`."""

from __future__ import annotations

import json

from adapters.models import Adapter, AdapterState
from adapters.verify import (
    MAX_DEPTH,
    Chain,
    broken,
    digest_check,
    ok,
    register_link,
    row_intact,
    unchecked,
    uploaded_elsewhere,
    verify_adapter,
)
from adapters.verify_manifest import manifest_file_link
from core.canonical import json_digest, sha256_digest
from core.errors import clip
from core.models import Receipt, ReceiptKind


@register_link("adapter.row")
def _adapter_row(chain: Chain):
    adapter = chain.adapter
    if adapter is None:
        return broken("adapter.row", f"no adapter named {chain.name!r} in the registry")
    if adapter.state != AdapterState.PUBLISHED:
        return broken("adapter.row", f"adapter {chain.name!r} is {adapter.state}, not published",
                      AdapterState.PUBLISHED, adapter.state)
    if chain.folder is None or not chain.folder.is_dir():
        return broken("adapter.row", f"the adapter folder {adapter.path or '(none)'} is missing")
    state = "active" if adapter.loaded else "not active"
    return ok("adapter.row", f"published at {adapter.path} ({state})")


@register_link("adapter.bytes")
def _adapter_bytes(chain: Chain):
    actual = chain.content_sha256
    if actual is None:
        return broken("adapter.bytes", f"no adapter files ({', '.join(('adapter_config.json', 'weights'))}) "
                      f"in {chain.folder}", chain.adapter.content_sha256, None)
    return digest_check("adapter.bytes", "the content digest of the adapter files", chain.adapter.content_sha256,
                        actual)


@register_link("training.job")
def _training_job(chain: Chain):
    if chain.uploaded:
        return unchecked("training.job", uploaded_elsewhere(chain, "its training job ran on the machine that trained it"))
    job = chain.training_job
    if job is None:
        produced = chain.adapter.training_job
        what = f"a {produced.kind} job" if produced is not None else "no training job"
        return broken("training.job", f"the adapter records {what}; its training cannot be verified")
    if job.state != "completed":
        return broken("training.job", f"training job {job.uuid} is {job.state}, not completed", "completed", job.state)
    return ok("training.job", f"produced by training job {job.uuid}")


@register_link("train_receipt.row")
def _train_row(chain: Chain):
    if chain.uploaded:
        return unchecked("train_receipt.row", uploaded_elsewhere(chain, "its receipt row is on the machine that trained it"))
    row = chain.train_row
    if chain.training_job is None:
        return broken("train_receipt.row", "no training job, so no train receipt row")
    if row is None:
        return broken("train_receipt.row", f"no train receipt row for {chain.name!r} from job {chain.training_job.uuid}")
    if not row_intact(row):
        actual = _safe_digest(row.body)
        return broken("train_receipt.row", f"receipt row {row.id} was altered: its body hashes to {actual}, "
                      f"the row records {row.sha256}", row.sha256, actual)
    body = chain.receipt
    if body.get("adapter_name") != chain.name or body.get("status") != "success":
        return broken("train_receipt.row", f"receipt row {row.id} is for {body.get('adapter_name')!r} with status "
                      f"{body.get('status')!r}", {"adapter_name": chain.name, "status": "success"},
                      {"adapter_name": body.get("adapter_name"), "status": body.get("status")})
    return ok("train_receipt.row", f"receipt row {row.id} hashes to its digest {row.sha256}", row.sha256, row.sha256)


@register_link("train_receipt.file")
def _train_file(chain: Chain):
    path = chain.folder / "train_receipt.json"
    if chain.uploaded:
        return unchecked("train_receipt.file", uploaded_elsewhere(chain, "no receipt row here to hash it against (its "
                         "bytes are bound by adapter_manifest.json's receipt_hash)"))
    expected = chain.train_row.sha256 if chain.train_row is not None else None
    try:
        actual = json_digest(json.loads(path.read_bytes()))
    except FileNotFoundError:
        return broken("train_receipt.file", f"{path} is missing", expected, None)
    except (OSError, ValueError, TypeError) as exc:
        return broken("train_receipt.file", f"{path} is not a JSON receipt: {exc}", expected, None)
    return digest_check("train_receipt.file", "the canonical digest of train_receipt.json", expected, actual)


@register_link("train_receipt.output")
def _train_output(chain: Chain):
    receipt = chain.carried_receipt if chain.uploaded else chain.receipt
    if chain.uploaded and not receipt:
        return unchecked("train_receipt.output", uploaded_elsewhere(chain, "no receipt names its files"))
    output = (receipt.get("adapters") or {}).get("output") or {}
    if not output:
        return broken("train_receipt.output", "the train receipt has no adapters.output block")
    recorded = output.get("adapter_model_sha256")
    if recorded != chain.content_sha256:
        return broken("train_receipt.output", f"the receipt's adapters.output.adapter_model_sha256 is {recorded}, "
                      f"the files hash to {chain.content_sha256}", recorded, chain.content_sha256)
    weights = chain.folder / "adapter_model.safetensors"
    size = weights.stat().st_size if weights.is_file() else None
    if output.get("adapter_model_bytes") != size:
        return broken("train_receipt.output", f"the receipt records {output.get('adapter_model_bytes')} weight bytes, "
                      f"adapter_model.safetensors has {size}", output.get("adapter_model_bytes"), size)
    return ok("train_receipt.output", f"adapters.output names these files ({recorded}, {size} bytes)", recorded,
              chain.content_sha256)


# adapter_manifest.json: its own module (adapters/verify_manifest.py), registered here to keep the order
register_link("adapter_manifest.file")(manifest_file_link)


LINEAGE_KEYS = ("dataset", "split", "dataset_corpus_sha256", "split_manifest_sha256")


@register_link("corpus.snapshot")
def _corpus_snapshot(chain: Chain):
    if chain.uploaded:
        return unchecked("corpus.snapshot", uploaded_elsewhere(chain, "the admitted corpus was pinned on the machine that "
                                                              "trained it"))
    data = chain.payload.get("training_data") or {}
    admitted = data.get("admitted_corpus_sha256")
    path = chain.payload.get("snapshot_path")
    if not admitted or not path:
        return broken("corpus.snapshot", "the training job pinned no admitted corpus digest or snapshot")
    if chain.snapshot_bytes is None:
        return broken("corpus.snapshot", f"the pinned snapshot {path} is missing (the job promised to keep it)",
                      admitted, None)
    actual = sha256_digest(chain.snapshot_bytes)
    if actual != admitted:
        return broken("corpus.snapshot", f"the pinned snapshot {path} hashes to {actual}, admitted {admitted}",
                      admitted, actual)
    receipt_data = chain.receipt.get("training_data") or {}
    if receipt_data.get("sha256") != admitted:
        return broken("corpus.snapshot", f"the train receipt's training_data.sha256 is {receipt_data.get('sha256')}, "
                      f"the job admitted {admitted}", admitted, receipt_data.get("sha256"))
    for key in LINEAGE_KEYS:
        if data.get(key) is not None and receipt_data.get(key) != data.get(key):
            return broken("corpus.snapshot", f"the receipt's training_data.{key} is {receipt_data.get(key)!r}, the "
                          f"job admitted {data.get(key)!r}", data.get(key), receipt_data.get(key))
    source = data.get("source") or "?"
    named = f" ({data['dataset']}/{data.get('split')})" if data.get("dataset") else ""
    return ok("corpus.snapshot", f"the admitted {source} corpus{named} hashes to {admitted}", admitted, actual)


@register_link("corpus.provenance")
def _corpus_provenance(chain: Chain):
    from core.contracts.provenance import (
        ProvenanceError,
        prompt_messages_sha256,
        scored_payload_sha256,
        validate_rollout_provenance,
    )
    from core.contracts.recorded import RecordedDrift, check_recorded_corpus, completions_of

    if chain.uploaded:
        return unchecked("corpus.provenance", uploaded_elsewhere(chain, "its corpus is not here"))
    groups = chain.snapshot_groups
    if groups is None:
        return broken("corpus.provenance", "cannot be checked: the pinned snapshot is unavailable")
    checked = total = 0
    for g, group in enumerate(groups):
        for c, completion in enumerate(completions_of(group) or []):
            total += 1
            record = completion.get("provenance")
            if record is None:
                continue
            where = f"groups[{g}].completions[{c}]"
            try:
                validate_rollout_provenance(record)
            except ProvenanceError as exc:
                return broken("corpus.provenance", f"{where}: invalid kiln.rollout-provenance.v1 record: {exc}")
            want = scored_payload_sha256(completion.get("text"), completion.get("trajectory"))
            if record["scored_payload_sha256"] != want:
                return broken("corpus.provenance", f"{where}: the completion no longer hashes to its "
                              "scored_payload_sha256", record["scored_payload_sha256"], want)
            want = prompt_messages_sha256(group.get("messages"))
            if record["prompt_messages_sha256"] != want:
                return broken("corpus.provenance", f"{where}: the group's messages no longer hash to "
                              "prompt_messages_sha256", record["prompt_messages_sha256"], want)
            checked += 1
    if (chain.payload.get("config") or {}).get("behavior_policy") == "recorded":
        base = (chain.receipt.get("adapters") or {}).get("base")
        identity = None if not base else {"name": base.get("name"), "content_sha256": base.get("adapter_model_sha256")}
        try:
            check_recorded_corpus(groups, tokenizer=None, base_model_sha256=None, base_adapter=identity)
        except RecordedDrift as exc:
            return broken("corpus.provenance", f"the recorded-policy corpus no longer holds: {exc}")
    if checked == 0:
        return ok("corpus.provenance", f"no rollout provenance in the corpus ({total} completions)")
    return ok("corpus.provenance", f"{checked} of {total} completions carry valid provenance bound to their text")


@register_link("base_adapter")
def _base_adapter(chain: Chain):
    if chain.uploaded:  # what it was trained from is the carried receipt's claim, not something seen here
        base = ((chain.carried_receipt.get("adapters") or {}).get("base") or {}).get("name")
        claim = f"the carried receipt names base adapter {base!r}" if base else "the carried receipt names none"
        return unchecked("base_adapter", uploaded_elsewhere(chain, f"its lineage cannot be verified ({claim})"
                                                    if chain.carried_receipt else "its lineage is unknown"))
    parent = (chain.payload.get("config") or {}).get("base_adapter") or chain.adapter.base_adapter
    base = (chain.receipt.get("adapters") or {}).get("base")
    if not parent and not base:
        return ok("base_adapter", "trained from the base model")
    if not parent:
        return broken("base_adapter", "the receipt names a base adapter the job did not ask for", None, base)
    if chain.depth + 1 > MAX_DEPTH:
        return broken("base_adapter", f"the base_adapter chain is deeper than {MAX_DEPTH}")
    if parent in chain.seen:
        return broken("base_adapter", f"the base_adapter chain loops back to {parent!r}")
    trained_from = (base or {}).get("adapter_model_sha256")
    row = Adapter.objects.filter(name=parent).first()
    if row is None:
        return broken("base_adapter", f"the parent {parent!r} is no longer in the registry", trained_from, None)
    if row.content_sha256 != trained_from:
        return broken("base_adapter", f"the parent {parent!r} is now {row.content_sha256}, the receipt trained from "
                      f"{trained_from}", trained_from, row.content_sha256)
    report = verify_adapter(parent, _depth=chain.depth + 1, _seen=chain.seen)
    first = report.first_broken
    if first is not None:
        return broken("base_adapter", f"the parent {parent!r} fails at {first.link}: {first.detail}",
                      trained_from, row.content_sha256)
    checked = sum(1 for link in report.links if link.checked)
    not_checkable = len(report.links) - checked  # an uploaded parent's links that nothing here can check
    counted = f"{checked} links" + (f"; {not_checkable} not checkable here" if not_checkable else "")
    return ok("base_adapter", f"the parent {parent!r} verifies ({counted}) and is {trained_from}",
              trained_from, row.content_sha256)


@register_link("post_eval.job")
def _post_eval_job(chain: Chain):
    if not chain.post_eval_requested:
        return ok("post_eval.job", "no post-eval was requested")
    job = chain.post_eval_job
    if job is None:
        return broken("post_eval.job", "a post-eval was requested but the training job links no post-eval job")
    if job.state in ("queued", "running"):
        return ok("post_eval.job", f"post-eval job {job.uuid} is {job.state}: nothing recorded yet")
    if job.state != "completed":
        # a recorded fact, not a broken link (QA: an adapter approved by hand after its post-eval's worker
        # was killed failed verification for ever): what the adapter did after is the activation link's
        why = f" ({job.error_code})" if job.error_code else ""
        return ok("post_eval.job", f"post-eval job {job.uuid} ended {job.state}{why} before its gate decided: "
                  "no gate decision is recorded")
    outcome = chain.post_eval_result.get("gate_outcome")
    return ok("post_eval.job", f"post-eval job {job.uuid} completed" + (f" (gate {outcome})" if outcome else ""))


@register_link("post_eval.eval_results")
def _eval_results(chain: Chain):
    if chain.post_eval_job is None or chain.post_eval_job.state != "completed":
        return ok("post_eval.eval_results", "no completed post-eval")
    if not chain.eval_jobs:
        return ok("post_eval.eval_results", "the post-eval ran no eval job")
    results = []
    for eval_id, job in zip(chain.post_eval_result.get("linked_eval_job_ids") or [], chain.eval_jobs, strict=True):
        if job is None:
            results.append(broken("post_eval.eval_results", f"eval job {eval_id} is gone"))
            continue
        result = job.result or {}
        if job.state != "completed":
            results.append(ok("post_eval.eval_results", f"eval job {eval_id} ended {job.state}: no results file"))
            continue
        path = chain.results_file(job)
        if result.get("results_path") != str(path):
            results.append(broken("post_eval.eval_results", f"eval job {eval_id} records its results at "
                                  f"{result.get('results_path')}, not {path}", str(path), result.get("results_path")))
            continue
        try:
            actual = sha256_digest(path.read_bytes())
        except OSError:
            results.append(broken("post_eval.eval_results", f"the results file {path} of eval job {eval_id} is missing",
                                  result.get("results_sha256"), None))
            continue
        results.append(digest_check("post_eval.eval_results", f"eval job {eval_id} results.json",
                                    result.get("results_sha256"), actual))
    return results


@register_link("post_eval.gate_receipt")
def _gate_receipt(chain: Chain):
    if not chain.gated or chain.post_eval_job is None or chain.post_eval_job.state != "completed":
        return ok("post_eval.gate_receipt", "no gate decided")
    row = chain.gate_row
    if row is None:
        return broken("post_eval.gate_receipt", f"no post_eval_gate receipt row from post-eval job "
                      f"{chain.post_eval_job.uuid}")
    if not row_intact(row):
        actual = _safe_digest(row.body)
        return broken("post_eval.gate_receipt", f"gate receipt row {row.id} was altered: its body hashes to {actual}, "
                      f"the row records {row.sha256}", row.sha256, actual)
    body = row.body if isinstance(row.body, dict) else {}
    recorded = (chain.post_eval_result.get("post_eval_gate_evidence") or [None])[0]
    if body.get("evidence") != recorded:
        return broken("post_eval.gate_receipt", "the gate receipt's evidence is not the post-eval job's",
                      _safe_digest(recorded), _safe_digest(body.get("evidence")))
    if body.get("training_job_id") != str(chain.training_job.uuid):
        return broken("post_eval.gate_receipt", "the gate receipt names another training job",
                      str(chain.training_job.uuid), body.get("training_job_id"))
    outcome = (body.get("evidence") or {}).get("outcome")
    return ok("post_eval.gate_receipt", f"gate receipt row {row.id} hashes to {row.sha256} (outcome {outcome})",
              row.sha256, row.sha256)


def _activated_by(body: dict) -> str:
    """Who activated it, when a promotion did: the receipt's actor is then the approver, not someone
    who loaded it by hand ("" for an activation without a promotion)."""
    if body.get("promotion_id") is None:
        return ""
    return f"activated by promotion {body['promotion_id']}, approved by {body.get('actor') or 'an anonymous caller'}, "


@register_link("activation")
def _activation(chain: Chain):
    """An active adapter is justified by the newest activation row bound to it (by its training job or
    its content digest): a promoted gate of this post-eval, or a load by hand (recorded with who);
    without a row and without a gate, by auto_load in the train receipt's config."""
    rows = chain.activation_rows
    for row in rows:
        if not row_intact(row):
            return broken("activation", f"activation receipt row {row.id} was altered", row.sha256,
                          _safe_digest(row.body))
    if not chain.adapter.loaded:
        return ok("activation", "not active: nothing to justify")
    training_id = str(chain.training_job.uuid) if chain.training_job else None
    content = chain.adapter.content_sha256
    mine = [r for r in rows if isinstance(r.body, dict) and (
        (training_id and r.body.get("training_job_id") == training_id) or r.body.get("content_sha256") == content)]
    eval_ids = [str(i) for i in chain.post_eval_result.get("linked_eval_job_ids") or []]
    outcome = chain.post_eval_result.get("gate_outcome")
    if mine:
        row = mine[-1]
        body = row.body
        if body.get("content_sha256") not in (None, content):
            return broken("activation", f"activation receipt row {row.id} activated other bytes", content,
                          body.get("content_sha256"))
        if body.get("gate_outcome") is not None:
            if body["gate_outcome"] != "promoted" or (eval_ids and body.get("eval_job_id") not in eval_ids):
                return broken("activation", f"activation receipt row {row.id} names gate {body['gate_outcome']!r} "
                              f"of eval {body.get('eval_job_id')}, not a promoted gate of this post-eval",
                              "promoted", body["gate_outcome"])
            return ok("activation", f"active: {_activated_by(body)}activation receipt row {row.id} "
                      f"({body.get('reason')})", "promoted", body["gate_outcome"])
        gate = f", gate {outcome}" if chain.gated else ""
        if body.get("promotion_id") is not None:
            return ok("activation", f"active: {_activated_by(body).removesuffix(', ')} (receipt row {row.id}: "
                      f"{body.get('reason')}{gate})")
        if "origin_job_id" in body:  # an adapter.activate job Kiln queued: auto_load, an environment gate
            origin = f" for job {body['origin_job_id']}" if body.get("origin_job_id") else ""
            return ok("activation", f"active: activated by Kiln{origin} (receipt row {row.id}: "
                      f"{body.get('reason')}{gate})")
        who = body.get("actor") or "an anonymous caller"
        return ok("activation", f"active: loaded by hand by {who} (receipt row {row.id}: {body.get('reason')}{gate})")
    if chain.gated:
        return broken("activation", f"active, but no activation receipt binds it to a promoted gate (gate {outcome})",
                      "promoted", outcome)
    config = chain.receipt.get("config") or {}
    smoke = chain.receipt.get("adapter_smoke_test") or {}
    if config.get("auto_load") and smoke.get("passed", True):
        return ok("activation", "active: auto_load in the train receipt's config, no gate requested")
    return broken("activation", "active, but neither an activation receipt nor auto_load in the train receipt",
                  True, config.get("auto_load"))


@register_link("promotion", after="activation")
def _promotion(chain: Chain):
    """An adapter a promotion activated: the promotion's evidence still hashes to its digest, and its
    request row and every approval row are intact and bind the candidate's digest and that evidence
    digest; the deciding row says approved (an override of an alarm is named)."""
    from adapters.models import Promotion, PromotionState

    if not chain.adapter.loaded:
        return ok("promotion", "not active: nothing to justify")
    promotion = (Promotion.objects.filter(candidate=chain.name, state=PromotionState.APPLIED)
                 .order_by("-decided_at", "-id").first())
    if promotion is None:
        return ok("promotion", "not activated through a promotion")
    content = chain.adapter.content_sha256
    if promotion.content_sha256 != content:
        return broken("promotion", f"promotion {promotion.id} was for other bytes", content, promotion.content_sha256)
    evidence = _safe_digest(promotion.evidence)
    if evidence != promotion.evidence_sha256:
        return broken("promotion", f"promotion {promotion.id}'s evidence hashes to {evidence}, it records "
                      f"{promotion.evidence_sha256}", promotion.evidence_sha256, evidence)
    rows = list(Receipt.objects.filter(subject=chain.name, kind__in=(ReceiptKind.PROMOTION, ReceiptKind.APPROVAL))
                .order_by("created_at", "id"))
    for row in rows:
        if not row_intact(row):
            return broken("promotion", f"{row.kind} receipt row {row.id} was altered: its body hashes to "
                          f"{_safe_digest(row.body)}, the row records {row.sha256}", row.sha256, _safe_digest(row.body))
    mine = [r for r in rows if isinstance(r.body, dict) and r.body.get("promotion_id") == promotion.id]
    requests = [r for r in mine if r.kind == ReceiptKind.PROMOTION]
    approvals = [r for r in mine if r.kind == ReceiptKind.APPROVAL]
    if not requests:
        return broken("promotion", f"no promotion receipt row for promotion {promotion.id}")
    if not approvals or approvals[-1].body.get("decision") != "approved":
        return broken("promotion", f"no approval receipt row approves promotion {promotion.id}", "approved",
                      approvals[-1].body.get("decision") if approvals else None)
    for row in requests + approvals:
        bound = (row.body.get("candidate_content_sha256"), row.body.get("evidence_sha256"))
        if bound != (content, promotion.evidence_sha256):
            return broken("promotion", f"{row.kind} receipt row {row.id} binds other content or evidence",
                          [content, promotion.evidence_sha256], list(bound))
    people = _people_problem(promotion, requests[-1], approvals[-1])
    if people:
        return broken("promotion", *people)
    decision = approvals[-1].body
    override = " (an override of its alarms)" if decision.get("override") else ""
    return ok("promotion", f"promotion {promotion.id} approved by {decision.get('actor') or 'an anonymous caller'}{override}: "
              f"{decision.get('reason')} (approval row {approvals[-1].id})", promotion.evidence_sha256,
              promotion.evidence_sha256)


def _people_problem(promotion, request_row, approval_row) -> tuple | None:
    """QA: an approval row rewritten to another approver (its digest recomputed) passed, while the promotion
    row still named the real one. The rows must name who the promotion row says requested and decided it
    (a user deleted since is no longer named there: nothing to compare)."""
    for row, field, user in ((request_row, "requested_by", promotion.requested_by),
                             (approval_row, "actor", promotion.decided_by)):
        if user is not None and row.body.get(field) != user.username:
            return (f"{row.kind} receipt row {row.id} names {row.body.get(field)!r}, promotion {promotion.id} was "
                    f"{'requested' if field == 'requested_by' else 'decided'} by {user.username!r}",
                    user.username, row.body.get(field))
    # ...and the reviewer's justification and time, what an auditor reads (QA: a rewritten reason verified)
    if approval_row.body.get("reason") != promotion.reason:
        return (f"approval receipt row {approval_row.id} gives the reason {clip(str(approval_row.body.get('reason')))!r}, "
                f"promotion {promotion.id} records {clip(promotion.reason)!r}", promotion.reason,
                approval_row.body.get("reason"))
    if promotion.decided_at is not None and _parsed_time(approval_row.body.get("decided_at")) != promotion.decided_at:
        return (f"approval receipt row {approval_row.id} was decided at {approval_row.body.get('decided_at')}, "
                f"promotion {promotion.id} at {promotion.decided_at.isoformat()}", promotion.decided_at.isoformat(),
                approval_row.body.get("decided_at"))
    return None


def _parsed_time(text):
    from datetime import datetime

    try:
        return datetime.fromisoformat(str(text))
    except ValueError:
        return None


@register_link("receipts.rows")
def _all_rows(chain: Chain):
    from adapters.selectors import adapter_receipt_rows

    # Rows of this adapter row only: an earlier adapter of the same name left its own.
    rows = list(adapter_receipt_rows(adapter=chain.adapter).order_by("created_at", "id"))
    for row in rows:
        if not row_intact(row):
            return broken("receipts.rows", f"{row.kind} receipt row {row.id} was altered: its body hashes to "
                          f"{_safe_digest(row.body)}, the row records {row.sha256}", row.sha256, _safe_digest(row.body))
    return ok("receipts.rows", f"all {len(rows)} receipt rows about {chain.name!r} hash to their digests")


def _safe_digest(value) -> str | None:
    try:
        return json_digest(value)
    except Exception:
        return None
