"""Outcome -> promotion (openenv.environment_promotion) with in-process rows: adapters published as the
promotion tests do, the serving canary answered by the stand-in worker (`canary_worker`). Model-free and
server-free: the evaluation result is built from hand-made side bundles (the gate itself is real)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from adapters.models import Adapter, Promotion
from core.canonical import canonical_json, json_digest, sha256_digest
from core.errors import KilnError
from core.jobs.models import Job
from core.models import Receipt, ReceiptKind
from openenv.collector import CollectionConfig
from openenv.collector.collect import Bundle
from openenv.collector.formats import pretty_bytes
from openenv.environment_eval import EnvironmentEvalResult, EvalPlan, EvalPolicy, SideResult, execution_of
from openenv.environment_gate import group_returns_of, paired_return_sign_test_v1
from openenv.environment_promotion import environment_eval_conclude, promotion_owner, training_auto_load
from tests.openenv.environment_eval.support import adapter_sha, behavior_for
from tests.promotions.support import home, policy, published  # noqa: F401
from tests.support.canary import drain_activations

pytestmark = pytest.mark.django_db

ENV = {"identity": {"base_url": "http://127.0.0.1:8990", "discovery_sha256": "sha256:" + "d" * 64,
                    "metadata": {"name": "kiln_counter"}}, "schema": {"action": {}, "observation": {}, "state": {}}}


def _side(tmp_path, side: str, adapter: str | None, returns: list[float], revision: str | None = None) -> SideResult:
    seeds = range(104, 104 + len(returns))
    groups = [{"group_index": i, "environment_index": 0, "seed": s, "reset_payload": {"seed": s},
               "candidates": [{"candidate_index": 0}]} for i, s in enumerate(seeds)]
    replay = {"schema": "kiln.openenv-replay.v1", "client_profile": "openenv-http/1.x", "groups": groups}
    behavior = behavior_for(adapter)
    if revision is not None:
        behavior["adapter"]["content_sha256"] = revision
    summary = {"environments": [ENV], "seed_start": 104, "groups": len(returns), "group_size": 1,
               "behavior_policy": behavior, "dataset_sha256": "sha256:" + "1" * 64,
               "replay_sha256": "sha256:" + "2" * 64, "stats": {"mean_episode_return": sum(returns) / len(returns)},
               "rollouts": [{"group_index": i, "candidate_index": 0, "seed": s, "episode_return": r}
                            for i, (s, r) in enumerate(zip(seeds, returns, strict=True))]}
    folder = tmp_path / "eval" / side
    paths = (folder / "rollouts.jsonl", folder / "replay.json", folder / "summary.json")
    bundle = Bundle(b"{}\n", pretty_bytes(replay), pretty_bytes(summary), summary, paths)
    return SideResult(side, EvalPolicy(adapter, adapter_sha(adapter) if adapter else None),
                      CollectionConfig(environment_urls=[ENV["identity"]["base_url"]]), bundle)


def result_for(tmp_path, baseline: list[float], candidate: list[float], *, gate=True, revision=None):
    config = {"groups": len(baseline), "group_size": 1, **({"gate": {"min_mean_improvement": 0.05}} if gate else {})}
    plan = EvalPlan.of(config, train_seed_start=100, train_groups=4)
    b = _side(tmp_path, "baseline", "agent-v1", baseline)
    c = _side(tmp_path, "candidate", "agent-v2", candidate, revision)
    decision = paired_return_sign_test_v1(baseline=group_returns_of(b.summary), candidate=group_returns_of(c.summary),
                                          gate=plan.gate)
    (tmp_path / "eval").mkdir(exist_ok=True)
    return EnvironmentEvalResult(plan, tmp_path / "eval", b, c, decision, execution_of(b.summary, b.replay))


BETTER, WORSE, SAME = ([0.0] * 20, [1.0] * 20), ([1.0] * 20, [0.0] * 20), ([1.0] * 20, [1.0] * 20)


def request(*, gate=True, auto_load=True, post_eval=None):
    out = {"kind": "train", "adapter": "agent-v1", "output_adapter": "agent-v2", "auto_load": auto_load,
           "environment_eval": {"groups": 20, "group_size": 1, "seed_start": 104,
                                **({"gate": {"min_mean_improvement": 0.05}} if gate else {})}}
    if post_eval is not None:
        out["post_eval"] = post_eval
    return out


@pytest.fixture
def adapters(home):  # noqa: F811
    published(home, "agent-v1", loaded=True)
    return published(home, "agent-v2")


def _file_sha(path) -> str:
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def check_receipt(conclusion, outcome):
    """One environment_eval row; its sha256 is the canonical digest of its body, and receipt.json holds
    exactly those canonical bytes."""
    row = Receipt.objects.get(kind=ReceiptKind.ENVIRONMENT_EVAL, subject="agent-v2")
    assert row.id == conclusion.receipt_row.id and row.schema == "kiln.openenv-environment-evaluation.v1"
    assert row.sha256 == json_digest(row.body) == conclusion.receipt_sha256 == conclusion.artifact["sha256"]
    path = Path(conclusion.artifact["path"])
    assert path.read_bytes() == canonical_json(row.body) and _file_sha(path) == row.sha256
    assert conclusion.artifact["kind"] == "environment_eval_receipt" and conclusion.artifact["file"] == "receipt.json"
    assert row.body["outcome"] == conclusion.outcome == outcome
    return row


def test_passed_with_auto_load_activates_through_the_canary(tmp_path, adapters, settings, canary_worker):
    policy(settings, require_approval=False)
    conclusion = environment_eval_conclude(result=result_for(tmp_path, *BETTER), run_id="run-1", request=request())
    assert conclusion.outcome == "promoted" and conclusion.activation_job_id and conclusion.promotion_id is None
    row = check_receipt(conclusion, "promoted")
    assert row.body["promotion"]["action"] == "activation_submitted"
    assert row.body["evidence"]["decision"] == "passed"
    assert not Adapter.objects.get(name="agent-v2").loaded  # loaded after deferral, by its activation job
    drain_activations()
    assert Job.objects.get(uuid=conclusion.activation_job_id).state == "completed"
    assert Adapter.objects.get(name="agent-v2").loaded and not Adapter.objects.get(name="agent-v1").loaded
    assert Receipt.objects.filter(kind=ReceiptKind.ACTIVATION, subject="agent-v2").exists()


def test_passed_with_the_approval_policy_proposes_a_promotion(tmp_path, adapters, settings):
    policy(settings, require_approval=True)
    conclusion = environment_eval_conclude(result=result_for(tmp_path, *BETTER), run_id="run-1", request=request())
    assert conclusion.outcome == "promoted" and conclusion.promotion_id is not None
    promotion = Promotion.objects.get(id=conclusion.promotion_id)
    assert promotion.state == "pending" and promotion.candidate == "agent-v2" and promotion.incumbent == "agent-v1"
    assert promotion.evidence["gate"]["policy_version"] == "paired_return_sign_test_v1"
    assert promotion.evidence["gate"]["openenv_run_id"] == "run-1"
    assert check_receipt(conclusion, "promoted").body["promotion"]["action"] == "promotion_requested"
    drain_activations()
    assert not Adapter.objects.get(name="agent-v2").loaded


def test_passed_without_auto_load_is_kept(tmp_path, adapters, settings):
    policy(settings, require_approval=False)
    conclusion = environment_eval_conclude(result=result_for(tmp_path, *BETTER), run_id="run-1",
                                           request=request(auto_load=False))
    assert conclusion.outcome == "kept" and check_receipt(conclusion, "kept").body["promotion"]["action"] == "kept"
    drain_activations()
    candidate = Adapter.objects.get(name="agent-v2")
    assert candidate.state == "published" and not candidate.loaded and not Promotion.objects.exists()


@pytest.mark.parametrize("pairs, outcome", [(WORSE, "rejected"), (SAME, "inconclusive")])
def test_rejected_and_inconclusive_are_never_served(tmp_path, adapters, settings, pairs, outcome):
    policy(settings, require_approval=False)
    if outcome == "inconclusive":  # with the 0.05 margin, SAME would be rejected by rule 5
        result = result_for(tmp_path, *pairs)
        result.plan = EvalPlan.of({"gate": {}}, train_seed_start=100, train_groups=4)
        result.gate = paired_return_sign_test_v1(baseline=group_returns_of(result.baseline.summary),
                                                 candidate=group_returns_of(result.candidate.summary),
                                                 gate=result.plan.gate)
    else:
        result = result_for(tmp_path, *pairs)
    conclusion = environment_eval_conclude(result=result, run_id="run-1", request=request())
    assert conclusion.outcome == outcome
    assert check_receipt(conclusion, outcome).body["promotion"]["action"] == "not_served"
    from core.metrics.models import MetricCounter  # GET /metrics counts the decision with its receipt

    assert dict(MetricCounter.objects.filter(family="kiln_gate_decisions_total").values_list("labels", "value")) \
        == {f'gate="environment",outcome="{outcome}"': 1}
    drain_activations()
    assert not Adapter.objects.get(name="agent-v2").loaded and not Promotion.objects.exists()


def test_a_candidate_whose_bytes_are_not_the_evaluated_ones_is_an_error(tmp_path, adapters, settings):
    policy(settings, require_approval=False)
    result = result_for(tmp_path, *BETTER, revision="sha256:" + "9" * 64)
    conclusion = environment_eval_conclude(result=result, run_id="run-1", request=request())
    assert conclusion.outcome == "error" and conclusion.error["code"] == "adapter_changed"
    assert check_receipt(conclusion, "error").body["promotion"]["error"]["code"] == "adapter_changed"
    drain_activations()
    assert not Adapter.objects.get(name="agent-v2").loaded


def test_a_missing_candidate_is_an_error(tmp_path, home, settings):  # noqa: F811
    policy(settings, require_approval=False)
    conclusion = environment_eval_conclude(result=result_for(tmp_path, *BETTER), run_id="run-1", request=request())
    assert conclusion.outcome == "error" and conclusion.error["code"] == "adapter_not_found"


def test_diagnostic_does_nothing_but_record(tmp_path, adapters, settings):
    policy(settings, require_approval=False)
    conclusion = environment_eval_conclude(result=result_for(tmp_path, *BETTER, gate=False), run_id="run-1",
                                           request=request(gate=False, post_eval={"suite": "held", "min_accuracy": 0.5}))
    assert conclusion.outcome == "diagnostic"
    assert check_receipt(conclusion, "diagnostic").body["promotion"] == {
        "owner": "post_eval_gate", "candidate": "agent-v2", "auto_load": True, "action": "none"}
    assert not Adapter.objects.get(name="agent-v2").loaded


def test_one_gate_owns_promotion(tmp_path, adapters):
    both = request(post_eval={"suite": "held", "min_accuracy": 0.5})
    with pytest.raises(KilnError) as raised:
        promotion_owner(both)
    assert raised.value.code == "openenv_promotion_owner_conflict"
    assert promotion_owner(request()) == "environment_gate" and training_auto_load(request()) is False
    static = request(gate=False, post_eval={"suite": "held", "min_accuracy": 0.5})
    assert promotion_owner(static) == "post_eval_gate" and training_auto_load(static) is True
    assert promotion_owner(request(gate=False)) == "auto_load" and training_auto_load(request(gate=False)) is True
    assert promotion_owner(request(gate=False, auto_load=False)) is None
    diagnostic_post = request(post_eval={"suite": "held"})  # a suite without min_accuracy is only a diagnostic
    assert promotion_owner(diagnostic_post) == "environment_gate"
    with pytest.raises(KilnError):  # a gate decision on a run the environment gate does not own
        environment_eval_conclude(result=result_for(tmp_path, *BETTER), run_id="r", request=request(gate=False))
    assert not Receipt.objects.filter(kind=ReceiptKind.ENVIRONMENT_EVAL).exists()


def test_the_receipt_binds_the_summaries(tmp_path, adapters, settings):
    policy(settings, require_approval=False)
    result = result_for(tmp_path, *WORSE)
    conclusion = environment_eval_conclude(result=result, run_id="run-1", request=request())
    body = conclusion.receipt
    assert body["baseline_summary_sha256"] == sha256_digest(result.baseline.bundle.summary)
    assert body["candidate_summary_sha256"] == sha256_digest(result.candidate.bundle.summary)
    assert body["candidate"]["summary_sha256"] == body["candidate_summary_sha256"]
    changed = json.loads(json.dumps(body))
    changed["candidate_summary_sha256"] = "sha256:" + "0" * 64
    assert json_digest(changed) != conclusion.receipt_sha256
