"""Assemble the GRPO corpus and the run summary from scored rollouts. Pure module.

The corpus is one canonical group per task (spec §2.1): `{"messages": [...], "completions":
[{"text", "reward", "provenance"}, ...]}`, one completion per seed in seed order, written as
compact JSON lines exactly as `core.contracts.groups.admit_groups` re-serialises them, so the file's
SHA-256 (spec §2.7) is the admitted corpus digest the server reports. Everything that is not
training data (latency, token counts, raw scorer output, per-request details) goes to the
summary instead.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter

from core.canonical import sha256_digest
from evaluations.generation.generate import ScoredRollout

SUMMARY_SCHEMA = "kiln.rollout-generate-summary.v1"
HISTOGRAM_DISTINCT_VALUES = 16
HISTOGRAM_BINS = 10


def build_groups(scored: list[ScoredRollout]) -> tuple[list[dict], list[dict]]:
    """(groups, per-group summary rows), in task order; `scored` is in plan order."""
    order: list[str] = []
    by_task: dict[str, list[ScoredRollout]] = {}
    for rollout in scored:
        task_id = rollout.planned.task.id
        if task_id not in by_task:
            order.append(task_id)
            by_task[task_id] = []
        by_task[task_id].append(rollout)
    groups, rows = [], []
    for index, task_id in enumerate(order, start=1):
        members = by_task[task_id]
        groups.append({
            "messages": members[0].planned.body["messages"],
            "completions": [{"text": r.checked.text, "reward": r.reward, "provenance": r.checked.record}
                            for r in members],
        })
        rewards = [r.reward for r in members]
        rows.append({"index": index, "task_id": task_id, "seeds": [r.planned.seed for r in members],
                     "rewards": rewards, "mean_reward": statistics.fmean(rewards),
                     "reward_contrast": max(rewards) != min(rewards)})
    return groups, rows


def corpus_bytes(groups: list[dict]) -> bytes:
    return b"".join(json.dumps(g, separators=(",", ":"), ensure_ascii=False).encode() + b"\n" for g in groups)


def reward_histogram(rewards: list[float]) -> dict:
    """Counts per distinct reward when there are few (binary rewards), else equal-width bins."""
    distinct = sorted(set(rewards))
    if len(distinct) <= HISTOGRAM_DISTINCT_VALUES:
        counts = Counter(rewards)
        return {"kind": "values", "buckets": [{"value": v, "count": counts[v]} for v in distinct]}
    low, high = distinct[0], distinct[-1]
    width = (high - low) / HISTOGRAM_BINS
    counts = [0] * HISTOGRAM_BINS
    for reward in rewards:
        counts[min(int((reward - low) / width), HISTOGRAM_BINS - 1)] += 1
    buckets = []
    for i in range(HISTOGRAM_BINS):
        last = i == HISTOGRAM_BINS - 1
        bucket = {"min_inclusive": low + i * width}
        bucket["max_inclusive" if last else "max_exclusive"] = high if last else low + (i + 1) * width
        bucket["count"] = counts[i]
        buckets.append(bucket)
    return {"kind": "bins", "buckets": buckets}


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(fraction * len(ordered)) - 1))]


def reward_stats(scored: list[ScoredRollout], group_rows: list[dict]) -> dict:
    rewards = [r.reward for r in scored]
    latencies = [r.latency_ms for r in scored]
    flat = [row["task_id"] for row in group_rows if not row["reward_contrast"]]
    return {
        "count": len(rewards),
        "mean_reward": statistics.fmean(rewards),
        "min_reward": min(rewards),
        "max_reward": max(rewards),
        "stdev_reward": statistics.pstdev(rewards),
        "reward_histogram": reward_histogram(rewards),
        "groups": len(group_rows),
        "groups_without_contrast": len(flat),
        "groups_without_contrast_ids": flat,
        "latency_ms": {"mean": statistics.fmean(latencies), "p50": _percentile(latencies, 0.5),
                       "p95": _percentile(latencies, 0.95), "max": max(latencies)},
        "prompt_tokens": sum(r.checked.usage["prompt_tokens"] for r in scored),
        "completion_tokens": sum(r.checked.usage["completion_tokens"] for r in scored),
        "sampled_action_tokens": sum(r.checked.sampled_tokens for r in scored),
        "forced_action_tokens": sum(r.checked.forced_tokens for r in scored),
        "finish_reasons": dict(sorted(Counter(str(r.checked.finish_reason) for r in scored).items())),
    }


def request_rows(scored: list[ScoredRollout], group_rows: list[dict]) -> list[dict]:
    group_of = {row["task_id"]: row["index"] for row in group_rows}
    return [{
        "task_id": r.planned.task.id,
        "seed": r.planned.seed,
        "group_index": group_of[r.planned.task.id],
        "latency_ms": r.latency_ms,
        "prompt_tokens": r.checked.usage["prompt_tokens"],
        "completion_tokens": r.checked.usage["completion_tokens"],
        "sampled_action_tokens": r.checked.sampled_tokens,
        "forced_action_tokens": r.checked.forced_tokens,
        "finish_reason": r.checked.finish_reason,
        "reward": r.reward,
        "scorer_raw_output": r.scorer_raw_output,
        "scorer_elapsed_ms": r.scorer_elapsed_ms,
        "scorer_stderr_tail": r.scorer_stderr_tail,
        "scorer_mechanism": r.mechanism,
        "scorer_sandboxed": r.sandboxed,
    } for r in scored]


def build_summary(*, scored: list[ScoredRollout], group_rows: list[dict], identity: dict, corpus: bytes,
                  run: dict, unsandboxed_requested: bool) -> dict:
    """The summary document. `run` carries the invocation facts (paths, digests, seeds, url...)."""
    mechanisms = sorted({r.mechanism for r in scored})
    sandboxed = all(r.sandboxed for r in scored)
    scorer = {**run.get("scorer", {}), "sandboxed": sandboxed, "mechanisms": mechanisms,
              "unsandboxed_requested": unsandboxed_requested}
    if not sandboxed:
        scorer["warning"] = ("the scorer ran without a sandbox: model output reached it with this user's "
                             "privileges" + (" (--unsandboxed-scorer)" if unsandboxed_requested else ""))
    adapters = {json.dumps(r.checked.adapter, sort_keys=True) for r in scored}
    return {
        "schema": SUMMARY_SCHEMA,
        **{k: v for k, v in run.items() if k != "scorer"},
        "adapter_identity": json.loads(next(iter(adapters))) if len(adapters) == 1 else None,
        "scorer": scorer,
        "output": {**run.get("output", {}), "sha256": sha256_digest(corpus), "bytes": len(corpus),
                   "groups": len(group_rows), "rollouts": len(scored)},
        "identity": identity,
        "stats": reward_stats(scored, group_rows),
        "groups": group_rows,
        "requests": request_rows(scored, group_rows),
    }
