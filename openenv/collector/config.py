"""The typed configuration of one OpenEnv collection and its seed-free reset plan (reference-spec §4.4, §2.5).

Pure module: no Django, no torch, no network. `CollectionConfig.check()` applies the bounds of the
summary format; `reset_plan()` is the ordered list of seed-free reset templates, one per
environment URL: the shared `reset_options` copied to every environment, or one aligned
`environment_reset_options` entry each (None = an empty slot, `{}`), with any caller `seed`
removed. `reset_plan_sha256` hashes that list (RFC 8785); every group's reset payload is its
environment's template with the group seed inserted.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.canonical import canonical_json, json_digest
from openenv.client.actions import I64_MAX, effective_reset, environment_index, group_seed, seed_free
from openenv.client.credentials import Credential
from openenv.collector.errors import invalid_config

MAX_GROUPS = 16_384
MAX_GROUP_SIZE = 256
MAX_ROLLOUTS = 16_384
MAX_STEPS = 256
MAX_ENVIRONMENTS = 64
MAX_RECOVERABLE_ERRORS = 64
MAX_CONCURRENCY = 256
MAX_ACTION_TOKENS = 4096
MAX_RESET_OPTIONS_BYTES = 16 * 1024 * 1024 - 1024
RETAINED_BYTES_BUDGET = 512 * 1024 * 1024
CONTRACT_RESERVE_BYTES = 1024 * 1024
BASE_ADAPTERS = (None, "", "base", "none", "null")


def adapter_name(adapter: str | None) -> str | None:
    """None for the base model (`base`, `none`, `null` or nothing), else the adapter name."""
    return None if adapter is None or adapter.strip().lower() in BASE_ADAPTERS else adapter.strip()


@dataclass
class CollectionConfig:
    environment_urls: list[str]
    credentials: list[Credential | None] | None = None
    kiln_url: str = "http://127.0.0.1:8420"
    adapter: str | None = "base"
    groups: int = 8
    group_size: int = 4
    seed_start: int = 0
    max_steps: int = 8
    concurrency: int = 4
    max_action_tokens: int = 256
    temperature: float = 1.0
    thinking: bool = True
    thinking_budget_tokens: int | None = None
    protocol_error_reward: float = -1.0
    max_recoverable_errors: int = 3
    capacity_wait_seconds: float = 300.0
    reset_options: dict | None = None
    environment_reset_options: list[dict | None] | None = None
    output_path: Path = Path("openenv.rollouts.jsonl")
    replay_output_path: Path = Path("openenv.replay.json")
    summary_output_path: Path = Path("openenv.rollout-summary.json")
    retained_bytes_limit: int = RETAINED_BYTES_BUDGET - CONTRACT_RESERVE_BYTES
    keepalive_interval_s: float = 10.0
    request_timeout_s: float = 60.0
    # A train run's sealed kiln.openenv-training-contract.v1: embedded in the summary with the
    # training selection (reference-spec §2.5 v4+). None for a rollout.
    training_contract: dict | None = None
    extra: dict = field(default_factory=dict)

    # --- derived -------------------------------------------------------------------------------

    @property
    def adapter_name(self) -> str | None:
        return adapter_name(self.adapter)

    @property
    def adapter_label(self) -> str:
        return self.adapter_name or "base"

    @property
    def rollout_count(self) -> int:
        return self.groups * self.group_size

    def reset_plan(self) -> list[dict]:
        count = len(self.environment_urls)
        if self.environment_reset_options is not None:
            return [seed_free(entry or {}) for entry in self.environment_reset_options]
        return [seed_free(self.reset_options or {}) for _ in range(count)]

    def reset_plan_sha256(self) -> str:
        return reset_plan_sha256(self.reset_plan())

    def group_plan(self) -> list[tuple[int, int, int, dict]]:
        """(group_index, environment_index, seed, reset_payload) for every group."""
        plan = self.reset_plan()
        out = []
        for index in range(self.groups):
            seed = group_seed(self.seed_start, index)
            env = environment_index(index, len(plan))
            out.append((index, env, seed, effective_reset(plan[env], seed)))
        return out

    # --- bounds --------------------------------------------------------------------------------

    def check(self) -> CollectionConfig:
        def integer(name, low, high):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise invalid_config(f"{name} must be an integer in {low}..{high}, not {value!r}")

        count = len(self.environment_urls)
        if not 1 <= count <= MAX_ENVIRONMENTS:
            raise invalid_config(f"give 1..{MAX_ENVIRONMENTS} environment URLs, not {count}")
        if self.credentials is not None and len(self.credentials) != count:
            raise invalid_config("credentials must be aligned with the environment URLs")
        integer("groups", 1, MAX_GROUPS)
        integer("group_size", 1, MAX_GROUP_SIZE)
        integer("seed_start", 0, I64_MAX)
        integer("max_steps", 1, MAX_STEPS)
        integer("concurrency", 1, MAX_CONCURRENCY)
        integer("max_action_tokens", 1, MAX_ACTION_TOKENS)
        integer("max_recoverable_errors", 0, MAX_RECOVERABLE_ERRORS)
        if self.rollout_count > MAX_ROLLOUTS:
            raise invalid_config(f"groups x group_size is {self.rollout_count}; at most {MAX_ROLLOUTS} rollouts")
        if self.groups < count:
            raise invalid_config(f"{self.groups} groups cannot cover {count} environments; every configured "
                                 "endpoint must run, so groups must be at least the number of environments")
        if self.seed_start + self.groups - 1 > I64_MAX:
            raise invalid_config(f"the last group seed exceeds {I64_MAX}")
        if self.thinking_budget_tokens is not None:
            # the thinking budget is spent out of max_action_tokens, so at least one token must remain for
            # the action itself (the same bound POST /v1/openenv/runs applies, openenv.runs.request)
            budget, high = self.thinking_budget_tokens, self.max_action_tokens - 1
            if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget <= high:
                raise invalid_config(f"thinking_budget_tokens must be an integer in 1..{high} (below max_action_tokens "
                                     f"{self.max_action_tokens}, leaving room for the action), not {budget!r}")
            if not self.thinking:
                raise invalid_config("thinking_budget_tokens needs thinking on")
        for name, low, high in (("temperature", 0.0, 2.0), ("capacity_wait_seconds", 1.0, 3600.0),
                                ("protocol_error_reward", -1e9, 1e9)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
                raise invalid_config(f"{name} must be a number in [{low:g}, {high:g}], not {value!r}")
        if self.reset_options is not None and self.environment_reset_options is not None:
            raise invalid_config("give shared reset_options or aligned environment_reset_options, not both")
        if self.environment_reset_options is not None and len(self.environment_reset_options) != count:
            raise invalid_config(f"{len(self.environment_reset_options)} environment_reset_options for {count} "
                                 "environment URLs", hint="give one per --environment, - for an empty slot")
        for entry in [self.reset_options, *(self.environment_reset_options or [])]:
            check_reset_options(entry)
        if not isinstance(self.thinking, bool):
            raise invalid_config("thinking must be true or false")
        if self.adapter is not None and not isinstance(self.adapter, str):
            raise invalid_config("adapter must be a name, or base")
        if self.retained_bytes_limit < 1:
            raise invalid_config("the retained-bytes budget must be positive")
        return self


def check_reset_options(value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise invalid_config("reset options must be a JSON object")
    try:
        size = len(canonical_json(value))
    except Exception as exc:  # noqa: BLE001 - NaN, unsupported numbers
        raise invalid_config(f"reset options are not canonical JSON: {exc}") from None
    if size > MAX_RESET_OPTIONS_BYTES:
        raise invalid_config(f"reset options hold {size} bytes; at most {MAX_RESET_OPTIONS_BYTES}")


def reset_plan_sha256(plan: list[dict]) -> str:
    return json_digest([seed_free(entry) for entry in plan])
