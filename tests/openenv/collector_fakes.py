"""Test doubles for collector tests: a deterministic fake model policy and collection helpers.

`FakeCounterPolicy` is not a model: it reads the counter's value and target from the last
observation in the messages and answers a JSON action, deterministically from the generation
seed (odd seeds move by one, even seeds by up to three), with a fixed fake behavior policy.
"""

from __future__ import annotations

import asyncio
import json

from openenv.collector import CollectionConfig, PolicyReply, collect_and_publish

FAKE_BEHAVIOR = {"served_model_id": "fake-policy", "base_model_sha256": "sha256:" + "04" * 32,
                 "inference_config_sha256": "sha256:" + "05" * 32, "implementation": "tests-fake-policy"}


def last_observation(messages: list[dict]) -> dict:
    """The counter's value and target from the latest observation (harness/protocol errors skipped)."""
    for message in reversed(messages):
        text = message["content"] or ""
        if message["role"] not in ("user", "tool") or text.startswith('{"openenv_'):
            continue
        if text.startswith("OpenEnv "):
            return json.loads(text.split("\n", 1)[1])["observation"]
        numbers = [int(t.strip(".;")) for t in text.replace("-", " -").split() if t.strip(".;").lstrip("-").isdigit()]
        if numbers:
            return {"value": numbers[0], "target": numbers[1] if len(numbers) > 1 else numbers[0]}
    return {"value": 0, "target": 1}


class FakeCounterPolicy:
    def __init__(self, *, reasoning: str | None = "thinking about the counter", content=None, behavior=None):
        self.requests = []
        self.reasoning = reasoning
        self.content = content  # optional callable(request) -> str | None (None: the default answer)
        self.behavior = behavior or (lambda request: FAKE_BEHAVIOR)

    def answer(self, request) -> str:
        observation = last_observation(request.messages)
        distance = observation["target"] - observation["value"]
        limit = 1 if request.seed % 2 else 3
        delta = max(-limit, min(limit, distance)) or 1
        return json.dumps({"delta": delta})

    async def __call__(self, request):
        self.requests.append(request)
        await asyncio.sleep(0)
        content = self.content(request) if self.content is not None else None
        if content is None:
            content = self.answer(request)
        return PolicyReply(content=content, reasoning=self.reasoning if request.sampling.thinking else None,
                           behavior_policy=dict(self.behavior(request)), tokens=len(content) + 3)


def config_for(urls, tmp_path, **overrides) -> CollectionConfig:
    values = {"groups": 2, "group_size": 2, "seed_start": 100, "max_steps": 4, "concurrency": 2,
              "capacity_wait_seconds": 5.0, "output_path": tmp_path / "c.rollouts.jsonl",
              "replay_output_path": tmp_path / "c.replay.json",
              "summary_output_path": tmp_path / "c.rollout-summary.json", "keepalive_interval_s": 5.0}
    values.update(overrides)
    return CollectionConfig(environment_urls=list(urls), **values)


def run_collection(config, policy=None):
    return asyncio.run(collect_and_publish(config, policy or FakeCounterPolicy()))
