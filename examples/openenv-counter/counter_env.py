"""The counter: a small multi-step OpenEnv environment (PyPI `openenv==0.10.0`) to try Kiln's OpenEnv loop on.

An episode starts at 0 with a target (the reset option `target`; else drawn by seed from the reset
option `targets`, e.g. [1, 2, 3]; else one of -3..3, by seed). An action `{"delta": n}` with
1 <= |n| <= COUNTER_MAX_DELTA (default 3; it changes the action schema) moves the counter, and the
step reward is how much closer it came. The episode ends at the target or after six moves.
COUNTER_MAX_SESSIONS (default 4) is how many sessions it serves at once.

Serve it with `serve_env.sh` (its own virtual environment: Kiln's own package is also named
`openenv`, so the two never share an interpreter). Kiln's tests serve this same file
(tests/openenv/real_server.py), and some of their environments build on it.
"""

import os
from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field

MAX_DELTA = int(os.environ.get("COUNTER_MAX_DELTA", "3"))
MAX_SESSIONS = int(os.environ.get("COUNTER_MAX_SESSIONS", "4"))


class CountAction(Action):
    delta: int = Field(..., ge=-MAX_DELTA, le=MAX_DELTA, description="Amount to add to the counter")


class CountObservation(Observation):
    value: int = Field(default=0)
    target: int = Field(default=0)
    steps_left: int = Field(default=0)
    input_text: str = Field(default="")


class CountState(State):
    value: int = 0
    target: int = 0
    total_reward: float = 0.0


class CountEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = CountState(episode_id=None, step_count=0)
        self._max_steps = 6
        self._started = False
        self._over = False

    def _observation(self, text, reward, done):
        return CountObservation(value=self._state.value, target=self._state.target,
                                steps_left=self._max_steps - self._state.step_count,
                                input_text=text, reward=reward, done=done)

    def reset(self, seed: int | None = None, episode_id: str | None = None, target: int | None = None,
              targets: list[int] | None = None, **kwargs: Any) -> CountObservation:
        # The goal: `target` when given, else drawn by seed from `targets` (a reset option that shapes
        # the task, e.g. [1, 2, 3]), else one of -3..3.
        if target is not None:
            goal = target
        elif targets:
            goal = int(targets[(seed or 0) % len(targets)])
        else:
            goal = ((seed or 0) % 7) - 3
        self._state = CountState(episode_id=episode_id or f"seed-{seed}", step_count=0, value=0, target=goal)
        self._started, self._over = True, False
        return self._observation(f"The counter is 0. Reach {goal} with moves of at most {MAX_DELTA}.", None, False)

    def step(self, action: CountAction, timeout_s: float | None = None, **kwargs: Any) -> CountObservation:
        if not self._started:
            raise RuntimeError("call reset before step")
        if self._over:
            raise RuntimeError("episode is over; send reset")
        if action.delta == 0:
            raise ValueError("a move of 0 changes nothing")
        before = abs(self._state.target - self._state.value)
        self._state.value += action.delta
        self._state.step_count += 1
        distance = abs(self._state.target - self._state.value)
        reward = float(before - distance)
        self._state.total_reward += reward
        done = distance == 0 or self._state.step_count >= self._max_steps
        self._over = done
        return self._observation(f"The counter is {self._state.value}; the target is {self._state.target}.",
                                 reward, done)

    @property
    def state(self) -> CountState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name="kiln_counter", description="Reach a target with bounded moves.",
                                   version="0.1.0")


app = create_app(CountEnvironment, CountAction, CountObservation, env_name="kiln_counter",
                 max_concurrent_envs=MAX_SESSIONS, state_cls=CountState)
