"""The `kiln_openenv_*` metric families, and what counts them (core.metrics).

Counted where the change happens, in its transaction (openenv.runs.services): a submission accepted or
answered from its idempotency key, a run's typed failure, and each artifact-published collection's
episodes by terminal outcome, recoverable protocol errors, capacity retries, environment steps, policy
tokens and model latency (the numbers of the run's own rollout summary). Counted as they happen:
operations that send an environment a configured credential (openenv.api, openenv.runs.jobs,
openenv.training.evaluation). Read at scrape time: runs tracked, by state. No label names an
environment, adapter, run, key or credential.
"""

from __future__ import annotations

from core.metrics.families import register
from core.metrics.gauges import register_gauge
from core.metrics.services import counter_add
from openenv.collector.errors import FAILURE_CODES, FAILURE_STAGES
from openenv.collector.formats import TERMINATIONS
from openenv.models import OpenEnvRun, RunState

SUBMISSION_STATUSES = ("accepted", "idempotent_replay")
# Where the server sends an environment a bearer credential: an inspection, a task-catalog page, a run's
# collection (discovery and episodes) and its held-out environment evaluation.
AUTHENTICATED_OPERATIONS = ("inspect", "task_catalog", "run", "environment_evaluation")
SUMMARY_COUNTERS = (
    ("kiln_openenv_recoverable_protocol_errors_total", "recoverable_protocol_error_count",
     "Recoverable OpenEnv protocol errors kept as corrective observation turns."),
    ("kiln_openenv_capacity_retries_total", "capacity_retry_count",
     "Fresh OpenEnv sessions opened after a capacity-reached refusal."),
    ("kiln_openenv_environment_steps_total", "total_environment_steps",
     "Environment step exchanges in artifact-published OpenEnv collections."),
    ("kiln_openenv_model_tokens_total", "total_model_tokens",
     "Policy output tokens sampled for artifact-published OpenEnv actions."),
)


def _runs_by_state() -> dict[tuple[str, ...], float]:
    from django.db.models import Count

    return {(row["state"],): row["n"] for row in OpenEnvRun.objects.values("state").annotate(n=Count("id"))}


def register_families() -> None:
    register("kiln_openenv_runs_total", "counter", "OpenEnv run submissions: new runs accepted, and exact retries "
             "answered with the run their idempotency key names.", status=SUBMISSION_STATUSES)
    register("kiln_openenv_run_failures_total", "counter", "OpenEnv runs that failed, by typed failure.",
             stage=FAILURE_STAGES, code=tuple(sorted(FAILURE_CODES)), retryable=("false", "true"))
    register("kiln_openenv_authenticated_operations_total", "counter", "Server-side OpenEnv operations that "
             "sent an environment a configured bearer credential (per environment; no credential, origin or "
             "token is a label).", operation=AUTHENTICATED_OPERATIONS)
    register("kiln_openenv_episode_terminations_total", "counter",
             "Episodes in artifact-published OpenEnv collections, by terminal outcome.", termination=TERMINATIONS)
    for name, _, help in SUMMARY_COUNTERS:
        register(name, "counter", help)
    register("kiln_openenv_model_latency_seconds_total", "counter",
             "Policy inference time spent on artifact-published OpenEnv actions.")
    register_gauge("kiln_openenv_tracked_runs",
                   "OpenEnv runs tracked (kept until their TTL or max_tracked_runs evicts them), by state.",
                   _runs_by_state, state=tuple(RunState.values))


def count_submission(*, replayed: bool) -> None:
    counter_add("kiln_openenv_runs_total", status="idempotent_replay" if replayed else "accepted")


def count_authenticated(operation: str, credentials) -> None:
    """One per environment the operation reaches with a credential (`credentials`: one or None per URL)."""
    counter_add("kiln_openenv_authenticated_operations_total",
                sum(1 for credential in credentials or () if credential is not None), operation=operation)


def count_failure(failure: dict) -> None:
    """`failure` is a checked failure record (openenv.collector.errors: closed code and stage)."""
    counter_add("kiln_openenv_run_failures_total", stage=failure["stage"], code=failure["code"],
                retryable="true" if failure.get("retryable") else "false")


def count_collection(stats: dict) -> None:
    """`stats` is a published summary's statistics (openenv.collector.formats.statistics)."""
    episodes = 0  # every episode ends one way: their sum is the episodes (Prometheus sums them too)
    for termination in TERMINATIONS:
        count = int(stats.get(f"{termination}_count") or 0)
        episodes += count
        counter_add("kiln_openenv_episode_terminations_total", count, termination=termination)
    for name, field, _ in SUMMARY_COUNTERS:
        counter_add(name, int(stats.get(field) or 0))
    # The summary keeps the mean latency (ms, 3 decimals); the total is the mean times the episodes.
    counter_add("kiln_openenv_model_latency_seconds_total", float(stats.get("mean_model_latency_ms") or 0.0)
                * episodes / 1000.0)
