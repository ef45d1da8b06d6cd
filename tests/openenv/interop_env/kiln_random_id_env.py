"""The counter as OpenEnv's own servers behave when a reset names no episode: a random episode id.

`openenv init`'s template and the counter of the protocol notes give such an episode `uuid4()` as its
id, keep it in their state and (the counter) echo it in every observation's metadata. Served by
openenv==0.10.0 from its own virtual environment (tests/openenv/real_server.py copies this file next
to counter_env.py, which it builds on). Kiln never imports it.
"""

import uuid
from typing import Any

from counter_env import MAX_SESSIONS, CountAction, CountEnvironment, CountObservation, CountState
from openenv.core.env_server import create_app


class RandomIdCountEnvironment(CountEnvironment):
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> CountObservation:
        observation = super().reset(seed=seed, episode_id=episode_id or str(uuid.uuid4()), **kwargs)
        self._state.episode_id = episode_id or self._state.episode_id
        return self._with_id(observation)

    def step(self, action: CountAction, timeout_s: float | None = None, **kwargs: Any) -> CountObservation:
        return self._with_id(super().step(action, timeout_s=timeout_s, **kwargs))

    def _with_id(self, observation: CountObservation) -> CountObservation:
        observation.metadata = {"episode_id": self._state.episode_id, "step": self._state.step_count}
        return observation


app = create_app(RandomIdCountEnvironment, CountAction, CountObservation, env_name="kiln_counter",
                 max_concurrent_envs=MAX_SESSIONS, state_cls=CountState)
