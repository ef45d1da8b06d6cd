"""Held-out environment evaluation of a train run: baseline vs candidate on one plan (reference-spec §1.6,
§2.8, §4.10, §4.11).

Pure module: no Django, no ORM, no torch (import-linter checks it); the policies come from an injected
factory, as in `openenv.runs.jobs.make_policy`. The plan, the results and the receipt live in
`openenv.environment_eval_records`; every public name there is re-exported here.

    plan = EvalPlan.of(request["environment_eval"], train_seed_start=request["seed_start"],
                       train_groups=request["groups"])                      # overlap refused here too
    result = run_environment_eval(base=collection_config(request, run_dir), plan=plan,
                                  baseline=EvalPolicy("counter-agent-v1"), candidate=EvalPolicy("counter-agent-v2"),
                                  out_dir=run_dir / "environment-evaluation", policy_factory=factory,
                                  should_stop=ctx.should_stop, on_progress=persist)
    result.gate.decision     # diagnostic | passed | rejected | inconclusive
    result.artifacts         # the six environment_eval_{baseline,candidate}_{dataset,replay,summary} entries
    body = result.receipt(run_id=..., outcome=final_outcome(result.gate.decision, auto_load))

What it does:
1. Two collections with the shared collector on the *same* plan: the training collection's URLs,
   credentials, reset plan and bounds (`base`), with the eval's groups, group_size and seed interval
   (group g has seed eval_seed_start + g), concurrency min(run concurrency, eval group_size) (§4.10);
   so every group has the same environment, reset payload, seed, candidate indices and generation
   seeds (a function of seed, candidate index and step) on both sides. Baseline (the behavior
   adapter) first, then the candidate (the output adapter). Each side gets half of the base
   retained-bytes budget, so both stay inside the one aggregate budget (§4.8).
2. The eval seed interval [seed_start, seed_start + groups) must not overlap training's
   (`seed_interval_overlaps`); an omitted eval seed_start is the first seed after training's.
3. Fail closed between the sides (`EnvironmentEvalError`, stage `environment_evaluation`, nothing
   published): an environment's identity or schemas differ (`environment_identity_changed`: the
   discovery/schema hash changed between or during the sides; during a side the collector's own
   revalidation catches it); the served base model, inference config or implementation differ, an
   adapter is not the one requested, or differs from the expected revision/behavior
   (`training_evidence_invalid`); the executed plans differ (`execution_provenance_sha256`).
4. The six artifacts are published together (core.artifacts.publish_together) into
   `out_dir/{baseline,candidate}/{rollouts.jsonl,replay.json,summary.json}` only after every check
   and the gate have passed; a failure or a cancellation publishes nothing.
5. The gate (`openenv.environment_gate.paired_return_sign_test_v1`) on the summaries' per-group
   returns, and the `kiln.openenv-environment-evaluation.v1` receipt body (`receipt`), whose
   canonical-JSON digest (core.canonical) binds the plan, both policies, the execution, both
   summaries' sha256, the evidence, the outcome and the promotion. Seeds in the receipt are decimal
   strings (they may exceed RFC 8785's integer domain). `publish_receipt` writes its canonical bytes
   to `out_dir/receipt.json`, so the file's sha256 is the receipt digest.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

from core.artifacts import ArtifactError, publish_together
from openenv.collector import CollectionConfig, CollectionError
from openenv.collector.collect import collect, discover
from openenv.collector.formats import CONFIGURATION_KEYS
from openenv.collector.policy import Policy
from openenv.environment_eval_records import (  # noqa: F401 - re-exported: the one import of the run job
    EXECUTION_KEYS,
    FILES,
    POLICY_KEYS,
    RECEIPT_FILE,
    RECEIPT_SCHEMA,
    SIDE_KEYS,
    SIDES,
    EnvironmentEvalCancelled,
    EnvironmentEvalError,
    EnvironmentEvalResult,
    EvalPlan,
    EvalPolicy,
    SideResult,
    execution_of,
    identity_error,
    invalid_eval,
    policy_error,
    publish_receipt,
    receipt_bytes,
    receipt_digest,
    seed_interval_overlaps,
    side_config,
)
from openenv.environment_gate import EnvironmentGateError, group_returns_of, paired_return_sign_test_v1

TICK_SECONDS = 0.2
PolicyFactory = Callable[[str | None], Policy]
Progress = Callable[[dict], None]


# --- checks between the sides ------------------------------------------------------------------

def _identity_differences(left: dict, right: dict) -> list[str]:
    return [k for k in sorted(set(left) | set(right)) if left.get(k) != right.get(k)]


def _environment_differences(before: dict, after: dict) -> list[str]:
    changed = _identity_differences(before.get("identity") or {}, after.get("identity") or {})
    schema_a, schema_b = before.get("schema") or {}, after.get("schema") or {}
    changed += [f"schema.{k}" for k in ("action", "observation", "state") if schema_a.get(k) != schema_b.get(k)]
    return changed


def check_environments(baseline: dict, candidate: dict) -> None:
    envs_a, envs_b = baseline["environments"], candidate["environments"]
    if len(envs_a) != len(envs_b):
        raise identity_error(f"the baseline ran on {len(envs_a)} environments, the candidate on {len(envs_b)}")
    for index, (a, b) in enumerate(zip(envs_a, envs_b, strict=True)):
        changed = _environment_differences(a, b)
        if changed:
            url = (a.get("identity") or {}).get("base_url", f"environment {index}")
            raise identity_error(f"{url} changed between the baseline and the candidate ({', '.join(changed)}); "
                                  "nothing was published")


def check_training_identities(trained_on: list[dict] | None, inspections: list) -> None:
    """The held-out evaluation runs on the deployments the adapter's episodes were collected from: an
    environment redeployed or reconfigured since (its discovery changed) would judge the adapter on
    another environment than the one it was trained on (QA: it completed without a word)."""
    if not trained_on:
        return
    seen = {inspection.identity.get("base_url"): inspection.identity for inspection in inspections}
    for before in trained_on:
        url = before.get("base_url")
        now = seen.get(url)
        if now is None:
            raise identity_error(f"{url}, which training collected from, is not among the evaluation's environments")
        changed = _identity_differences(before, now)
        if changed:
            raise identity_error(f"{url} is not the environment the adapter was trained on ({', '.join(changed)} "
                                 "changed since the training episodes were collected); nothing was published",
                                 hint="the environment was redeployed or reconfigured after collection: evaluate on "
                                      "the deployment the adapter was trained on, or collect and train again")


def _check_adapter(side: str, behavior: dict, policy: EvalPolicy) -> None:
    adapter = behavior.get("adapter")
    if policy.adapter is None:
        if adapter is not None:
            raise policy_error(f"the {side} should run on the base model, but adapter {adapter!r} answered")
        return
    if not isinstance(adapter, dict) or adapter.get("name") != policy.adapter:
        raise policy_error(f"the {side} should run adapter {policy.adapter!r}, the provenance names {adapter!r}")
    if policy.content_sha256 and adapter.get("content_sha256") != policy.content_sha256:
        raise policy_error(f"the {side} adapter {policy.adapter!r} is now {adapter.get('content_sha256')}, "
                            f"not the expected revision {policy.content_sha256}")


def check_policies(baseline: SideResult, candidate: SideResult, expected_behavior: dict | None) -> None:
    a, b = baseline.behavior_policy, candidate.behavior_policy
    if a is None and b is None:
        return  # no model output was ever asked for: nothing the policies did can differ
    if a is None or b is None:
        raise policy_error("only one side recorded a behavior policy")
    changed = [k for k in POLICY_KEYS if a.get(k) != b.get(k)]
    if changed:
        raise policy_error(f"the served model changed between the baseline and the candidate ({', '.join(changed)})")
    _check_adapter("baseline", a, baseline.policy)
    _check_adapter("candidate", b, candidate.policy)
    if expected_behavior is not None and a != expected_behavior:
        changed = sorted(k for k in set(a) | set(expected_behavior) if a.get(k) != expected_behavior.get(k))
        raise policy_error(f"the baseline's behavior policy is not the training contract's ({', '.join(changed)})")


def check_plans(baseline: SideResult, candidate: SideResult) -> dict:
    a, b = baseline.execution(), candidate.execution()
    if a != b:
        changed = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
        raise EnvironmentEvalError("environment_eval_plan_mismatch", "the baseline and the candidate did not execute "
                                   f"the same plan ({', '.join(changed)})", failure_code="training_evidence_invalid")
    summary_a, summary_b = baseline.summary, candidate.summary
    config_a = {k: v for k, v in summary_a.items() if k in CONFIGURATION_KEYS and k not in SIDE_KEYS}
    config_b = {k: v for k, v in summary_b.items() if k in CONFIGURATION_KEYS and k not in SIDE_KEYS}
    if config_a != config_b:
        changed = sorted(k for k in set(config_a) | set(config_b) if config_a.get(k) != config_b.get(k))
        raise EnvironmentEvalError("environment_eval_plan_mismatch", f"the sides' configurations differ "
                                   f"({', '.join(changed)})", failure_code="training_evidence_invalid")
    return a


# --- running it --------------------------------------------------------------------------------

class _Progress:
    def __init__(self, plan: EvalPlan):
        self.lock = threading.Lock()
        self.total = plan.groups * plan.group_size
        self.group_size = plan.group_size
        self.value = {"state": "pending", "side": None, "groups_completed": 0, "groups_total": plan.groups,
                      "rollouts_completed": 0, "rollouts_total": self.total}

    def side(self, side: str) -> None:
        with self.lock:
            self.value = {**self.value, "state": f"collecting_{side}", "side": side, "groups_completed": 0,
                          "rollouts_completed": 0}

    def step(self, done: int, total: int, label: str) -> None:
        with self.lock:
            self.value = {**self.value, "rollouts_completed": done, "groups_completed": done // self.group_size}

    def snapshot(self) -> dict:
        with self.lock:
            return dict(self.value)


async def _collect_side(side: str, base: CollectionConfig, plan: EvalPlan, policy: EvalPolicy, out_dir: Path,
                        policy_factory: PolicyFactory, progress: _Progress, reference: dict | None = None,
                        trained_on: list[dict] | None = None) -> SideResult:
    config = side_config(base, plan, policy, Path(out_dir) / side)
    progress.side(side)
    behavior = policy_factory(policy.adapter)
    try:
        inspections = None
        if reference is not None or trained_on:  # fail before spending an episode on a changed environment
            inspections = await discover(config)
            check_training_identities(trained_on, inspections)
        if reference is not None:
            check_environments(reference, {"environments": [inspection.to_json() for inspection in inspections]})
        bundle = await collect(config, behavior, on_progress=progress.step, inspections=inspections)
    except CollectionError as exc:  # the side's own failure (its revalidation included), at this stage
        raise EnvironmentEvalError(exc.code, f"{side}: {exc.message}", failure_code=exc.failure_code,
                                   retryable=exc.retryable, hint=exc.hint, protocol_code=exc.protocol_code,
                                   http_status=exc.http_status) from None
    return SideResult(side, policy, config, bundle)


async def evaluate(*, base: CollectionConfig, plan: EvalPlan, baseline: EvalPolicy, candidate: EvalPolicy,
                   out_dir: Path, policy_factory: PolicyFactory, expected_behavior: dict | None = None,
                   trained_on: list[dict] | None = None, progress: _Progress | None = None) -> EnvironmentEvalResult:
    """Collect both sides, check them against each other (and, given `trained_on`, the identities the
    training episodes were collected from, against the environments now), gate, publish the six artifacts."""
    if seed_interval_overlaps((base.seed_start, base.groups), (plan.seed_start, plan.groups)):
        raise invalid_eval(f"the eval seeds [{plan.seed_start}, {plan.seed_start + plan.groups}) overlap the collection's "
                       f"[{base.seed_start}, {base.seed_start + base.groups})")
    if (base.seed_start, base.groups) != (plan.train_seed_start, plan.train_groups):
        raise invalid_eval("the plan was made for another training seed interval than the base collection's")
    if baseline.adapter == candidate.adapter:
        raise invalid_eval("the baseline and the candidate are the same adapter", hint="environment_eval needs an "
                       "output_adapter different from adapter")
    progress = progress or _Progress(plan)
    sides = {}
    sides["baseline"] = await _collect_side("baseline", base, plan, baseline, out_dir, policy_factory, progress,
                                            trained_on=trained_on)
    sides["candidate"] = await _collect_side("candidate", base, plan, candidate, out_dir, policy_factory, progress,
                                             reference=sides["baseline"].summary)
    check_environments(sides["baseline"].summary, sides["candidate"].summary)
    check_policies(sides["baseline"], sides["candidate"], expected_behavior)
    execution = check_plans(sides["baseline"], sides["candidate"])
    try:
        gate = paired_return_sign_test_v1(baseline=group_returns_of(sides["baseline"].summary),
                                          candidate=group_returns_of(sides["candidate"].summary), gate=plan.gate)
    except EnvironmentGateError as exc:
        raise EnvironmentEvalError("environment_eval_unpaired", str(exc), failure_code="training_evidence_invalid") \
            from None
    result = EnvironmentEvalResult(plan, Path(out_dir), sides["baseline"], sides["candidate"], gate, execution)
    result.artifacts = [*sides["baseline"].artifacts(out_dir), *sides["candidate"].artifacts(out_dir)]
    files = [*sides["baseline"].bundle.files(), *sides["candidate"].bundle.files()]
    for directory in {path.parent for path, _ in files}:
        directory.mkdir(parents=True, exist_ok=True)
    try:
        publish_together(files)
    except (ArtifactError, OSError) as exc:
        raise EnvironmentEvalError("openenv_publication_failed", str(exc), stage="environment_evaluation",
                                   failure_code="artifact_publication_failed") from None
    with progress.lock:
        progress.value = {**progress.value, "state": "completed"}
    return result


def run_environment_eval(*, base: CollectionConfig, plan: EvalPlan, baseline: EvalPolicy, candidate: EvalPolicy,
                         out_dir: Path, policy_factory: PolicyFactory, expected_behavior: dict | None = None,
                         trained_on: list[dict] | None = None,
                         should_stop: Callable[[], bool] | None = None, on_progress: Progress | None = None,
                         tick_seconds: float = TICK_SECONDS) -> EnvironmentEvalResult:
    """`evaluate` on a private event loop in a thread; this (the caller's) thread polls `should_stop()` and
    calls `on_progress(snapshot)` whenever the progress changed (so database writes stay in the caller's
    thread). A stop cancels the collection (its sessions close) and raises EnvironmentEvalCancelled."""
    progress = _Progress(plan)
    outcome: dict = {}
    state: dict = {}
    ready = threading.Event()

    async def main():
        state["loop"], state["task"] = asyncio.get_running_loop(), asyncio.current_task()
        ready.set()
        return await evaluate(base=base, plan=plan, baseline=baseline, candidate=candidate, out_dir=out_dir,
                              policy_factory=policy_factory, expected_behavior=expected_behavior,
                              trained_on=trained_on, progress=progress)

    def target():
        try:
            outcome["result"] = asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=target, name="kiln-openenv-environment-eval", daemon=True)
    thread.start()
    last = None
    stopped = False
    while thread.is_alive():
        thread.join(tick_seconds)
        snapshot = progress.snapshot()
        if on_progress is not None and snapshot != last:
            on_progress(snapshot)
            last = snapshot
        if not stopped and should_stop is not None and should_stop():
            stopped = True
            ready.wait()
            loop, task = state.get("loop"), state.get("task")
            if loop is not None and task is not None:
                try:
                    loop.call_soon_threadsafe(task.cancel)
                except RuntimeError:  # the loop already ended
                    pass
    if "result" not in outcome and (stopped or isinstance(outcome.get("error"), asyncio.CancelledError)):
        raise EnvironmentEvalCancelled("the environment evaluation was cancelled; nothing was published")
    if "error" in outcome:
        raise outcome["error"]
    if on_progress is not None and progress.snapshot() != last:
        on_progress(progress.snapshot())
    return outcome["result"]
