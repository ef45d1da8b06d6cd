"""A third OpenEnv environment for the demo model: pick the colour the customer wants.

Served by openenv==0.10.0 from its own virtual environment (tests/openenv/real_server.py copies this
file out and runs it with uvicorn). Kiln never imports it: our package shares the name `openenv`.
Its action field `color` is one of the names the demo model's second warm-up phase holds out
(`gpu_runtime.tiny_schema_tasks.is_held_out_key`), and its value is an enum, so an episode that gets
past its first action shows the model copying a key it was never trained to write.
"""

from typing import Any, Literal

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field

COLOURS = ("blue", "green", "red", "yellow")
TRIES = 3


class PaintAction(Action):
    color: Literal["blue", "green", "red", "yellow"] = Field(..., description="The paint to use")


class PaintObservation(Observation):
    input_text: str = Field(default="")


class PaintState(State):
    wanted: str = "blue"


class PaintEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = PaintState(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> PaintObservation:
        self._state = PaintState(episode_id=episode_id or f"seed-{seed}", step_count=0,
                                 wanted=COLOURS[(seed or 0) % len(COLOURS)])
        return PaintObservation(input_text="A customer wants the wall painted. Pick a paint.", reward=None, done=False)

    def step(self, action: PaintAction, timeout_s: float | None = None, **kwargs: Any) -> PaintObservation:
        self._state.step_count += 1
        if action.color == self._state.wanted:
            return PaintObservation(input_text="The customer is happy.", reward=1.0, done=True)
        return PaintObservation(input_text=f"The customer does not want {action.color}.", reward=0.0,
                                done=self._state.step_count >= TRIES)

    @property
    def state(self) -> PaintState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name="paint_shop", description="Choose the paint a customer wants.",
                                   version="0.1.0")


app = create_app(PaintEnvironment, PaintAction, PaintObservation, env_name="paint_shop",
                 max_concurrent_envs=8, state_cls=PaintState)
