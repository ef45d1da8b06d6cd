"""A passed post-eval gate (`promoted`) with `[promotion] require_approval` proposes a promotion instead
of activating; without the policy it activates as before, unless the reward-hacking alarm flags it.
Model-free: `_apply` is called directly with a hand-built post-eval job."""

from __future__ import annotations

import pytest

from adapters.models import Adapter, Promotion
from adapters.promotions import promotion_alarms, reward_trend
from core.contracts.grpo_submission import PostEvalConfig
from core.jobs.models import Job
from core.jobs.runner import JobContext
from core.jobs.services import job_submit
from core.models import Receipt
from tests.promotions.support import approve, policy, published, users
from training.post_eval_jobs import PostEvalJobPayload, _apply

pytestmark = pytest.mark.django_db


def _job(kind: str, *, user=None, metrics=None, result=None, state: str = "completed") -> Job:
    job = job_submit(kind="test.steps", payload={"steps": 1}, title=kind, user=user)
    Job.objects.filter(id=job.id).update(kind=kind, state=state, metrics=metrics or {}, result=result or {})
    return Job.objects.get(id=job.id)


def _gate(home, name: str, *, candidate: float, baseline: float, rewards=None, user=None):
    training = _job("training.grpo", user=user, metrics={"reward_history": rewards or []})
    published(home, "prev", loaded=True)
    published(home, name, job=training)
    payload = PostEvalJobPayload(training_job_id=str(training.uuid), adapter_name=name,
                                 post_eval=PostEvalConfig.from_dict({"suite": "held", "min_accuracy": 0.5}),
                                 suite_hash="sha256:" + "1" * 64, baseline_adapter="prev", auto_load=True)
    post = _job("training.post_eval", user=user, state="running")  # _apply runs inside the running gate job
    evidence = {"policy_version": "paired_wilson_v1", "eval_job_id": "e1", "candidate_adapter": name,
                "baseline_adapter": "prev", "candidate_accuracy": candidate, "baseline_accuracy": baseline,
                "outcome": "promoted"}
    result = _apply(JobContext(post), payload, "promoted", evidence, "e1", "verdict")
    return result, post


def test_with_the_policy_a_passed_gate_proposes(home, settings):
    requester, reviewer, _ = users()
    result, post = _gate(home, "cand", candidate=0.8, baseline=0.5, user=requester)
    assert result["gate_outcome"] == "promoted"  # the gate's decision stays the gate's
    assert result["activated_at"] is None and result["promotion_id"] is not None
    assert not Adapter.objects.get(name="cand").loaded
    promotion = Promotion.objects.get(id=result["promotion_id"])
    assert promotion.state == "pending" and promotion.incumbent == "prev" and promotion.job == post
    assert promotion.evidence["gate"]["candidate_accuracy"] == 0.8 and promotion.alarms == []
    assert Receipt.objects.filter(kind="post_eval_gate", subject="cand").count() == 1
    assert not Receipt.objects.filter(kind="activation", subject="cand").exists()
    approve(promotion.id, reviewer, "gate passed, reviewed")
    activation = Receipt.objects.get(kind="activation", subject="cand")
    assert activation.body["gate_outcome"] == "promoted" and activation.body["eval_job_id"] == "e1"
    assert Adapter.objects.get(name="cand").loaded


def test_the_training_status_says_a_promoted_gate_waits_for_a_reviewer_then_how_it_was_decided(home, settings):
    from training.selectors import _gate_fields  # the gate half of training_status (no GRPO payload here)

    requester, reviewer, _ = users()
    result, post = _gate(home, "cand", candidate=0.8, baseline=0.5, user=requester)
    training = Adapter.objects.get(name="cand").training_job
    Job.objects.filter(id=training.id).update(result={"post_eval_job_id": str(post.uuid)})
    Job.objects.filter(id=post.id).update(result=result, state="completed")  # the gate job ended with it
    promotion_id = result["promotion_id"]
    status = _gate_fields(Job.objects.get(id=training.id))
    assert status["gate_outcome"] == "promoted"  # the gate's word; the verdict says a person still decides
    assert status["post_eval_verdict"] == (
        f"verdict; the gate passed and proposed promotion {promotion_id}: not active until a reviewer approves it "
        f"(kiln promotions approve {promotion_id} --reason ...)")
    approve(promotion_id, reviewer, "reviewed")
    status = _gate_fields(Job.objects.get(id=training.id))
    assert status["post_eval_verdict"] == f"verdict; the gate passed; promotion {promotion_id} was applied"


def test_without_the_policy_a_passed_gate_activates_as_before(home, settings):
    policy(settings, require_approval=False)
    result, _ = _gate(home, "cand", candidate=0.8, baseline=0.5, rewards=[0.1, 0.2, 0.9])
    assert result["promotion_id"] is None and result["activated_at"] is not None
    assert Adapter.objects.get(name="cand").loaded and not Promotion.objects.exists()


def test_a_flagged_promotion_is_not_applied_automatically_but_may_be_approved(home, settings):
    policy(settings, require_approval=False)
    requester, reviewer, _ = users()
    rewards = [{"step": i, "reward_mean": 0.1 * i} for i in range(8)]  # training reward rose
    result, _ = _gate(home, "hacked", candidate=0.4, baseline=0.6, rewards=rewards, user=requester)
    assert result["activated_at"] is None and result["promotion_id"] is not None
    assert not Adapter.objects.get(name="hacked").loaded
    promotion = Promotion.objects.get(id=result["promotion_id"])
    assert promotion.state == "pending" and len(promotion.alarms) == 1
    assert "training reward rose" in promotion.alarms[0] and result["promotion_alarms"] == promotion.alarms
    assert promotion.evidence["reward_trend"]["source"] == "training_job_metrics"
    approve(promotion.id, reviewer, "known: the suite is harder")
    row = Receipt.objects.get(kind="approval", subject="hacked")
    assert row.body["override"] is True and row.body["alarms"] == promotion.alarms
    assert Adapter.objects.get(name="hacked").loaded


def test_the_alarm_needs_both_a_rising_reward_and_a_held_out_drop():
    rose = reward_trend([0.1, 0.2, 0.5, 0.9])
    fell = reward_trend([0.9, 0.5, 0.2, 0.1])
    assert rose["rose"] and rose["first"] == 0.1 and rose["last"] == 0.9 and not fell["rose"]
    assert reward_trend([0.5]) is None and reward_trend(None) is None
    drop = {"candidate_accuracy": 0.4, "baseline_accuracy": 0.6}
    assert promotion_alarms({"reward_trend": rose, "gate": drop})
    assert not promotion_alarms({"reward_trend": fell, "gate": drop})
    assert not promotion_alarms({"reward_trend": rose, "gate": {"candidate_accuracy": 0.7, "baseline_accuracy": 0.6}})
    assert not promotion_alarms({"reward_trend": rose, "gate": None})


def test_a_gate_against_an_adapter_that_no_longer_serves_is_never_applied_automatically(home, settings):
    """The gate compared the candidate with `prev`; meanwhile `other` became active. Passing that gate
    proves nothing against `other`: a person decides, and the alarm says why."""
    policy(settings, require_approval=False)
    requester, reviewer, _ = users()
    published(home, "other")
    from django.db import transaction

    from adapters.activation import make_active

    training = _job("training.grpo", user=requester)
    published(home, "prev", loaded=True)
    published(home, "cand", job=training)
    with transaction.atomic():
        make_active(name="other", reason="promoted meanwhile")
    payload = PostEvalJobPayload(training_job_id=str(training.uuid), adapter_name="cand",
                                 post_eval=PostEvalConfig.from_dict({"suite": "held", "min_accuracy": 0.5}),
                                 suite_hash="sha256:" + "1" * 64, baseline_adapter="prev", auto_load=True)
    evidence = {"policy_version": "paired_wilson_v1", "eval_job_id": "e1", "candidate_adapter": "cand",
                "baseline_adapter": "prev", "candidate_accuracy": 0.8, "baseline_accuracy": 0.5,
                "outcome": "promoted"}
    result = _apply(JobContext(_job("training.post_eval", user=requester, state="running")), payload, "promoted",
                    evidence, "e1", "verdict")
    assert result["activated_at"] is None and result["promotion_id"] is not None
    assert Adapter.objects.get(name="other").loaded and not Adapter.objects.get(name="cand").loaded
    promotion = Promotion.objects.get(id=result["promotion_id"])
    assert promotion.state == "pending" and promotion.incumbent == "other"
    assert promotion.alarms == ["the held-out gate compared the candidate with 'prev', but 'other' is active "
                                "now: the candidate was never compared with the adapter it would replace"]


def test_the_baseline_alarm_reads_base_spellings_as_one():
    from adapters.promotion_evidence import baseline_mismatch

    assert baseline_mismatch({"gate": {"baseline_adapter": None}}, None) is None
    assert baseline_mismatch({"gate": {"baseline_adapter": "base"}}, None) is None
    assert baseline_mismatch({"gate": {"baseline_adapter": "prev"}}, "prev") is None
    assert baseline_mismatch({"gate": None}, "prev") is None  # no gate: nothing was compared
    assert "compared the candidate with the base model, but 'm-r001' is active" in \
        baseline_mismatch({"gate": {"baseline_adapter": None}}, "m-r001")
    assert promotion_alarms({"gate": {"baseline_adapter": None}}) == []  # incumbent not given: not checked
