"""A hand-built chain for the verifier, no model needed: a published adapter with its files, the
training job row with its pinned snapshot, the train receipt (row and file), and optionally a
gated post-eval whose evidence the real gate (`paired_wilson_v1`) computed from a results file
written where the eval job publishes it, plus the activation row."""

from __future__ import annotations

import json
from pathlib import Path

from django.conf import settings
from django.db import connection

from adapters.models import Adapter, AdapterState
from core.canonical import sha256_digest
from core.content_identity import adapter_content_sha256
from core.contracts.groups import admit_groups
from core.jobs.models import Job
from core.jobs.services import job_submit
from core.models import Receipt, ReceiptKind
from core.receipts import receipt_record

GROUPS = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
           "completions": [{"text": str(2 * i), "reward": 1.0}, {"text": str(2 * i + 1), "reward": 0.0}]}
          for i in range(3)]
SUITE = {"name": "held", "suite_hash": "sha256:" + "5" * 64}
GENERATION_HASH = "sha256:" + "6" * 64


def job_row(kind: str, *, payload: dict, result: dict | None = None, state: str = "completed") -> Job:
    job = job_submit(kind="test.steps", payload={"steps": 1}, title=kind)
    Job.objects.filter(id=job.id).update(kind=kind, state=state, payload=payload, result=result or {})
    return Job.objects.get(id=job.id)


def tamper_row(row: Receipt, body: dict) -> None:
    """Change a receipt row's body behind the model's back (it refuses updates: append-only)."""
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE {Receipt._meta.db_table} SET body = %s WHERE id = %s", [json.dumps(body), row.id])


def _outcomes(n_improved: int, n_tied_pass: int) -> list[tuple[str, str]]:
    """(baseline, candidate) per example: improved ones, then ties that both pass."""
    return [("fail", "pass")] * n_improved + [("pass", "pass")] * n_tied_pass


def build_chain(home: Path, name: str, *, groups=None, base: Adapter | None = None, gated: bool = False,
                loaded: bool = False, auto_load: bool = True, activation: bool = True) -> Adapter:
    folder = home / "adapters" / name
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4}))
    (folder / "adapter_model.safetensors").write_bytes(b"weights of " + name.encode())
    digest = adapter_content_sha256(folder)
    corpus = admit_groups(groups or GROUPS)
    snapshot = home / "training" / "snapshots" / f"{name}.jsonl"
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.write_bytes(corpus.jsonl)
    post_eval = {"suite": SUITE["name"], "min_accuracy": 0.5} if gated else None
    config = {"output_name": name, "seed": "1", "auto_load": auto_load, "base_adapter": base.name if base else None}
    training = job_row("training.grpo", payload={
        "route": "/v1/train/grpo", "adapter_name": name, "config": config, "snapshot_path": str(snapshot),
        "training_data": {"source": "inline", "admitted_corpus_sha256": corpus.sha256, "rows": len(corpus.groups)},
        "post_eval": post_eval, "post_eval_suite_hash": SUITE["suite_hash"] if gated else None})
    base_block = None if base is None else {"name": base.name, "path": base.path,
                                            "adapter_model_sha256": base.content_sha256, "adapter_model_bytes": 0}
    receipt = {"schema_version": 1, "receipt_type": "kiln_train_receipt", "adapter_name": name, "status": "success",
               "adapters": {"base": base_block, "output": {
                   "path": str(folder), "adapter_model_sha256": digest,
                   "adapter_model_bytes": (folder / "adapter_model.safetensors").stat().st_size}},
               "training_data": {"source": "inline", "path": None, "sha256": corpus.sha256},
               "config": {"auto_load": auto_load}}
    (folder / "train_receipt.json").write_text(json.dumps(receipt, indent=2))
    adapter = Adapter.objects.create(name=name, state=AdapterState.PUBLISHED, path=str(folder), content_sha256=digest,
                                     base_adapter=base.name if base else "", training_job=training, loaded=loaded)
    receipt_record(kind=ReceiptKind.TRAIN, subject=name, body=receipt, job=training)
    if gated:
        _gate(training, name, loaded=loaded, activation=activation)
    return adapter


def _gate(training: Job, name: str, *, loaded: bool, activation: bool) -> None:
    from evaluations.gate import final_outcome, paired_wilson_v1
    from training.post_eval_jobs import GATE_SCHEMA, PostEvalJobPayload, _arms

    pairs = _outcomes(12, 10)
    records = [{"example_id": f"q{i}", "target_index": t, "outcome": pair[t]}
               for i, pair in enumerate(pairs) for t in (0, 1)]
    eval_job = job_row("eval.run", payload={"suite": SUITE, "effective_generation_hash": GENERATION_HASH})
    results = settings.KILN.layout.eval_job(str(eval_job.uuid)) / "results.json"
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps({"schema": "kiln.eval-results.v1", "records": records}))
    Job.objects.filter(id=eval_job.id).update(result={
        "results_path": str(results), "results_sha256": sha256_digest(results.read_bytes()),
        "effective_generation_hash": GENERATION_HASH})
    eval_job.refresh_from_db()
    payload = PostEvalJobPayload.from_dict({"training_job_id": str(training.uuid), "adapter_name": name,
                                            "post_eval": training.payload["post_eval"],
                                            "suite_hash": SUITE["suite_hash"], "baseline_adapter": None,
                                            "auto_load": True})
    post = job_row("training.post_eval", payload=payload.to_dict())
    baseline, candidate = _arms(payload, eval_job, records)
    gate = paired_wilson_v1(baseline=baseline, candidate=candidate, eval_job_id=str(eval_job.uuid),
                            min_accuracy=0.5, candidate_adapter=name)
    outcome = final_outcome(gate.decision, True)
    assert outcome == "promoted", gate.reason
    evidence = {**gate.evidence, "suite_policy": payload.post_eval.data_scope, "outcome": outcome}
    Job.objects.filter(id=post.id).update(result={
        "gate_outcome": outcome, "post_eval_gate_evidence": [evidence], "linked_eval_job_ids": [str(eval_job.uuid)],
        "adapter_name": name})
    Job.objects.filter(id=training.id).update(result={"post_eval_job_id": str(post.uuid)})
    post.refresh_from_db()
    receipt_record(kind=ReceiptKind.POST_EVAL_GATE, subject=name, job=post,
                   body={"schema": GATE_SCHEMA, "training_job_id": str(training.uuid), "evidence": evidence})
    if loaded and activation:
        receipt_record(kind=ReceiptKind.ACTIVATION, subject=name, job=post, body={
            "schema": "kiln.adapter-activation.v1", "adapter": name, "reason": "post_eval gate passed",
            "gate_outcome": outcome, "training_job_id": str(training.uuid), "eval_job_id": str(eval_job.uuid),
            "activated_at": "2025-01-01T00:00:00+00:00"})
