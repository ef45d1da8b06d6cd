"""The typed payload of a `rollouts.generate` job: what submission checked, as plain data on the queue.

Built once by evaluations.rollout_services.rollouts_submit; the handler (evaluations.rollout_jobs),
the job-page section and "train on these rollouts" read it through `RolloutsJobPayload.of(job)`.
Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RolloutsJobPayload:
    route: str
    adapter: str  # "base" or an adapter name
    thinking: bool
    thinking_budget_tokens: int | None
    seed_start: int
    seed_count: int
    concurrency: int
    requests: int
    scorer: dict[str, Any]  # name, filename, sha256 of the registered scorer
    inputs: dict[str, Any]  # dir; tasks and request_template: path, filename, sha256 (tasks: count)

    @property
    def seeds(self) -> list[int]:
        return list(range(self.seed_start, self.seed_start + self.seed_count))

    @classmethod
    def of(cls, job) -> RolloutsJobPayload:
        return cls.from_dict(job.payload)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RolloutsJobPayload:
        return cls(route=data.get("route", ""), adapter=data["adapter"], thinking=bool(data["thinking"]),
                   thinking_budget_tokens=data.get("thinking_budget_tokens"), seed_start=data["seeds"]["start"],
                   seed_count=data["seeds"]["count"], concurrency=data["concurrency"], requests=data["requests"],
                   scorer=dict(data["scorer"]), inputs=dict(data["inputs"]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "route": self.route, "adapter": self.adapter, "thinking": self.thinking,
            "thinking_budget_tokens": self.thinking_budget_tokens,
            "seeds": {"start": self.seed_start, "count": self.seed_count, "last": self.seed_start + self.seed_count - 1},
            "concurrency": self.concurrency, "requests": self.requests, "scorer": self.scorer, "inputs": self.inputs,
        }
