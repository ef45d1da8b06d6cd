"""What a reviewer decides a promotion on (the evidence) and the reward-hacking alarms raised from it.

`promotion_evidence(adapter=...)` gathers the post-eval gate evidence, the train receipt's reward
statistics and the reward trend; `promotion_alarms(evidence)` names the reasons a promotion must not be
applied automatically. Reads only; adapters.promotions stores the result with the promotion row.
"""

from __future__ import annotations

from adapters.models import Adapter
from core.models import Receipt, ReceiptKind

EVIDENCE_SCHEMA = "kiln.promotion-evidence.v1"
TREND_WINDOW = 4  # the reward trend compares the mean of the first and last quarter (at least one point)


def _points(history) -> list[float]:
    values = []
    for point in history or []:
        value = point.get("reward_mean") if isinstance(point, dict) else point
        if isinstance(value, int | float) and not isinstance(value, bool):
            values.append(float(value))
    return values


def reward_trend(history) -> dict | None:
    """First vs last of a reward history (floats or {"step", "reward_mean"} points): the mean of the
    first and of the last quarter (at least one point each). None with fewer than two points."""
    values = _points(history)
    if len(values) < 2:
        return None
    window = max(1, len(values) // TREND_WINDOW)
    first, last = sum(values[:window]) / window, sum(values[-window:]) / window
    return {"points": len(values), "window": window, "first": first, "last": last, "rose": last > first}


def _train_receipt_row(adapter: Adapter) -> Receipt | None:
    rows = Receipt.objects.filter(kind=ReceiptKind.TRAIN, subject=adapter.name)
    if adapter.training_job_id:
        rows = rows.filter(job_id=adapter.training_job_id)
    return rows.order_by("-created_at", "-id").first()


def _gate_of(adapter: Adapter) -> tuple[dict | None, str | None]:
    """The post-eval gate evidence of the adapter's training job, and the post-eval job id."""
    from core.jobs.models import Job

    job = adapter.training_job
    post_id = (job.result or {}).get("post_eval_job_id") if job is not None else None
    post = Job.objects.filter(uuid=post_id).first() if post_id else None
    if post is None:
        return None, None
    evidence = ((post.result or {}).get("post_eval_gate_evidence") or [None])[0]
    return (evidence if isinstance(evidence, dict) else None), str(post.uuid)


def promotion_evidence(*, adapter: Adapter, gate: dict | None = None, post_eval_job_id: str | None = None) -> dict:
    """What a reviewer decides on: the gate evidence (given, else the adapter's post-eval), the train
    receipt's reward statistics and the reward trend (the receipt's history, else the job's curve)."""
    if gate is None:
        gate, found = _gate_of(adapter)
        post_eval_job_id = post_eval_job_id or found
    row = _train_receipt_row(adapter)
    receipt = row.body if row is not None and isinstance(row.body, dict) else {}
    history = receipt.get("reward_history") or (receipt.get("rewards") or {}).get("history")
    source = "train_receipt" if history else None
    if not history and adapter.training_job is not None:
        history = (adapter.training_job.metrics or {}).get("reward_history")
        source = "training_job_metrics" if history else None
    trend = reward_trend(history)
    return {"schema": EVIDENCE_SCHEMA, "candidate": adapter.name, "candidate_content_sha256": adapter.content_sha256,
            "training_job_id": str(adapter.training_job.uuid) if adapter.training_job_id else None,
            "post_eval_job_id": post_eval_job_id, "gate": gate,
            "train_receipt_sha256": row.sha256 if row is not None else None,
            "reward_statistics": receipt.get("rewards"),
            "reward_trend": {**trend, "source": source} if trend else None}


def promotion_alarms(evidence: dict) -> list[str]:
    """Reward-hacking reasons: training reward rose while the held-out candidate accuracy is below the
    baseline's (both needed; missing figures raise no alarm)."""
    alarms = []
    trend = evidence.get("reward_trend") or {}
    gate = evidence.get("gate") or {}
    candidate, baseline = gate.get("candidate_accuracy"), gate.get("baseline_accuracy")
    if trend.get("rose") and isinstance(candidate, int | float) and isinstance(baseline, int | float) \
            and candidate < baseline:
        alarms.append(f"training reward rose ({trend['first']:.4g} -> {trend['last']:.4g}) while the held-out "
                      f"accuracy fell below the baseline's ({candidate:.4g} < {baseline:.4g})")
    return alarms
