"""Shared by the environment-evaluation tests: deterministic counter policies of known skill and the
closed-form episode return each earns on the interop counter (tests/openenv/interop_env).

With `max_steps=1` and no reset target, a group seed s has target t = (s % 7) - 3 and one move:
- `skilled` moves straight at the target (|move| <= 3, never 0): return |t|, or -1 when t = 0;
- `naive` always moves +1: return 1 when t > 0, else -1.
So skilled beats naive on t in {-3, -2, -1, 2, 3} and ties on t in {0, 1}.
"""

from __future__ import annotations

import asyncio
import json

from openenv.collector import CollectionConfig, PolicyReply
from tests.openenv.collector_fakes import FAKE_BEHAVIOR, last_observation


def adapter_sha(name: str) -> str:
    return "sha256:" + name.encode().hex().ljust(64, "0")[:64]


def behavior_for(adapter: str | None, **changes) -> dict:
    out = {**FAKE_BEHAVIOR, **changes}
    if adapter is not None:
        out["adapter"] = {"name": adapter, "content_sha256": adapter_sha(adapter)}
    return out


class CounterPolicy:
    def __init__(self, skill: str, adapter: str | None, **behavior_changes):
        self.skill, self.adapter = skill, adapter
        self.behavior = behavior_for(adapter, **behavior_changes)
        self.requests = []

    def move(self, observation) -> int:
        if self.skill == "naive":
            return 1
        distance = observation["target"] - observation["value"]
        return max(-3, min(3, distance)) or 1

    async def __call__(self, request):
        self.requests.append(request)
        await asyncio.sleep(0)
        content = json.dumps({"delta": self.move(last_observation(request.messages))})
        return PolicyReply(content=content, reasoning="thinking" if request.sampling.thinking else None,
                           behavior_policy=dict(self.behavior), tokens=len(content))


def expected_return(skill: str, seed: int) -> float:
    target = (seed % 7) - 3
    if skill == "naive":
        return 1.0 if target > 0 else -1.0
    return float(abs(target)) if target else -1.0


class Factory:
    """policy_factory for run_environment_eval: adapter name -> a CounterPolicy of the configured skill."""

    def __init__(self, skills: dict, behavior_changes: dict | None = None, before=None):
        self.skills, self.behavior_changes, self.before = skills, behavior_changes or {}, before
        self.made: dict = {}

    def __call__(self, adapter):
        if self.before is not None:
            self.before(adapter)
        policy = CounterPolicy(self.skills[adapter], adapter, **self.behavior_changes.get(adapter, {}))
        self.made[adapter] = policy
        return policy


def base_config(url: str, tmp_path, **overrides) -> CollectionConfig:
    """The training collection a run would have made: 4 groups from seed 100, one step per episode."""
    values = {"groups": 4, "group_size": 2, "seed_start": 100, "max_steps": 1, "concurrency": 4,
              "capacity_wait_seconds": 5.0, "thinking": False, "keepalive_interval_s": 5.0,
              "output_path": tmp_path / "train" / "rollouts.jsonl", "replay_output_path": tmp_path / "train" / "replay.json",
              "summary_output_path": tmp_path / "train" / "summary.json"}
    values.update(overrides)
    return CollectionConfig(environment_urls=[url], **values).check()
