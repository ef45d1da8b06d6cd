"""A train receipt laid out for a page: the blocks the adapter page and the training job page show.

Reads the receipt dict only; decides nothing. Web-facing: no torch.
"""

from __future__ import annotations

# Receipt blocks shown as facts, in this order: (key in the receipt, heading).
RECEIPT_FACT_BLOCKS = (
    ("data", "Data"),
    ("rewards", "Rewards"),
    ("token_counts", "Token counts"),
    ("hyperparameters", "Hyperparameters"),
)
POLICY_AUDIT_BLOCKS = (
    ("importance_sampling", "Importance sampling (vs the behavior policy)"),
    ("kl_reference", "KL reference (before kl_coeff)"),
    ("recorded_provenance", "Recorded provenance"),
)


def _timing_bars(receipt: dict) -> list[dict]:
    timings = receipt.get("phase_timings")
    if not isinstance(timings, dict):
        return []
    rows = [(name, value) for name, value in timings.items()
            if name.endswith("_ms") and isinstance(value, int | float) and not isinstance(value, bool)]
    top = max((value for _, value in rows), default=0) or 1
    bars = [{"name": name.removesuffix("_ms"), "ms": value, "pct": max(0.5, 100 * value / top)}
            for name, value in rows]
    others = {name: value for name, value in timings.items() if (name, value) not in rows}
    return bars + [{"name": name, "value": value} for name, value in others.items()]


def receipt_view(receipt) -> dict | None:
    """The blocks of a train_receipt.json that the pages show, or None without a receipt."""
    if not isinstance(receipt, dict):
        return None
    grpo = receipt.get("grpo") if isinstance(receipt.get("grpo"), dict) else {}
    audit = grpo.get("policy_audit") if isinstance(grpo.get("policy_audit"), dict) else None
    runtime = receipt.get("runtime") if isinstance(receipt.get("runtime"), dict) else {}
    histogram = (receipt.get("rewards") or {}).get("group_variance_histogram") \
        if isinstance(receipt.get("rewards"), dict) else None
    histogram = [row for row in histogram if isinstance(row, dict)] if isinstance(histogram, list) else []
    top = max((row.get("count") or 0 for row in histogram), default=0) or 1
    return {
        "raw": receipt,
        "status": receipt.get("status"),
        "failure_reason": receipt.get("failure_reason"),
        "failure_message": receipt.get("failure_message"),
        "produced_at": receipt.get("produced_at"),
        "receipt_type": receipt.get("receipt_type"),
        "schema_version": receipt.get("schema_version"),
        "policy_audit": [(title, audit.get(key)) for key, title in POLICY_AUDIT_BLOCKS
                         if isinstance(audit.get(key), dict)] if audit else [],
        "policy_audit_schema": audit.get("schema") if audit else None,
        "grpo": {k: v for k, v in grpo.items() if k != "policy_audit"},
        "timings": _timing_bars(receipt),
        "wall_clock_ms": runtime.get("wall_clock_ms"),
        "peak_vram_mib": runtime.get("peak_vram_mib"),
        "fact_blocks": [(title, {k: v for k, v in receipt[key].items() if k != "group_variance_histogram"})
                        for key, title in RECEIPT_FACT_BLOCKS if isinstance(receipt.get(key), dict)],
        "histogram": [{**row, "pct": 100 * (row.get("count") or 0) / top} for row in histogram],
    }
