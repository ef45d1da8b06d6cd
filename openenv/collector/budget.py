"""The retained-bytes budget of one collection (reference-spec §4.8). Pure module.

One aggregate budget (512 MiB less 1 MiB reserved for the contract) covers what a collection keeps:
charged as data arrives (the reset, each model output and action, each observation or error, the
final state), reconciled when a finished candidate is compacted into its group/replay/record
form, and charged again for the published bytes. Overflow aborts the collection; nothing is
published.
"""

from __future__ import annotations

import json
from typing import Any

from openenv.collector.errors import CollectionError


def json_size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


class RetainedBudget:
    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self.peak = 0

    def charge(self, size: int, what: str) -> None:
        self.used += size
        self.peak = max(self.peak, self.used)
        if self.used > self.limit:
            raise CollectionError(
                "openenv_budget_exceeded",
                f"retained data would reach {self.used} bytes ({what}); the collection budget is {self.limit} bytes",
                failure_code="collection_failed",
                hint="collect fewer groups, steps or tokens; nothing was published")

    def charge_json(self, value: Any, what: str) -> None:
        self.charge(json_size(value), what)

    def release(self, size: int) -> None:
        self.used = max(0, self.used - size)
