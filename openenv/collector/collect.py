"""Collect seed-matched OpenEnv groups and publish their three artifacts together (reference-spec §4.4-4.8).

Pure module: no Django, no torch. `collect(config, policy)`:
1. discovery of every environment URL (`openenv.client.inspect`, credentials by exact origin);
2. groups x candidates: group g runs on environment g % n with seed seed_start + g and the
   environment's seed-free reset template plus that seed; one session per candidate; at most
   `concurrency` candidates at once (whole groups are assigned to URLs, never split);
3. every candidate of a group must see the identical reset observation and prompt, else the
   collection fails (`openenv_reset_not_identical`); the behavior policy must never change;
4. after the last episode, discovery again: any identity difference fails with
   `environment_identity_changed` at `identity_verification` and nothing is published;
5. the artifacts are built in memory, checked against the corpus checker (`admit_jsonl`), the
   256 MiB per-file bound and the retained-bytes budget, and returned as a `Bundle`.
`publish(bundle)` writes the JSONL, the replay and the summary all-or-nothing
(`core.artifacts.publish_together`). The first failure cancels the work in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from core.artifacts import ArtifactError, publish_together
from core.canonical import sha256_digest
from core.contracts.groups import GroupError, admit_groups, admit_jsonl
from openenv.client.discovery import identity_differences, inspect
from openenv.client.errors import OpenEnvError
from openenv.client.urls import normalize_url
from openenv.collector import formats
from openenv.collector.budget import RetainedBudget, json_size
from openenv.collector.config import CollectionConfig
from openenv.collector.episode import BehaviorWitness, CandidateResult, EpisodeSettings, run_candidate
from openenv.collector.errors import CollectionError
from openenv.collector.policy import Policy, Sampling
from openenv.collector.selection import select_for_training
from openenv.json_compare import first_difference

Progress = Callable[[int, int, str], None]


@dataclass
class Bundle:
    """The three artifacts, ready to publish together."""

    dataset: bytes
    replay: bytes
    summary: bytes
    summary_value: dict
    paths: tuple[Path, Path, Path]

    def files(self) -> list[tuple[Path, bytes]]:
        return list(zip(self.paths, (self.dataset, self.replay, self.summary), strict=True))


async def _bounded(factories: list[Callable[[], Awaitable]], limit: int) -> list:
    """Run every coroutine factory with at most `limit` in flight; the first failure cancels the rest."""
    semaphore = asyncio.Semaphore(limit)

    async def one(factory):
        async with semaphore:
            return await factory()

    tasks = [asyncio.ensure_future(one(f)) for f in factories]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in tasks:  # the first failure in plan order among those that failed
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()
        return [task.result() for task in tasks]
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def discover(config: CollectionConfig) -> list:
    credentials = config.credentials or [None] * len(config.environment_urls)
    try:
        endpoints = [normalize_url(url) for url in config.environment_urls]
    except OpenEnvError as exc:
        raise CollectionError.from_client(exc, stage="discovery") from None

    async def one(endpoint, credential):
        try:
            return await inspect(endpoint, credential=credential, request_timeout=config.request_timeout_s)
        except OpenEnvError as exc:
            raise CollectionError.from_client(exc, stage="discovery", environment_url=endpoint.base_url) from None

    return list(await asyncio.gather(*(one(e, c) for e, c in zip(endpoints, credentials, strict=True))))


def _check_group(group_index: int, results: list[CandidateResult]) -> None:
    first = results[0]
    for other in results[1:]:
        if other.reset.to_json() != first.reset.to_json() or other.prompt != first.prompt:
            where = first_difference(other.reset.to_json(), first.reset.to_json(), "reset")
            raise CollectionError(
                "openenv_reset_not_identical",
                f"group {group_index}: candidate {other.candidate_index} got a different reset observation than "
                f"candidate {first.candidate_index} for the same reset payload and seed"
                + (f" (first difference at {where})" if where != "reset" else ""),
                hint="the environment's reset is not deterministic for a seed: GRPO groups need identical starts. "
                     "Derive anything it draws at reset from the reset's `seed` (Kiln also sends `episode_id`, one "
                     "per seed)")


async def collect(config: CollectionConfig, policy: Policy, *, on_progress: Progress | None = None,
                  inspections: list | None = None) -> Bundle:
    """`inspections`: the discovery the caller already made and showed (a persisted run's status):
    the collection binds exactly that one, so a change between it and the first episode is caught
    by the final re-verification instead of being bound silently by a second discovery."""
    config.check()
    if inspections is None:
        inspections = await discover(config)
    environments = [inspection.to_json() for inspection in inspections]
    credentials = config.credentials or [None] * len(inspections)
    settings = EpisodeSettings(
        max_steps=config.max_steps,
        sampling=Sampling(max_tokens=config.max_action_tokens, temperature=float(config.temperature),
                          thinking=config.thinking, thinking_budget_tokens=config.thinking_budget_tokens),
        protocol_error_reward=float(config.protocol_error_reward),
        max_recoverable_errors=config.max_recoverable_errors,
        capacity_wait_seconds=float(config.capacity_wait_seconds),
        keepalive_interval_s=config.keepalive_interval_s, request_timeout_s=config.request_timeout_s)
    budget = RetainedBudget(config.retained_bytes_limit)
    witness = BehaviorWitness()
    plan = config.group_plan()
    total = config.rollout_count
    finished = 0

    def factory(group_index, env, seed, payload, candidate_index):
        async def run():
            nonlocal finished
            inspection = inspections[env]
            try:
                result = await run_candidate(
                    endpoint=inspection.endpoint, credential=credentials[env], environment=environments[env],
                    action_schema=inspection.action_schema, group_index=group_index, seed=seed,
                    reset_payload=payload, candidate_index=candidate_index, policy=policy, settings=settings,
                    budget=budget, witness=witness)
            except OpenEnvError as exc:
                raise CollectionError.from_client(exc, stage="collection",
                                                  environment_url=inspection.endpoint.base_url) from None
            finished += 1
            if on_progress is not None:
                on_progress(finished, total, f"group {group_index} candidate {candidate_index}")
            return result
        return run

    factories = [factory(g, env, seed, payload, c) for g, env, seed, payload in plan for c in range(config.group_size)]
    results = await _bounded(factories, config.concurrency)

    groups, lines = [], []
    for number, (group_index, env, seed, payload) in enumerate(plan):
        members = results[number * config.group_size:(number + 1) * config.group_size]
        _check_group(group_index, members)
        group = {"group_index": group_index, "environment_index": env, "seed": seed, "reset_payload": payload,
                 "reset_observation": members[0].reset.to_json(),
                 "candidates": [formats.replay_candidate(m) for m in members]}
        records = [formats.openenv_record(environments[env], group, c, witness.policy) for c in group["candidates"]]
        lines.append({"messages": members[0].prompt,
                      "completions": [formats.completion(m.trajectory, r) for m, r in zip(members, records, strict=True)]})
        groups.append(group)
        live = sum(json_size(m.trajectory) + json_size(m.exchanges) for m in members)
        budget.release(live)  # reconcile: the compacted forms replace what was charged live
        budget.charge(json_size(group) + json_size(lines[-1]), f"group {group_index}")

    await revalidate(config, inspections)
    return build_bundle(config, environments, groups, lines, witness.policy, budget)


async def revalidate(config: CollectionConfig, before: list) -> None:
    try:
        after = await discover(config)
    except CollectionError as exc:
        exc.stage = "identity_verification"
        raise
    for first, second in zip(before, after, strict=True):
        changed = identity_differences(first, second)
        if changed:
            raise CollectionError(
                "environment_identity_changed",
                f"{first.endpoint.base_url} changed during the collection ({', '.join(changed)}); nothing was published",
                stage="identity_verification", failure_code="environment_identity_changed",
                hint="the environment was redeployed or reconfigured mid-run; collect again")


def build_bundle(config: CollectionConfig, environments: list[dict], groups: list[dict], lines: list[dict],
                 behavior_policy: dict | None, budget: RetainedBudget) -> Bundle:
    try:
        admitted = admit_groups(lines)
        dataset = admitted.jsonl
        admit_jsonl(dataset)
    except GroupError as exc:
        raise CollectionError("openenv_corpus_invalid", f"the collected corpus does not pass the group checker: {exc}",
                              stage="artifact_publication", failure_code="training_evidence_invalid") from None
    paths = tuple(Path(p).resolve() for p in (config.output_path, config.replay_output_path,
                                             config.summary_output_path))
    summary = {"schema": formats.SUMMARY_SCHEMA, "kiln_url": config.kiln_url, "adapter": config.adapter_name,
               "adapter_label": config.adapter_label, "behavior_policy": behavior_policy,
               "environments": environments, "groups": config.groups, "group_size": config.group_size,
               "rollout_count": config.rollout_count, "seed_start": config.seed_start, "max_steps": config.max_steps,
               "concurrency": config.concurrency, "max_action_tokens": config.max_action_tokens}
    if config.thinking_budget_tokens is not None:
        summary["thinking_budget_tokens"] = config.thinking_budget_tokens
    summary.update(temperature=float(config.temperature), thinking=config.thinking,
                   protocol_error_reward=float(config.protocol_error_reward),
                   max_recoverable_errors=config.max_recoverable_errors,
                   capacity_wait_seconds=float(config.capacity_wait_seconds),
                   reset_plan_sha256=config.reset_plan_sha256(), output_path=str(paths[0]),
                   replay_output_path=str(paths[1]), summary_output_path=str(paths[2]))
    replay_value = formats.replay_document(
        dataset_sha256=sha256_digest(dataset), configuration_digest=formats.configuration_sha256(summary),
        protocol_error_reward=float(config.protocol_error_reward), max_steps=config.max_steps,
        environments=environments, groups=groups)
    replay = formats.pretty_bytes(replay_value)
    records = formats.summary_records(replay_value)
    summary.update(dataset_sha256=sha256_digest(dataset), dataset_bytes=len(dataset),
                   replay_sha256=sha256_digest(replay), replay_bytes=len(replay),
                   stats=formats.statistics(records), rollouts=records)
    if config.training_contract is not None:
        summary.update(training_selection=select_for_training(admitted.groups).summary,
                       training_contract=config.training_contract)
    summary_bytes = formats.pretty_bytes(summary)
    for name, data in (("the JSONL", dataset), ("the replay", replay), ("the summary", summary_bytes)):
        if len(data) > formats.MAX_ARTIFACT_BYTES:
            raise CollectionError("openenv_budget_exceeded", f"{name} would hold {len(data)} bytes; each artifact is "
                                  f"limited to {formats.MAX_ARTIFACT_BYTES}", stage="artifact_publication",
                                  failure_code="artifact_publication_failed",
                                  hint="collect fewer groups, steps or tokens; nothing was published")
        budget.charge(len(data), f"the published {name}")
    return Bundle(dataset, replay, summary_bytes, summary, paths)


def publish(bundle: Bundle) -> None:
    try:
        publish_together(bundle.files())
    except ArtifactError as exc:
        raise CollectionError("openenv_publication_failed", str(exc), stage="artifact_publication",
                              failure_code="artifact_publication_failed") from None


async def collect_and_publish(config: CollectionConfig, policy: Policy, *,
                              on_progress: Progress | None = None) -> Bundle:
    bundle = await collect(config, policy, on_progress=on_progress)
    publish(bundle)
    return bundle
