"""The three artifacts of a collection, built from its results and rebuilt from the replay by verify.

Pure module: no Django, no torch, no I/O. One function per derived value, so the collector and
`openenv.verify` compute every record, statistic and digest the same way:
- JSONL (`AgenticGroup`, reference-spec §2.1-2.4): `{messages: [system, user(reset)], completions:
  [{text, reward, trajectory, openenv}]}`; `text` joins the action segments with `<TURN_BREAK>`,
  `reward` is the episode return, `openenv` is `kiln.openenv-rollout.v1`.
- Replay (`kiln.openenv-replay.v1`, §2.6) plus `configuration_sha256` (the digest of the
  summary's configuration, so the replay binds the summary's settings) and, on a candidate ended
  by the model, `harness_error: {code, message, errors?}`.
- Summary (`kiln.openenv-rollout-summary.v5`, §2.5): configuration, environments, hashes, `stats`
  and one record per rollout. Pretty JSON with a trailing newline (its one canonical form).
"""

from __future__ import annotations

import json

from core.canonical import json_digest
from openenv.client.actions import reward_value
from openenv.client.discovery import CLIENT_PROFILE
from openenv.collector import prompts
from openenv.collector.episode import NO_STATE

ROLLOUT_SCHEMA = "kiln.openenv-rollout.v1"
REPLAY_SCHEMA = "kiln.openenv-replay.v1"
SUMMARY_SCHEMA = "kiln.openenv-rollout-summary.v5"
CONFIGURATION_SCHEMA = "kiln.openenv-rollout-configuration.v1"
VERIFICATION_SCHEMA = "kiln.openenv-verification.v1"
TERMINATIONS = ("done", "max_steps", "invalid_model_action", "protocol_error")
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024

CONFIGURATION_KEYS = (
    "kiln_url", "adapter", "adapter_label", "behavior_policy", "groups", "group_size", "rollout_count", "seed_start",
    "max_steps", "concurrency", "max_action_tokens", "thinking_budget_tokens", "temperature", "thinking",
    "protocol_error_reward", "max_recoverable_errors", "capacity_wait_seconds", "reset_plan_sha256",
    "output_path", "replay_output_path", "summary_output_path",
)
OPTIONAL_CONFIGURATION_KEYS = frozenset({"thinking_budget_tokens"})
HASH_KEYS = ("dataset_sha256", "dataset_bytes", "replay_sha256", "replay_bytes")
SUMMARY_KEYS = ("schema", *CONFIGURATION_KEYS[:4], "environments", *CONFIGURATION_KEYS[4:], *HASH_KEYS,
                "stats", "rollouts")
# A train run's summary adds these two (v4+): the training selection and the sealed contract.
TRAINING_SUMMARY_KEYS = ("training_selection", "training_contract")


def pretty_bytes(value) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")


def configuration_sha256(summary: dict) -> str:
    config = {key: summary[key] for key in CONFIGURATION_KEYS if key in summary}
    return json_digest({"schema": CONFIGURATION_SCHEMA, **config})


# --- the replay --------------------------------------------------------------------------------

def candidate_contributions(candidate: dict, protocol_error_reward: float) -> list[float]:
    out = []
    for exchange in candidate["exchanges"]:
        result = exchange["result"]
        out.append(reward_value(result["observation"]["reward"]) if result["kind"] == "observation"
                   else float(protocol_error_reward))
    if candidate.get("harness_error") is not None:
        out.append(float(protocol_error_reward))
    return out


def episode_return(contributions: list[float]) -> float:
    total = 0.0
    for value in contributions:
        total += value
    return total


def replay_candidate(result) -> dict:
    """A finished `CandidateResult` as a replay candidate."""
    out = {"candidate_index": result.candidate_index, "exchanges": result.exchanges}
    if result.final_state is not NO_STATE:
        out["final_state"] = result.final_state
    out.update(episode_return=result.episode_return, terminal_done=result.terminal_done,
               termination=result.termination)
    if result.protocol_error_code is not None:
        out["protocol_error_code"] = result.protocol_error_code
    if result.harness_error is not None:
        out["harness_error"] = result.harness_error
    out.update(recoverable_protocol_errors=result.recoverable_protocol_errors,
               capacity_retries=result.capacity_retries, model_tokens=result.model_tokens,
               model_latency_ms=result.model_latency_ms)
    return out


# --- records -----------------------------------------------------------------------------------

def openenv_record(environment: dict, group: dict, candidate: dict, behavior_policy: dict | None) -> dict:
    identity = environment["identity"]
    record = {
        "schema": ROLLOUT_SCHEMA,
        "environment_name": identity["metadata"]["name"],
        "environment_base_url": identity["base_url"],
        "openapi_version": identity["openapi_version"],
        "discovery_sha256": identity["discovery_sha256"],
        "environment_schema_sha256": identity["schema_sha256"],
        "action_schema_sha256": identity["action_schema_sha256"],
        "reset_sha256": json_digest(group["reset_payload"]),
        "seed": group["seed"],
        "steps": len(candidate["exchanges"]),
        "episode_return": candidate["episode_return"],
        "terminal_done": candidate["terminal_done"],
        "termination": candidate["termination"],
    }
    if candidate.get("protocol_error_code") is not None:
        record["protocol_error_code"] = candidate["protocol_error_code"]
    if behavior_policy is not None:
        record["behavior_policy"] = behavior_policy
    return record


def summary_record(environment: dict, group: dict, candidate: dict) -> dict:
    identity = environment["identity"]
    record = {
        "group_index": group["group_index"], "candidate_index": candidate["candidate_index"],
        "environment_name": identity["metadata"]["name"], "environment_url": identity["base_url"],
        "seed": group["seed"], "steps": len(candidate["exchanges"]), "episode_return": candidate["episode_return"],
        "terminal_done": candidate["terminal_done"], "termination": candidate["termination"],
    }
    if candidate.get("protocol_error_code") is not None:
        record["protocol_error_code"] = candidate["protocol_error_code"]
    record.update(recoverable_protocol_errors=candidate["recoverable_protocol_errors"],
                  capacity_retries=candidate["capacity_retries"], model_tokens=candidate["model_tokens"],
                  model_latency_ms=candidate["model_latency_ms"])
    return record


def summary_records(replay: dict) -> list[dict]:
    return [summary_record(replay["environments"][group["environment_index"]], group, candidate)
            for group in replay["groups"] for candidate in group["candidates"]]


def statistics(records: list[dict]) -> dict:
    returns = [r["episode_return"] for r in records]
    total = 0.0
    for value in returns:
        total += value
    latency = 0.0
    for record in records:
        latency += record["model_latency_ms"]
    count = len(records)
    stats = {"mean_episode_return": total / count if count else 0.0}
    if count:
        stats.update(min_episode_return=min(returns), max_episode_return=max(returns))
    for termination in TERMINATIONS:
        stats[f"{termination}_count"] = sum(1 for r in records if r["termination"] == termination)
    stats.update(
        recoverable_protocol_error_count=sum(r["recoverable_protocol_errors"] for r in records),
        capacity_retry_count=sum(r["capacity_retries"] for r in records),
        total_environment_steps=sum(r["steps"] for r in records),
        total_model_tokens=sum(r["model_tokens"] for r in records),
        mean_model_latency_ms=round(latency / count, 3) if count else 0.0,
    )
    return stats


# --- the JSONL ---------------------------------------------------------------------------------

def expected_trajectory_warnings(candidate: dict) -> list[dict]:
    """The non-action segments of a candidate's trajectory, in order, rebuilt from its replay."""
    out = []
    for exchange in candidate["exchanges"]:
        result = exchange["result"]
        if result["kind"] == "observation":
            out.append(prompts.observation_segment(prompts.observation_text(result["observation"], "step")))
        else:
            terminal = not result["continued"]
            recoverable = result["error"]["code"] in ("INVALID_JSON", "UNKNOWN_TYPE", "VALIDATION_ERROR",
                                                      "EXECUTION_ERROR")
            out.append(prompts.protocol_error_segment(result["error"], recoverable=recoverable, done=terminal))
    harness = candidate.get("harness_error")
    if harness is not None:
        out.append(prompts.harness_error_segment(harness["code"], harness["message"]))
    return out


def completion(trajectory: list[dict], record: dict) -> dict:
    texts = [segment["content"] for segment in trajectory if segment["kind"] == "action"]
    return {"text": prompts.TURN_BREAK.join(texts), "reward": record["episode_return"], "trajectory": trajectory,
            "openenv": record}


def replay_document(*, dataset_sha256: str, configuration_digest: str, protocol_error_reward: float,
                    max_steps: int, environments: list[dict], groups: list[dict]) -> dict:
    return {"schema": REPLAY_SCHEMA, "client_profile": CLIENT_PROFILE, "dataset_sha256": dataset_sha256,
            "configuration_sha256": configuration_digest, "protocol_error_reward": protocol_error_reward,
            "max_steps": max_steps, "environments": environments, "groups": groups}
