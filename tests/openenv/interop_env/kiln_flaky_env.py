"""The interop counter, but its step raises once per episode, on the second move (openenv==0.10.0).

Served like counter_env.py (tests/openenv/test_collector_interop_faults.py copies both files
out and runs `uvicorn kiln_flaky_env:app`). The server answers the exception with a recoverable
EXECUTION_ERROR frame and keeps the socket and the episode: the same move sent again succeeds.
Kiln never imports this file: our package shares the name `openenv`.
"""

from typing import Any

from counter_env import MAX_SESSIONS, CountAction, CountEnvironment, CountObservation, CountState
from openenv.core.env_server import create_app
from openenv.core.env_server.types import EnvironmentMetadata

FAULT = "the simulator hiccupped; send the move again"


class FlakyEnvironment(CountEnvironment):
    def __init__(self):
        super().__init__()
        self._faulted = False

    def reset(self, *args: Any, **kwargs: Any) -> CountObservation:
        self._faulted = False
        return super().reset(*args, **kwargs)

    def step(self, action: CountAction, timeout_s: float | None = None, **kwargs: Any) -> CountObservation:
        if self._started and not self._over and self._state.step_count == 1 and not self._faulted:
            self._faulted = True
            raise RuntimeError(FAULT)
        return super().step(action, timeout_s=timeout_s, **kwargs)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name="kiln_flaky_counter", version="0.1.0",
                                   description="Reach a target with bounded moves; the second move fails once.")


app = create_app(FlakyEnvironment, CountAction, CountObservation, env_name="kiln_flaky_counter",
                 max_concurrent_envs=MAX_SESSIONS, state_cls=CountState)
