"""The held-out part of a promotion's evidence: the post-eval compare job's records, read back.

`gate_of(adapter)` finds the gate evidence of an adapter's post-eval; `eval_job_of(gate, post_id)` its
`eval.run` compare job; `held_out_figures(eval_job, candidate=, gate=)` the completion lengths of
candidate and incumbent and up to MAX_SAMPLES held-out prompts with both outputs side by side. Reads
only. Imports no app above adapters: the eval job's `results.json` and pinned suite are read where the
kernel's layout names them, each checked against the sha256 its job row records (as adapters.verify
reads them), never through evaluations.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import uuid
from pathlib import Path

from django.conf import settings

MAX_SAMPLES = 6
SAMPLE_CHARS = 400
MAX_FILE_BYTES = 64 * 1024 * 1024  # a larger results or suite file is not read (no figures)


def _dict(value) -> dict:
    return value if isinstance(value, dict) else {}


def _job(job_id):
    from core.jobs.models import Job

    try:
        uuid.UUID(str(job_id))
    except (TypeError, ValueError, AttributeError):
        return None
    return Job.objects.filter(uuid=str(job_id)).first()


def gate_of(adapter) -> tuple[dict | None, str | None, dict | None]:
    """The post-eval gate evidence of the adapter's training job, the post-eval job id, and what became
    of that gate (`gate_status_of`)."""
    job = adapter.training_job
    post = _job((job.result or {}).get("post_eval_job_id")) if job is not None else None
    if post is None:
        return None, None, None
    evidence = ((post.result or {}).get("post_eval_gate_evidence") or [None])[0]
    return (evidence if isinstance(evidence, dict) else None), str(post.uuid), gate_status_of(post)


def gate_status_of(post) -> dict:
    """What became of a post-eval's gate, so a promotion without gate evidence says why: the gate's
    outcome (`error` when the post-eval job failed or was cancelled before it decided, `pending` while it
    runs, None when the post-eval had no floor to hold), the verdict, and the job's error code."""
    result = post.result or {}
    outcome, verdict = result.get("gate_outcome"), result.get("post_eval_verdict")
    if not outcome and post.state in ("failed", "cancelled"):
        outcome = "error"
        why = ": ".join(part for part in (post.error_code or "no code", post.error_message) if part)
        verdict = f"the post-training evaluation ended {post.state} before the gate decided ({why})"
    elif not outcome and post.state in ("queued", "running"):
        outcome, verdict = "pending", "the post-training evaluation has not finished"
    return {"outcome": outcome, "verdict": verdict, "state": post.state, "error_code": post.error_code or None,
            "min_accuracy": _dict(_dict(post.payload).get("post_eval")).get("min_accuracy")}


def _verified_json(path: Path, expected: str | None, limit: int = MAX_FILE_BYTES) -> dict | None:
    try:
        if not expected or path.stat().st_size > limit:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    if "sha256:" + hashlib.sha256(data).hexdigest() != expected:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def eval_job_of(gate: dict | None, post_eval_job_id: str | None):
    eval_id = (gate or {}).get("eval_job_id")
    if eval_id is None and post_eval_job_id:
        post = _job(post_eval_job_id)
        eval_id = next(iter((post.result or {}).get("linked_eval_job_ids") or []), None) if post else None
    return _job(eval_id) if eval_id else None


def _eval_records(eval_job) -> list[dict] | None:
    """The eval job's published records (results.json where the layout puts it, checked against the
    sha256 in its result), or None."""
    result = eval_job.result or {}
    expected = settings.KILN.layout.eval_job(str(eval_job.uuid)) / "results.json"
    if eval_job.state != "completed" or Path(result.get("results_path") or "") != expected:
        return None
    document = _verified_json(expected, result.get("results_sha256"))
    records = (document or {}).get("records")
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else None


def _prompts(eval_job) -> dict:
    """example id -> the last user message of the suite the eval job was pinned to (checked)."""
    suite = (eval_job.payload or {}).get("suite") or {}
    document = _verified_json(Path(suite.get("path") or ""), suite.get("sha256")) if suite.get("path") else None
    prompts = {}
    for example in (document or {}).get("examples") or []:
        users = [m.get("content") for m in example.get("messages") or [] if isinstance(m, dict)
                 and m.get("role") == "user"] if isinstance(example, dict) else []
        if users:
            prompts[example.get("id")] = users[-1] if isinstance(users[-1], str) else json.dumps(users[-1])
    return prompts


def _indices(eval_job, candidate: str, gate: dict | None) -> tuple[int | None, int | None, list]:
    """(candidate, incumbent) target indices and the target names: by adapter name in the job's targets
    (the incumbent: the gate's baseline); a job that lists no targets: the post-eval order (baseline 0,
    candidate 1). A job whose targets do not include the candidate gives (None, None)."""
    targets = [t.get("adapter") if isinstance(t, dict) else None for t in (eval_job.payload or {}).get("targets") or []]
    baseline = (gate or {}).get("baseline_adapter")
    if not targets:
        return 1, 0, [baseline, candidate]
    if candidate not in targets:
        return None, None, targets
    index = targets.index(candidate)
    others = [i for i in range(len(targets)) if i != index]
    chosen = [i for i in others if targets[i] == baseline] or others
    return index, (chosen[0] if chosen else None), targets


def _tokens(record: dict) -> int | None:
    count = _dict(record.get("usage")).get("completion_tokens")
    if isinstance(count, int) and not isinstance(count, bool) and count >= 0:
        return count
    ids = record.get("completion_token_ids")
    return len(ids) if isinstance(ids, list) else None


def _length_side(records: list[dict]) -> dict:
    counts = [c for c in (_tokens(r) for r in records) if c is not None]
    return {"count": len(counts), "mean": math.fsum(counts) / len(counts) if counts else None,
            "median": float(statistics.median(counts)) if counts else None,
            "truncated": sum(1 for r in records if r.get("finish_reason") == "length")}


def _clip(text) -> str | None:
    if not isinstance(text, str):
        return None
    return text if len(text) <= SAMPLE_CHARS else text[: SAMPLE_CHARS - 1] + "…"


def held_out_figures(eval_job, *, candidate: str, gate: dict | None) -> tuple[dict | None, list[dict] | None]:
    """`lengths` (completion tokens per side, with counts) and `samples` (up to MAX_SAMPLES examples, the
    ones where the outcomes differ first, then suite order) from the post-eval compare's records."""
    records = _eval_records(eval_job)
    if records is None:
        return None, None
    cand, inc, targets = _indices(eval_job, candidate, gate)
    if cand is None:
        return None, None
    side = {cand: "candidate", inc: "incumbent"}
    by_example: dict = {}
    for record in records:
        if record.get("target_index") in side:
            by_example.setdefault(record.get("example_id"), {})[side[record["target_index"]]] = record
    lengths = {"unit": "completion_tokens", "eval_job_id": str(eval_job.uuid), "candidate_adapter": candidate,
               "incumbent_adapter": targets[inc] if inc is not None and inc < len(targets) else None,
               "candidate": _length_side([r["candidate"] for r in by_example.values() if "candidate" in r]),
               "incumbent": _length_side([r["incumbent"] for r in by_example.values() if "incumbent" in r])}
    means = lengths["candidate"]["mean"], lengths["incumbent"]["mean"]
    lengths["ratio"] = means[0] / means[1] if means[0] is not None and means[1] else None
    prompts = _prompts(eval_job)
    order = list(by_example)
    differs = [e for e in order if (by_example[e].get("candidate") or {}).get("outcome")
               != (by_example[e].get("incumbent") or {}).get("outcome")]
    chosen = (differs + [e for e in order if e not in differs])[:MAX_SAMPLES]
    samples = []
    for example_id in chosen:
        pair = by_example[example_id]
        samples.append({"example_id": example_id, "prompt": _clip(prompts.get(example_id)),
                        "candidate": _clip((pair.get("candidate") or {}).get("completion")),
                        "incumbent": _clip((pair.get("incumbent") or {}).get("completion")),
                        "candidate_outcome": (pair.get("candidate") or {}).get("outcome"),
                        "incumbent_outcome": (pair.get("incumbent") or {}).get("outcome")})
    return lengths, samples
