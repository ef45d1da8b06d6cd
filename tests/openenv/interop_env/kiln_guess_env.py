"""A second OpenEnv environment for the demo model, unlike the counter in every name: guess a number.

Served by openenv==0.10.0 from its own virtual environment (tests/openenv/real_server.py copies this
file out and runs it with uvicorn). Kiln never imports it: our package shares the name `openenv`.
Its action field (`guess`), name and description appear nowhere in the demo model's warm-up, so an
episode that gets past its first action shows that the model copies an unseen schema's key.
"""

from typing import Any

from openenv.core.env_server import Action, Environment, Observation, State, create_app
from openenv.core.env_server.types import EnvironmentMetadata
from pydantic import Field

LOW, HIGH, TRIES = 1, 10, 4


class GuessAction(Action):
    guess: int = Field(..., ge=LOW, le=HIGH, description="Your guess")


class GuessObservation(Observation):
    input_text: str = Field(default="")
    tries_left: int = Field(default=0)


class GuessState(State):
    secret: int = 0


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = GuessState(episode_id=None, step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self._state = GuessState(episode_id=episode_id or f"seed-{seed}", step_count=0,
                                 secret=LOW + (seed or 0) * 7 % (HIGH - LOW + 1))
        return GuessObservation(input_text=f"Guess the hidden number from {LOW} to {HIGH}.", tries_left=TRIES,
                                reward=None, done=False)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        secret, left = self._state.secret, TRIES - self._state.step_count
        if action.guess == secret:
            return GuessObservation(input_text="Correct!", tries_left=left, reward=1.0, done=True)
        hint = "higher" if action.guess < secret else "lower"
        # A little reward for each valid guess, more the closer it is: returns differ within a group.
        reward = 0.1 * (1 - abs(action.guess - secret) / (HIGH - LOW))
        return GuessObservation(input_text=f"Wrong. The number is {hint}.", tries_left=left, reward=reward,
                                done=left <= 0)

    @property
    def state(self) -> GuessState:
        return self._state

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(name="number_guess", description="Find the hidden number with hints.",
                                   version="0.1.0")


app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="number_guess",
                 max_concurrent_envs=8, state_cls=GuessState)
