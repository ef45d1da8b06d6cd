"""Live replay of an OpenEnv collection: verify first, then run the exact transcript again (reference-spec §2.6, §2.8).

Pure module: no Django, no torch. `replay(summary_path, ...)` verifies the three files offline
(`openenv.verify`), inspects every recorded environment (the identity, discovery digest and
schemas must be the recorded ones, with the same authentication method in each slot; a token
may rotate), then for every candidate opens a fresh session with the recorded reset payload and
compares the reset observation, sends each recorded action (never a model) and compares each
result, and reads the final state when one was recorded. The answer is `matched`, or the first
divergence in (group, candidate, step) order with the JSON path of the first differing field.
Candidates that ended without the environment saying done (max steps, a model failure, a
protocol error) replay as a prefix of an episode (`environment_prefix_only_rollouts`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from openenv.client.credentials import Credential
from openenv.client.discovery import identity_differences, inspect
from openenv.client.errors import OpenEnvError, OpenEnvProtocolError
from openenv.client.frames import Observation
from openenv.client.session import open_episode
from openenv.client.urls import normalize_url
from openenv.collector.collect import _bounded
from openenv.collector.errors import DEFAULT_HINTS, CollectionError
from openenv.json_compare import first_difference, json_equal
from openenv.verify import verify

REPLAY_RUN_SCHEMA = "kiln.openenv-replay-run.v1"


ABSENT = object()  # a field one side of a divergence lacks (null would read as a value)


def _divergence(group: dict, candidate: dict, step, field: str, expected, actual) -> dict:
    return {"group_index": group["group_index"], "candidate_index": candidate["candidate_index"],
            "step_index": step, "field": field, "expected": expected, "actual": actual}


def _compare(group, candidate, step, field, expected, actual) -> dict | None:
    if json_equal(actual, expected):
        return None
    path = first_difference(actual, expected, field)
    was, now = _pick(expected, path, field), _pick(actual, path, field)
    divergence = _divergence(group, candidate, step, path, None if was is ABSENT else was, None if now is ABSENT else now)
    if ABSENT in (was, now):  # a field added or removed: say which side lacks it (null would read as a value)
        divergence["absent"] = "expected" if was is ABSENT else "actual"
    return divergence



def _pick(value, path: str, root: str):
    """The value at `path` (relative to `root`) for a short divergence report; ABSENT where it has none."""
    import re

    for part in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path[len(root):]):
        key, index = part
        try:
            value = value[key] if key else value[int(index)]
        except (KeyError, IndexError, TypeError):
            return ABSENT
    return value


async def _replay_candidate(environment, credential, group, candidate, capacity_wait_seconds: float):
    endpoint = normalize_url(environment["identity"]["base_url"])
    start = await open_episode(endpoint, group["reset_payload"], credential=credential,
                               capacity_wait_seconds=capacity_wait_seconds)
    session = start.session
    try:
        found = _compare(group, candidate, None, "reset_observation", group["reset_observation"],
                         start.observation.to_json())
        if found:
            return found, start.capacity_retries, 0
        sent = 0
        for exchange in candidate["exchanges"]:
            step = exchange["step_index"]
            try:
                outcome = await session.step(exchange["action"])
            except OpenEnvProtocolError as exc:
                actual = {"kind": "protocol_error", "error": exc.frame.to_json(), "continued": False}
            else:
                if isinstance(outcome, Observation):
                    actual = {"kind": "observation", "observation": outcome.to_json()}
                else:
                    actual = {"kind": "protocol_error", "error": outcome.to_json(),
                              "continued": exchange["result"].get("continued", True)}
            sent += 1
            found = _compare(group, candidate, step, "result", exchange["result"], actual)
            if found:
                return found, start.capacity_retries, sent
        if "final_state" in candidate:
            final = len(candidate["exchanges"])  # after the last exchange
            if not session.usable:
                return _divergence(group, candidate, final, "final_state", candidate["final_state"], None), \
                    start.capacity_retries, sent
            state = await session.state()
            found = _compare(group, candidate, final, "final_state", candidate["final_state"], state)
            if found:
                return found, start.capacity_retries, sent
        return None, start.capacity_retries, sent
    finally:
        await session.close()


async def replay_async(summary_path: Path | str, *, dataset_path=None, replay_path=None,
                       credentials: list[Credential | None] | None = None, concurrency: int = 4,
                       capacity_wait_seconds: float = 300.0, on_progress=None) -> dict:
    verified = verify(summary_path, dataset_path=dataset_path, replay_path=replay_path)
    replay = verified.replay
    environments = replay["environments"]
    credentials = credentials or [None] * len(environments)
    if len(credentials) != len(environments):
        raise CollectionError("openenv_credential_invalid", f"{len(credentials)} credential slots for "
                              f"{len(environments)} recorded environments", stage="admission",
                              failure_code="persisted_contract_invalid")
    for environment, credential in zip(environments, credentials, strict=True):
        method = "bearer" if credential is not None else "none"
        if environment["identity"]["authentication"] != method:
            raise CollectionError("openenv_credential_invalid", f"{environment['identity']['base_url']} was collected "
                                  f"with authentication {environment['identity']['authentication']}, not {method}",
                                  stage="admission", failure_code="persisted_contract_invalid",
                                  hint="supply a credential in the same position with the same method")
    try:
        live = await asyncio.gather(*(inspect(normalize_url(e["identity"]["base_url"]), credential=c)
                                      for e, c in zip(environments, credentials, strict=True)))
    except OpenEnvError as exc:
        raise CollectionError.from_client(exc, stage="discovery") from None
    for environment, inspection in zip(environments, live, strict=True):
        recorded = _RecordedInspection(environment)
        changed = identity_differences(recorded, inspection)
        if changed:
            raise CollectionError("environment_identity_changed",
                                  f"{inspection.endpoint.base_url} is not the recorded environment ({', '.join(changed)})",
                                  stage="identity_verification", failure_code="environment_identity_changed",
                                  # another deployment answers at the URL; the server itself is not at fault
                                  hint=DEFAULT_HINTS["environment_identity_changed"])
    work = [(group, candidate) for group in replay["groups"] for candidate in group["candidates"]]
    done = 0

    def factory(group, candidate):
        async def run():
            nonlocal done
            env = group["environment_index"]
            try:
                out = await _replay_candidate(environments[env], credentials[env], group, candidate,
                                              capacity_wait_seconds)
            except OpenEnvError as exc:
                raise CollectionError.from_client(exc, stage="collection") from None
            done += 1
            if on_progress is not None:
                on_progress(done, len(work), f"group {group['group_index']} candidate {candidate['candidate_index']}")
            return out
        return run

    results = await _bounded([factory(g, c) for g, c in work], concurrency)
    divergences = [r[0] for r in results if r[0] is not None]
    report = {"schema": REPLAY_RUN_SCHEMA, "replay_sha256": verified.summary["replay_sha256"],
              "environments": len(environments), "groups": len(replay["groups"]), "rollouts": len(work),
              "environment_exchanges": sum(r[2] for r in results), "capacity_retries": sum(r[1] for r in results),
              "environment_prefix_only_rollouts": sum(1 for _, c in work if not c["terminal_done"])}
    if divergences:
        first = min(divergences, key=lambda d: (d["group_index"], d["candidate_index"],
                                                -1 if d["step_index"] is None else d["step_index"]))
        report.update(outcome="diverged", divergence=first)
    else:
        report["outcome"] = "matched"
    return report


def replay(summary_path: Path | str, **kwargs) -> dict:
    return asyncio.run(replay_async(summary_path, **kwargs))


class _RecordedInspection:
    """The recorded `{identity, schema}` shaped like an Inspection for `identity_differences`."""

    def __init__(self, environment: dict):
        self.identity = environment["identity"]
        self.schema = environment["schema"]
