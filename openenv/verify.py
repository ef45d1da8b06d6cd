"""Offline verification of an OpenEnv collection: the JSONL, the replay and the summary (reference-spec §2.5-2.7).

Pure module: no Django, no torch, no network. `verify(summary_path, dataset_path=None,
replay_path=None)` rehashes and cross-checks the three files and reconstructs the seed-free reset
plan; the first inconsistency raises `VerificationError` naming the file and the field. In order:
1. the summary: bounded, strict JSON in its one canonical form (pretty, trailing newline), the
   known fields only, the v5 schema;
2. the files it names (or those given; by default the same file names beside the summary, else the
   stored paths): their bytes and SHA-256 equal the summary's;
3. the replay: schema, client profile, the dataset digest, the digest of the summary's
   configuration, protocol_error_reward and max_steps, the environments;
4. the reset plan: group g has seed seed_start + g, environment g % n, and a reset payload equal to
   its environment's seed-free template plus the seed; the templates hash to `reset_plan_sha256`;
5. every candidate: indexes, step bounds, termination invariants and the episode return recomputed
   from its exchanges; the summary's records and statistics recomputed from the replay;
6. the JSONL: it passes the corpus checker in canonical form, and each group's prompt, each
   completion's `openenv` record, reward, text and non-action segments are the ones the replay
   implies.
Returns a `kiln.openenv-verification.v1` report (plus the parsed documents for replay).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from core.canonical import json_digest, sha256_digest
from core.contracts.groups import GroupError, admit_jsonl
from openenv.client.actions import effective_reset, seed_free
from openenv.client.discovery import CLIENT_PROFILE
from openenv.client.errors import OpenEnvError
from openenv.collector import formats, prompts
from openenv.collector.config import reset_plan_sha256
from openenv.collector.selection import select_for_training
from openenv.json_compare import first_difference, json_equal

MAX_FILE_BYTES = formats.MAX_ARTIFACT_BYTES
ACCEPTED_SUMMARY_SCHEMAS = (formats.SUMMARY_SCHEMA,)
CONTRACT_SCHEMA = "kiln.openenv-training-contract.v1"
REPLAY_KEYS = {"schema", "client_profile", "dataset_sha256", "configuration_sha256", "protocol_error_reward",
               "max_steps", "environments", "groups"}
GROUP_KEYS = {"group_index", "environment_index", "seed", "reset_payload", "reset_observation", "candidates"}
CANDIDATE_KEYS = {"candidate_index", "exchanges", "episode_return", "terminal_done", "termination",
                  "recoverable_protocol_errors", "capacity_retries", "model_tokens", "model_latency_ms"}
CANDIDATE_OPTIONAL = {"final_state", "protocol_error_code", "harness_error"}


class VerificationError(OpenEnvError):
    code = "openenv_verification_failed"
    failure_code = "training_evidence_invalid"
    default_hint = "the three files do not belong together or one was changed; archive and verify them together"

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where = where


@dataclass
class Verified:
    report: dict
    summary: dict
    replay: dict
    groups: list


def _read(path: Path, what: str) -> bytes:
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise VerificationError(what, f"{path} holds {size} bytes; at most {MAX_FILE_BYTES}")
        return path.read_bytes()
    except OSError as exc:
        raise VerificationError(what, f"cannot read {path}: {exc.strerror or exc}") from None


def _strict_json(data: bytes, what: str):
    def refuse(value):
        raise ValueError(f"non-finite number {value}")

    def pairs(items):
        out = {}
        for key, value in items:
            if key in out:
                raise ValueError(f"duplicate key {key!r}")
            out[key] = value
        return out

    try:
        return json.loads(data.decode("utf-8"), parse_constant=refuse, object_pairs_hook=pairs)
    except (UnicodeDecodeError, ValueError) as exc:
        raise VerificationError(what, f"is not valid JSON ({str(exc)[:160]})") from None


def _keys(value, what: str, required: set, optional: set = frozenset()) -> dict:
    if not isinstance(value, dict):
        raise VerificationError(what, "must be a JSON object")
    unknown = sorted(set(value) - required - optional)
    if unknown:
        raise VerificationError(what, f"has unknown fields {unknown[:5]}")
    missing = sorted(required - set(value))
    if missing:
        raise VerificationError(what, f"is missing fields {missing[:5]}")
    return value


def _same(where: str, found, expected) -> None:
    if not json_equal(found, expected):
        raise VerificationError(where, f"is {_short(found)}, expected {_short(expected)}")


def _short(value) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


def _same_deep(where: str, found, expected) -> None:
    if not json_equal(found, expected):
        path = first_difference(found, expected, where)
        raise VerificationError(path, "does not match what the other files imply")


# --- 1. the summary ------------------------------------------------------------------------------

def _summary(data: bytes) -> dict:
    summary = _strict_json(data, "summary")
    if formats.pretty_bytes(summary) != data:
        raise VerificationError("summary", "is not in its canonical form (pretty JSON with a trailing newline); "
                                "the file was edited")
    keys = set(formats.SUMMARY_KEYS)
    _keys(summary, "summary", keys - formats.OPTIONAL_CONFIGURATION_KEYS,
          formats.OPTIONAL_CONFIGURATION_KEYS | set(formats.TRAINING_SUMMARY_KEYS))
    if ("training_contract" in summary) != ("training_selection" in summary):
        raise VerificationError("summary", "a train run's summary carries both training_selection and "
                                "training_contract, or neither")
    if "training_contract" in summary and (not isinstance(summary["training_contract"], dict) or
                                           summary["training_contract"].get("schema") != CONTRACT_SCHEMA):
        raise VerificationError("summary.training_contract", "is not a kiln.openenv-training-contract.v1")
    if summary["schema"] not in ACCEPTED_SUMMARY_SCHEMAS:
        raise VerificationError("summary.schema", f"{_short(summary['schema'])} is not a supported summary version")
    for key in ("groups", "group_size", "rollout_count", "seed_start", "max_steps", "dataset_bytes", "replay_bytes"):
        if isinstance(summary[key], bool) or not isinstance(summary[key], int) or summary[key] < 0:
            raise VerificationError(f"summary.{key}", "must be a non-negative integer")
    for key in ("output_path", "replay_output_path", "summary_output_path"):
        if not isinstance(summary[key], str) or not summary[key]:
            raise VerificationError(f"summary.{key}", "must be a path")
    _same("summary.rollout_count", summary["rollout_count"], summary["groups"] * summary["group_size"])
    if not isinstance(summary["environments"], list) or not summary["environments"]:
        raise VerificationError("summary.environments", "must be a non-empty list")
    return summary


# --- 3-5. the replay -----------------------------------------------------------------------------

def _replay(replay: dict, summary: dict) -> int:
    _keys(replay, "replay", REPLAY_KEYS)
    _same("replay.schema", replay["schema"], formats.REPLAY_SCHEMA)
    _same("replay.client_profile", replay["client_profile"], CLIENT_PROFILE)
    _same("replay.dataset_sha256", replay["dataset_sha256"], summary["dataset_sha256"])
    _same("summary (configuration)", formats.configuration_sha256(summary), replay["configuration_sha256"])
    _same("summary.protocol_error_reward", summary["protocol_error_reward"], replay["protocol_error_reward"])
    _same("summary.max_steps", summary["max_steps"], replay["max_steps"])
    _same_deep("summary.environments", summary["environments"], replay["environments"])
    environments = replay["environments"]
    groups = replay["groups"]
    if not isinstance(groups, list):
        raise VerificationError("replay.groups", "must be a list")
    _same("replay.groups (count)", len(groups), summary["groups"])
    templates: dict[int, dict] = {}
    exchanges = 0
    for g, group in enumerate(groups):
        where = f"replay.groups[{g}]"
        _keys(group, where, GROUP_KEYS)
        _same(f"{where}.group_index", group["group_index"], g)
        _same(f"{where}.environment_index", group["environment_index"], g % len(environments))
        _same(f"{where}.seed", group["seed"], summary["seed_start"] + g)
        payload = group["reset_payload"]
        if not isinstance(payload, dict):
            raise VerificationError(f"{where}.reset_payload", "must be a JSON object")
        template = templates.setdefault(group["environment_index"], seed_free(payload))
        expected = effective_reset(template, group["seed"])
        if json_equal(payload, effective_reset(template, group["seed"], with_episode_id=False)):
            expected = payload  # recorded before Kiln sent an episode id with each reset
        _same_deep(f"{where}.reset_payload", payload, expected)
        _keys(group["reset_observation"], f"{where}.reset_observation", {"observation", "reward", "done"}, {"metadata"})
        candidates = group["candidates"]
        if not isinstance(candidates, list):
            raise VerificationError(f"{where}.candidates", "must be a list")
        _same(f"{where}.candidates (count)", len(candidates), summary["group_size"])
        for c, candidate in enumerate(candidates):
            exchanges += _candidate(candidate, f"{where}.candidates[{c}]", c, replay)
    plan = [templates.get(i, {}) for i in range(len(environments))]
    if len(templates) != len(environments):
        raise VerificationError("replay.groups", "some environment ran no group (groups < environments)")
    _same("summary.reset_plan_sha256", summary["reset_plan_sha256"], reset_plan_sha256(plan))
    return exchanges


def _candidate(candidate, where: str, index: int, replay: dict) -> int:
    _keys(candidate, where, CANDIDATE_KEYS, CANDIDATE_OPTIONAL)
    _same(f"{where}.candidate_index", candidate["candidate_index"], index)
    exchanges = candidate["exchanges"]
    if not isinstance(exchanges, list) or len(exchanges) > replay["max_steps"]:
        raise VerificationError(f"{where}.exchanges", f"must be a list of at most {replay['max_steps']} exchanges")
    for s, exchange in enumerate(exchanges):
        at = f"{where}.exchanges[{s}]"
        _keys(exchange, at, {"step_index", "action", "result"})
        if not isinstance(exchange["action"], dict):
            raise VerificationError(f"{at}.action", "must be a JSON object")
        result = exchange["result"]
        kind = result.get("kind") if isinstance(result, dict) else None
        if kind == "observation":
            _keys(result, f"{at}.result", {"kind", "observation"})
            _keys(result["observation"], f"{at}.result.observation", {"observation", "reward", "done"}, {"metadata"})
        elif kind == "protocol_error":
            _keys(result, f"{at}.result", {"kind", "error", "continued"})
        else:
            raise VerificationError(f"{at}.result.kind", "must be observation or protocol_error")
    steps = [e["step_index"] for e in exchanges]
    if steps != sorted(set(steps)) or any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in steps):
        raise VerificationError(f"{where}.exchanges", "step indexes must increase")
    termination = candidate["termination"]
    if termination not in formats.TERMINATIONS:
        raise VerificationError(f"{where}.termination", f"{_short(termination)} is not a termination")
    _same(f"{where}.terminal_done", candidate["terminal_done"], termination == "done")
    _same(f"{where}.protocol_error_code (present)", "protocol_error_code" in candidate, termination == "protocol_error")
    _same(f"{where}.harness_error (present)", "harness_error" in candidate, termination == "invalid_model_action")
    last = exchanges[-1]["result"] if exchanges else None
    if termination == "done" and not (last and last["kind"] == "observation" and last["observation"]["done"] is True):
        raise VerificationError(f"{where}.termination", "is done, but the last result is not done=true")
    if termination == "protocol_error" and not (last and last["kind"] == "protocol_error" and not last["continued"]):
        raise VerificationError(f"{where}.termination", "is protocol_error, but the last result did not end it")
    if termination == "max_steps" and len(exchanges) != replay["max_steps"]:
        raise VerificationError(f"{where}.termination", "is max_steps, but fewer steps were taken")
    try:
        contributions = formats.candidate_contributions(candidate, replay["protocol_error_reward"])
    except (OpenEnvError, KeyError, TypeError) as exc:
        raise VerificationError(f"{where}.exchanges", f"holds an invalid reward ({exc})") from None
    value = formats.episode_return(contributions)
    if not math.isfinite(value):
        raise VerificationError(f"{where}.episode_return", "is not finite")
    _same(f"{where}.episode_return", candidate["episode_return"], value)
    _same(f"{where}.recoverable_protocol_errors", candidate["recoverable_protocol_errors"],
          sum(1 for e in exchanges if e["result"]["kind"] == "protocol_error"
              and e["result"]["error"].get("code") in ("INVALID_JSON", "UNKNOWN_TYPE", "VALIDATION_ERROR",
                                                       "EXECUTION_ERROR")))
    return len(exchanges)


# --- 6. the JSONL --------------------------------------------------------------------------------

def _dataset(data: bytes, replay: dict, summary: dict) -> list:
    try:
        corpus = admit_jsonl(data)
    except GroupError as exc:
        raise VerificationError(f"dataset {exc.field}", exc.message) from None
    if corpus.jsonl != data:
        raise VerificationError("dataset", "is not in canonical form (compact JSON lines as the corpus checker writes)")
    _same("dataset (groups)", len(corpus.groups), len(replay["groups"]))
    for g, (line, group) in enumerate(zip(corpus.groups, replay["groups"], strict=True)):
        where = f"dataset line {g + 1}"
        environment = replay["environments"][group["environment_index"]]
        _same_deep(f"{where}.messages", line["messages"], prompts.prompt_messages(environment, group["reset_observation"]))
        _same(f"{where}.completions (count)", len(line["completions"]), len(group["candidates"]))
        for c, (completion, candidate) in enumerate(zip(line["completions"], group["candidates"], strict=True)):
            at = f"{where}.completions[{c}]"
            record = formats.openenv_record(environment, group, candidate, summary["behavior_policy"])
            _same_deep(f"{at}.openenv", completion.get("openenv"), record)
            _same(f"{at}.reward", completion["reward"], candidate["episode_return"])
            trajectory = completion.get("trajectory")
            if not isinstance(trajectory, list):
                raise VerificationError(f"{at}.trajectory", "is missing")
            actions = [s for s in trajectory if s.get("kind") == "action"]
            others = [s for s in trajectory if s.get("kind") != "action"]
            _same_deep(f"{at}.trajectory (observations)", others, formats.expected_trajectory_warnings(candidate))
            expected_actions = len(candidate["exchanges"]) + (1 if "harness_error" in candidate else 0)
            _same(f"{at}.trajectory (actions)", len(actions), expected_actions)
            if any(s.get("role") != "assistant" for s in actions):
                raise VerificationError(f"{at}.trajectory", "an action segment is not the assistant's")
            _same(f"{at}.text", completion["text"], prompts.TURN_BREAK.join(s["content"] for s in actions))
    return corpus.groups


def _beside(summary_path: Path, stored: str) -> Path:
    """The file the summary names, looked up first next to the summary itself.

    The guide says to archive the three files together, so an archived copy must be checked against its
    own neighbours, not against the absolute path recorded where it was collected."""
    neighbour = summary_path.parent / Path(stored).name
    return neighbour if neighbour.is_file() else Path(stored)


def verify(summary_path: Path | str, *, dataset_path: Path | str | None = None,
           replay_path: Path | str | None = None) -> Verified:
    summary_path = Path(summary_path)
    summary = _summary(_read(summary_path, "summary"))
    dataset_path = Path(dataset_path or _beside(summary_path, summary["output_path"]))
    replay_path = Path(replay_path or _beside(summary_path, summary["replay_output_path"]))
    dataset = _read(dataset_path, "dataset")
    replay_bytes = _read(replay_path, "replay")
    _same("dataset (bytes)", len(dataset), summary["dataset_bytes"])
    _same("dataset (sha256)", sha256_digest(dataset), summary["dataset_sha256"])
    _same("replay (bytes)", len(replay_bytes), summary["replay_bytes"])
    _same("replay (sha256)", sha256_digest(replay_bytes), summary["replay_sha256"])
    replay = _strict_json(replay_bytes, "replay")
    exchanges = _replay(replay, summary)
    records = formats.summary_records(replay)
    _same("summary.rollouts (count)", len(summary["rollouts"]) if isinstance(summary["rollouts"], list) else None,
          len(records))
    for index, (found, expected) in enumerate(zip(summary["rollouts"], records, strict=True)):
        _same_deep(f"summary.rollouts[{index}]", found, expected)
    _same_deep("summary.stats", summary["stats"], formats.statistics(records))
    groups = _dataset(dataset, replay, summary)
    if "training_selection" in summary:
        _same_deep("summary.training_selection", summary["training_selection"], select_for_training(groups).summary)
    report = {"schema": formats.VERIFICATION_SCHEMA, "summary_path": str(summary_path.resolve()),
              "dataset_path": str(dataset_path.resolve()), "replay_path": str(replay_path.resolve()),
              "dataset_sha256": summary["dataset_sha256"], "replay_sha256": summary["replay_sha256"],
              "groups": len(replay["groups"]), "rollouts": len(records), "environment_exchanges": exchanges}
    return Verified(report, summary, replay, groups)


def reset_plan_digest(replay: dict) -> str:
    """The reset plan the replay implies (for reports)."""
    plan = {}
    for group in replay["groups"]:
        plan.setdefault(group["environment_index"], seed_free(group["reset_payload"]))
    return json_digest([plan[i] for i in sorted(plan)])
