"""One candidate's episode: a fresh session, the reset, then model turns until an outcome (reference-spec §4.4).

Pure module: no Django, no torch. Each turn asks the injected policy for an action while the
session is kept alive (Ping/Pong plus read-only `state`), keeps reasoning + answer as the action
segment, parses and validates only the final answer (a failure ends the candidate as
`invalid_model_action` and never contacts the server), steps it, and records the exchange.
Outcomes: `done`, `max_steps`, `invalid_model_action` (MODEL_ACTION_NO_OUTPUT,
INVALID_MODEL_ACTION, ACTION_SCHEMA_VALIDATION_FAILED), `protocol_error` (a terminal wire code, or
one recoverable error more than `max_recoverable_errors`). Each model failure and each protocol
error adds `protocol_error_reward`; step rewards map null/false 0, true 1; the reset reward is
recorded but not counted. The final `state` is read unless a terminal code ended the session.
Any other client error (a poisoned session, capacity exhaustion) fails the whole collection.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

from core.contracts.groups import MAX_REWARD_MAGNITUDE, REWARD_RANGE
from openenv.client.actions import generation_seed, parse_and_validate_action, reward_value
from openenv.client.errors import ActionError, OpenEnvProtocolError
from openenv.client.frames import ErrorFrame, Observation
from openenv.client.session import open_episode
from openenv.collector import prompts
from openenv.collector.budget import RetainedBudget
from openenv.collector.errors import CollectionError
from openenv.collector.policy import Policy, PolicyReply, PolicyRequest, Sampling

NO_STATE = object()


@dataclass
class EpisodeSettings:
    max_steps: int
    sampling: Sampling
    protocol_error_reward: float
    max_recoverable_errors: int
    capacity_wait_seconds: float
    keepalive_interval_s: float = 10.0
    request_timeout_s: float = 60.0


@dataclass
class CandidateResult:
    candidate_index: int
    reset: Observation
    capacity_retries: int
    prompt: list[dict]
    trajectory: list[dict] = field(default_factory=list)
    exchanges: list[dict] = field(default_factory=list)
    contributions: list[float] = field(default_factory=list)
    final_state: Any = NO_STATE
    termination: str = "max_steps"
    protocol_error_code: str | None = None
    harness_error: dict | None = None
    recoverable_protocol_errors: int = 0
    model_tokens: int = 0
    model_latency_ms: float = 0.0

    @property
    def terminal_done(self) -> bool:
        return self.termination == "done"

    @property
    def episode_return(self) -> float:
        return sum_contributions(self.contributions)


def sum_contributions(contributions: list[float]) -> float:
    total = 0.0
    for value in contributions:  # in order, plain float addition: what verify recomputes
        total += value
    if not math.isfinite(total):
        raise CollectionError("openenv_invalid_reward", "the episode return is not finite")
    if abs(total) > MAX_REWARD_MAGNITUDE:  # what the corpus checker would refuse after every episode ran
        raise CollectionError("openenv_invalid_reward", f"the episode return {total:.3g} is out of range: it must "
                              f"be {REWARD_RANGE}")
    return total


class BehaviorWitness:
    """The behavior policy of the first reply; every later reply must carry the same one."""

    def __init__(self):
        self.policy: dict | None = None

    def observe(self, reply: PolicyReply, where: str) -> None:
        if not isinstance(reply, PolicyReply):
            raise CollectionError("openenv_policy_response_invalid", f"{where}: the policy returned "
                                  f"{type(reply).__name__}, not a PolicyReply", failure_code="training_evidence_invalid")
        if self.policy is None:
            self.policy = dict(reply.behavior_policy)
        elif reply.behavior_policy != self.policy:
            changed = sorted(k for k in set(self.policy) | set(reply.behavior_policy)
                             if self.policy.get(k) != reply.behavior_policy.get(k))
            raise CollectionError("openenv_behavior_policy_changed",
                                  f"{where}: the behavior policy changed during the collection ({', '.join(changed)})",
                                  failure_code="training_evidence_invalid",
                                  hint="the served model or adapter changed; collect again with one policy")


async def run_candidate(*, endpoint, credential, environment: dict, action_schema, group_index: int, seed: int,
                        reset_payload: dict, candidate_index: int, policy: Policy, settings: EpisodeSettings,
                        budget: RetainedBudget, witness: BehaviorWitness) -> CandidateResult:
    start = await open_episode(endpoint, reset_payload, credential=credential,
                               capacity_wait_seconds=settings.capacity_wait_seconds,
                               request_timeout=settings.request_timeout_s)
    session = start.session
    try:
        reset_json = start.observation.to_json()
        budget.charge_json(reset_json, "the reset observation")
        result = CandidateResult(candidate_index, start.observation, start.capacity_retries,
                                 prompts.prompt_messages(environment, reset_json))
        await _turns(result, session, action_schema=action_schema, group_index=group_index, seed=seed,
                     policy=policy, settings=settings, budget=budget, witness=witness)
        if session.usable:
            result.final_state = await session.state()
            budget.charge_json(result.final_state, "the final state")
        return result
    finally:
        await session.close()


async def _turns(result: CandidateResult, session, *, action_schema, group_index, seed, policy, settings, budget,
                 witness) -> None:
    history: list[dict] = []
    thinking = settings.sampling.thinking
    for step_index in range(settings.max_steps):
        where = f"group {group_index} candidate {result.candidate_index} step {step_index}"
        request = PolicyRequest(messages=[*result.prompt, *history],
                                seed=generation_seed(seed, result.candidate_index, step_index),
                                sampling=settings.sampling, group_index=group_index,
                                candidate_index=result.candidate_index, step_index=step_index)
        started = time.perf_counter()
        reply = await session.keep_alive_while(policy(request), interval_s=settings.keepalive_interval_s)
        result.model_latency_ms = round(result.model_latency_ms + (time.perf_counter() - started) * 1000, 3)
        witness.observe(reply, where)
        result.model_tokens += int(reply.tokens)
        text = prompts.action_text(reply.reasoning, reply.content, thinking)
        budget.charge(len(text.encode("utf-8", "surrogatepass")), "a model action")
        result.trajectory.append(prompts.action_segment(text))
        try:
            action = parse_and_validate_action(reply.content, action_schema)
        except ActionError as exc:
            result.harness_error = {"code": exc.code, "message": exc.message, **({"errors": exc.errors} if exc.errors else {})}
            result.trajectory.append(prompts.harness_error_segment(exc.code, exc.message))
            result.contributions.append(float(settings.protocol_error_reward))
            result.termination = "invalid_model_action"
            return
        history.append(prompts.assistant_message(reply.reasoning, reply.content, thinking))
        budget.charge_json(action, "an action")
        try:
            outcome = await session.step(action)
        except OpenEnvProtocolError as exc:  # a terminal wire code: the session is over, no final state
            error = exc.frame.to_json()
            budget.charge_json(error, "a protocol error")
            result.exchanges.append({"step_index": step_index, "action": action,
                                     "result": {"kind": "protocol_error", "error": error, "continued": False}})
            result.trajectory.append(prompts.protocol_error_segment(error, recoverable=False, done=True))
            result.contributions.append(float(settings.protocol_error_reward))
            result.termination, result.protocol_error_code = "protocol_error", exc.frame.code
            return
        if isinstance(outcome, Observation):
            wire = outcome.to_json()
            budget.charge_json(wire, "an observation")
            try:
                result.contributions.append(reward_value(outcome.reward))
            except Exception as exc:  # noqa: BLE001 - the frame parser already refuses non-finite rewards
                raise CollectionError.from_client(exc, stage="collection") from None
            result.exchanges.append({"step_index": step_index, "action": action,
                                     "result": {"kind": "observation", "observation": wire}})
            content = prompts.observation_text(wire, "step")
            result.trajectory.append(prompts.observation_segment(content))
            history.append(prompts.tool_message(content))
            if outcome.done:
                result.termination = "done"
                return
            continue
        assert isinstance(outcome, ErrorFrame)
        error = outcome.to_json()
        budget.charge_json(error, "a protocol error")
        result.recoverable_protocol_errors += 1
        result.contributions.append(float(settings.protocol_error_reward))
        continued = result.recoverable_protocol_errors <= settings.max_recoverable_errors
        result.exchanges.append({"step_index": step_index, "action": action,
                                 "result": {"kind": "protocol_error", "error": error, "continued": continued}})
        segment = prompts.protocol_error_segment(error, recoverable=True, done=not continued)
        result.trajectory.append(segment)
        if not continued:
            result.termination, result.protocol_error_code = "protocol_error", outcome.code
            return
        history.append(prompts.tool_message(segment["content"]))
    result.termination = "max_steps"
