"""The shipped demo model collects real episodes through Kiln's collector, with returns that differ in a group.

Real environments served by openenv==0.10.0 in their own venv, none of them in the warm-up: the
counter (examples/openenv-counter/counter_env.py, an integer field named like the warm-up's),
a number-guessing game (kiln_guess_env.py, field `guess`) and a paint shop (kiln_paint_env.py, an
enum field `color`, a name the recipe's second phase holds out). The policy is the real sampler over
the release, answering Kiln's own system prompt at the collector's default temperature, thinking
off and on. An episode whose first action fails validation ends `invalid_model_action` with the
protocol-error reward, so returns differ within a group only when the model acts validly often
enough.

The release's second warm-up phase taught it to copy field names from the schema (its third, enum
members and integer bounds), so `guess` works with thinking off (the previous release answered every environment with `{"delta": ...}` and every
episode ended at its first action). What it still misses is marked `GAP` below and measured in
docs/tiny-model.md, "OpenEnv environments with any action fields".
"""

from __future__ import annotations

import asyncio
import json

import pytest

from gpu_runtime.model_loading import load_model
from gpu_runtime.sample_types import SampleRequest
from gpu_runtime.sampler import Sampler
from gpu_runtime.sampling import SamplingParams
from openenv.collector import PolicyReply
from tests.openenv.collector_fakes import config_for, run_collection
from tests.openenv.real_server import ENV_SOURCE, TEST_ENVS, RealServer, openenv_python

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

GUESS_ENV = TEST_ENVS / "kiln_guess_env.py"
PAINT_ENV = TEST_ENVS / "kiln_paint_env.py"
GROUPS, GROUP_SIZE = 6, 4
MAX_INVALID_SHARE = 0.75  # at most this share of episodes may end at an invalid action
# At least this many groups must have returns that differ. Not all: a group can also be equal
# because every episode solved it alike (the release guesses a range's low end first, and seed 0's
# secret is 1: four returns of 1.0), which is success, not the failure guarded here (every episode
# ending at an invalid first action).
MIN_CONTRASTED = 4  # of GROUPS (6): two thirds


@pytest.fixture(scope="module")
def loaded(tiny_model_dir):
    return load_model(tiny_model_dir)


@pytest.fixture(scope="module")
def sampler(loaded):
    return Sampler(loaded)


class SamplerPolicy:
    """The collector's policy, answered by the in-process sampler (what `/v1/chat/completions` runs)."""

    def __init__(self, sampler, identity: dict):
        self.sampler = sampler
        self.behavior = {"served_model_id": "kiln-tiny", "base_model_sha256": identity["base_model_sha256"],
                         "inference_config_sha256": identity["inference_config_sha256"],
                         "implementation": "tests-in-process-sampler"}

    async def __call__(self, request):
        sample = SampleRequest(messages=request.messages, seed=request.seed,
                               sampling=SamplingParams(temperature=request.sampling.temperature,
                                                       max_tokens=request.sampling.max_tokens),
                               enable_thinking=request.sampling.thinking)
        result = await asyncio.to_thread(lambda: self.sampler.generate([sample])[0])
        return PolicyReply(content=result.content, reasoning=result.reasoning_content,
                           behavior_policy=dict(self.behavior), tokens=len(result.completion_token_ids))


# Known gaps of the release (docs/tiny-model.md, "OpenEnv environments with any action fields"), measured
# 2026-12-05 on the 1,500-step third phase: paint (a held-out name and an enum) has 20 / 23 of 24
# episodes ending at an invalid action and contrast in 3 / 1 of 6 groups (thinking off / on); `guess`
# with thinking on passes (16 of 24 invalid, the bound 18; contrast in 6 of 6) but was at its bound on
# the previous release. Not strict: they sit near their bounds, and another CPU samples other tokens.
GAP = pytest.mark.xfail(strict=False, reason="a known gap of the demo model (docs/tiny-model.md)")
CASES = [
    pytest.param(ENV_SOURCE, False, id="counter-thinking-off"),
    pytest.param(ENV_SOURCE, True, id="counter-thinking-on"),
    pytest.param(GUESS_ENV, False, id="guess-thinking-off"),
    pytest.param(GUESS_ENV, True, id="guess-thinking-on", marks=GAP),
    pytest.param(PAINT_ENV, False, id="paint-thinking-off", marks=GAP),
    pytest.param(PAINT_ENV, True, id="paint-thinking-on", marks=GAP),
]


@pytest.mark.parametrize(("environment", "thinking"), CASES)
def test_the_demo_model_gets_different_returns_within_groups(sampler, loaded, tmp_path, environment, thinking):
    with RealServer(openenv_python(), tmp_path / "server", module_source=environment) as server:
        config = config_for([server.url], tmp_path, groups=GROUPS, group_size=GROUP_SIZE, max_steps=4,
                            max_action_tokens=64, thinking=thinking)
        bundle = run_collection(config, SamplerPolicy(sampler, loaded.identity))
    stats = bundle.summary_value["stats"]
    groups = [json.loads(line) for line in config.output_path.read_text().splitlines()]
    returns = [[c["reward"] for c in g["completions"]] for g in groups]
    contrasted = sum(len(set(r)) > 1 for r in returns)
    episodes = GROUPS * GROUP_SIZE
    print(f"thinking {thinking}: episodes ended by an invalid action {stats['invalid_model_action_count']}/{episodes}, "
          f"groups with different returns {contrasted}/{GROUPS}, returns {returns}")
    assert stats["invalid_model_action_count"] <= episodes * MAX_INVALID_SHARE
    assert contrasted >= MIN_CONTRASTED
