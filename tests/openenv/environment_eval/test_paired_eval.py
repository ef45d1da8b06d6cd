"""The paired environment evaluation (openenv.environment_eval) against a real openenv==0.10.0 server,
with deterministic counter policies of known skill in place of the served model (tests/.../support.py)."""

from __future__ import annotations

import hashlib
import json
import math
import threading
from fractions import Fraction

import pytest

from core.canonical import canonical_json, json_digest
from openenv.environment_eval import (
    EnvironmentEvalCancelled,
    EnvironmentEvalError,
    EvalPlan,
    EvalPolicy,
    publish_receipt,
    run_environment_eval,
)
from openenv.environment_gate import final_outcome
from tests.openenv.environment_eval.support import (
    Factory,
    adapter_sha,
    base_config,
    behavior_for,
    expected_return,
)
from tests.openenv.real_server import RealServer, openenv_python

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

GATE = {"groups": 20, "group_size": 1, "gate": {"min_mean_improvement": 0.05}}
SMALL = {"groups": 4, "group_size": 1}  # diagnostic: enough to show a drift or a stop
BASELINE, CANDIDATE = EvalPolicy("agent-v1", adapter_sha("agent-v1")), EvalPolicy("agent-v2", adapter_sha("agent-v2"))


def evaluate(url, tmp_path, skills, eval_config=GATE, **kwargs):
    base = kwargs.pop("base", None) or base_config(url, tmp_path)
    plan = EvalPlan.of(eval_config, train_seed_start=base.seed_start, train_groups=base.groups)
    factory = kwargs.pop("factory", None) or Factory({"agent-v1": skills[0], "agent-v2": skills[1]})
    result = run_environment_eval(base=base, plan=plan, baseline=kwargs.pop("baseline", BASELINE),
                                  candidate=kwargs.pop("candidate", CANDIDATE), out_dir=tmp_path / "eval",
                                  policy_factory=factory, **kwargs)
    return result, factory


def sha(path):
    return "sha256:" + hashlib.sha256(path.read_bytes()).hexdigest()


def expected_counts(baseline_skill, candidate_skill, seeds):
    improved = regressed = 0
    for seed in seeds:
        b, c = expected_return(baseline_skill, seed), expected_return(candidate_skill, seed)
        improved += c > b
        regressed += c < b
    return improved, regressed


def binomial_p(improved, regressed):
    n = improved + regressed
    k = min(improved, regressed)
    return min(Fraction(1), Fraction(2 * sum(math.comb(n, i) for i in range(k + 1)), 2**n))


def test_a_better_candidate_passes_with_the_exact_p(counter, tmp_path):
    progress = []
    result, factory = evaluate(counter.url, tmp_path, ("naive", "skilled"), on_progress=progress.append)
    seeds = range(104, 124)  # the first seed after training's [100, 104)
    improved, regressed = expected_counts("naive", "skilled", seeds)
    e = result.gate.evidence
    assert result.decision == "passed", result.gate.reason
    assert (e["improved_groups"], e["regressed_groups"], e["tied_groups"]) == (improved, regressed, 20 - improved)
    assert regressed == 0 and improved >= 14
    assert e["exact_sign_test_p_value"] == float(binomial_p(improved, regressed))
    assert result.gate.p_value == binomial_p(improved, regressed)
    assert e["baseline_mean_return"] == pytest.approx(sum(expected_return("naive", s) for s in seeds) / 20)
    assert e["candidate_mean_return"] == pytest.approx(sum(expected_return("skilled", s) for s in seeds) / 20)
    assert {p["state"] for p in progress} >= {"collecting_baseline", "collecting_candidate", "completed"}

    # identical plans on both sides, read back from the published artifacts
    out = tmp_path / "eval"
    replays = {side: json.loads((out / side / "replay.json").read_text()) for side in ("baseline", "candidate")}
    summaries = {side: json.loads((out / side / "summary.json").read_text()) for side in ("baseline", "candidate")}
    plan = {side: [(g["group_index"], g["environment_index"], g["seed"], g["reset_payload"],
                    [c["candidate_index"] for c in g["candidates"]]) for g in replays[side]["groups"]]
            for side in replays}
    assert plan["baseline"] == plan["candidate"]
    assert [g[2] for g in plan["baseline"]] == list(seeds)
    assert [g[3] for g in plan["baseline"]] == [{"seed": s, "episode_id": f"kiln-seed-{s}"} for s in seeds]
    for key in ("groups", "group_size", "seed_start", "max_steps", "concurrency", "max_action_tokens", "temperature",
                "thinking", "protocol_error_reward", "reset_plan_sha256"):
        assert summaries["baseline"][key] == summaries["candidate"][key], key
    assert summaries["baseline"]["concurrency"] == 1  # min(run concurrency 4, eval group_size 1)
    assert [e["identity"] for e in summaries["baseline"]["environments"]] == \
        [e["identity"] for e in summaries["candidate"]["environments"]]
    assert summaries["baseline"]["behavior_policy"] == behavior_for("agent-v1")
    assert summaries["candidate"]["behavior_policy"] == behavior_for("agent-v2")
    # the same generation seeds were asked of both policies
    asked = {a: sorted((r.group_index, r.candidate_index, r.step_index, r.seed) for r in p.requests)
             for a, p in factory.made.items()}
    assert asked["agent-v1"] == asked["agent-v2"] and len(asked["agent-v1"]) == 20
    # the six manifest entries match the files
    assert [a["kind"] for a in result.artifacts] == [f"environment_eval_{s}_{w}" for s in ("baseline", "candidate")
                                                     for w in ("dataset", "replay", "summary")]
    for entry in result.artifacts:
        path = out / entry["file"]
        assert sha(path) == entry["sha256"] and path.stat().st_size == entry["bytes"]
    assert result.baseline.identity()["execution_provenance_sha256"] == \
        result.candidate.identity()["execution_provenance_sha256"]

    # the receipt binds the summaries; its file is its canonical bytes
    body = result.receipt(run_id="run-1", outcome=final_outcome(result.decision, True))
    assert body["schema"] == "kiln.openenv-environment-evaluation.v1" and body["outcome"] == "promoted"
    assert body["baseline_summary_sha256"] == sha(out / "baseline" / "summary.json")
    assert body["candidate_summary_sha256"] == sha(out / "candidate" / "summary.json")
    assert body["seed_start"] == "104" and body["evidence"] == e
    assert body["baseline"]["adapter_content_revision"] == adapter_sha("agent-v1")
    entry = publish_receipt(result, body)
    assert (out / "receipt.json").read_bytes() == canonical_json(body)
    assert entry["sha256"] == json_digest(body) == sha(out / "receipt.json")
    tampered = {**body, "candidate_summary_sha256": "sha256:" + "0" * 64}
    assert json_digest(tampered) != json_digest(body)
    with pytest.raises(ValueError):
        result.receipt(run_id="run-1", outcome="rejected")  # not consistent with passed


def test_a_worse_candidate_is_rejected(counter, tmp_path):
    result, _ = evaluate(counter.url, tmp_path, ("skilled", "naive"))
    improved, regressed = expected_counts("skilled", "naive", range(104, 124))
    assert result.decision == "rejected" and "significantly worse" in result.gate.reason
    assert (result.gate.evidence["improved_groups"], result.gate.evidence["regressed_groups"]) == (improved, regressed)
    assert result.gate.p_value == binomial_p(improved, regressed)


def test_an_identical_candidate_is_inconclusive(counter, tmp_path):
    # (with min_mean_improvement 0.05 rule 5 would reject it first: test_gate covers that order)
    result, _ = evaluate(counter.url, tmp_path, ("skilled", "skilled"), eval_config={"gate": {}})
    e = result.gate.evidence
    assert result.decision == "inconclusive"
    assert (e["improved_groups"], e["regressed_groups"], e["tied_groups"]) == (0, 0, 20)
    assert e["exact_sign_test_p_value"] == 1.0


def test_without_a_gate_it_is_diagnostic(counter, tmp_path):
    result, _ = evaluate(counter.url, tmp_path, ("naive", "skilled"), eval_config={"groups": 4, "group_size": 2})
    assert result.decision == "diagnostic" and result.gate.evidence["paired_episodes"] == 8
    assert result.receipt(run_id="r", outcome="diagnostic")["config"] == {"groups": 4, "group_size": 2,
                                                                          "seed_start": "104"}


def test_an_overlapping_seed_interval_is_refused_before_any_episode(counter, tmp_path):
    factory = Factory({"agent-v1": "naive", "agent-v2": "skilled"})
    with pytest.raises(EnvironmentEvalError) as raised:
        evaluate(counter.url, tmp_path, None, eval_config={**GATE, "seed_start": 90}, factory=factory)
    assert raised.value.code == "environment_eval_invalid" and "overlap" in raised.value.message
    plan = EvalPlan(groups=20, group_size=1, seed_start=102, gate=None, train_seed_start=50, train_groups=4)
    with pytest.raises(EnvironmentEvalError, match="overlap"):
        run_environment_eval(base=base_config(counter.url, tmp_path), plan=plan, baseline=BASELINE,
                             candidate=CANDIDATE, out_dir=tmp_path / "eval", policy_factory=factory)
    assert factory.made == {} and not (tmp_path / "eval").exists()


def test_a_changed_base_model_fails_closed(counter, tmp_path):
    factory = Factory({"agent-v1": "naive", "agent-v2": "skilled"},
                      behavior_changes={"agent-v2": {"base_model_sha256": "sha256:" + "07" * 32}})
    with pytest.raises(EnvironmentEvalError) as raised:
        evaluate(counter.url, tmp_path, None, eval_config=SMALL, factory=factory)
    error = raised.value
    assert error.code == "environment_eval_policy_changed" and "base_model_sha256" in error.message
    assert error.as_failure()["stage"] == "environment_evaluation"
    assert error.failure_code == "training_evidence_invalid"
    assert not any((tmp_path / "eval").rglob("*.json*"))


@pytest.mark.parametrize("where", ["revision", "contract"])
def test_an_unexpected_adapter_revision_fails_closed(counter, tmp_path, where):
    kwargs = {"candidate": EvalPolicy("agent-v2", "sha256:" + "ab" * 32)} if where == "revision" else \
        {"expected_behavior": behavior_for("agent-v1", served_model_id="another")}
    with pytest.raises(EnvironmentEvalError) as raised:
        evaluate(counter.url, tmp_path, ("naive", "skilled"), eval_config=SMALL, **kwargs)
    assert raised.value.code == "environment_eval_policy_changed"
    assert not any((tmp_path / "eval").rglob("*.json*"))


def test_an_environment_changed_since_training_fails_closed_before_any_episode(counter, tmp_path):
    """QA: the environment's /metadata changed after collection (a redeploy); the evaluation ran on it and
    completed without a word. Given the identities training collected from, it fails before an episode."""
    from openenv.client import inspect_sync

    trained_on = inspect_sync(counter.url).identity
    result, _ = evaluate(counter.url, tmp_path / "same", ("naive", "naive"), eval_config=SMALL,
                         trained_on=[trained_on])  # the same deployment: evaluated as before
    assert result.gate is not None
    redeployed = {**trained_on, "metadata": {**trained_on["metadata"], "description": "v1, before a redeploy"},
                  "discovery_sha256": "sha256:" + "0" * 64}
    with pytest.raises(EnvironmentEvalError) as raised:
        evaluate(counter.url, tmp_path / "changed", ("naive", "skilled"), eval_config=SMALL, trained_on=[redeployed])
    error = raised.value
    assert error.code == "environment_eval_identity_changed" and error.failure_code == "environment_identity_changed"
    assert "not the environment the adapter was trained on (discovery_sha256, metadata changed" in error.message
    assert not any((tmp_path / "changed").rglob("*.json*"))


def test_an_environment_redeployed_between_the_sides_fails_closed(tmp_path):
    """The server is restarted on its port with another action bound (a changed schema) when the
    candidate's policy is made, i.e. after the baseline's collection and revalidation."""
    python = openenv_python()
    server = RealServer(python, tmp_path / "srv", max_sessions=4).start()
    replaced = []

    def redeploy(adapter):
        nonlocal server
        if adapter == "agent-v2" and not replaced:
            server.stop()
            server = RealServer(python, tmp_path / "srv2", port=server.port, max_sessions=4, max_delta=4).start()
            replaced.append(server)

    try:
        factory = Factory({"agent-v1": "naive", "agent-v2": "skilled"}, before=redeploy)
        with pytest.raises(EnvironmentEvalError) as raised:
            evaluate(server.url, tmp_path, None, eval_config=SMALL, factory=factory)
    finally:
        server.stop()
    error = raised.value
    assert replaced and error.code == "environment_eval_identity_changed", error
    assert error.failure_code == "environment_identity_changed" and "schema" in error.message
    assert not any((tmp_path / "eval").rglob("*.json*"))


def test_a_stop_cancels_and_publishes_nothing(counter, tmp_path):
    """The candidate's policy is held until the caller has asked to stop: on a fast machine a small
    evaluation could otherwise finish between two of the caller's polls, before any stop is seen."""
    candidate_requested, stop_seen = threading.Event(), threading.Event()

    def hold_the_candidate(adapter):
        if adapter == CANDIDATE.adapter:
            candidate_requested.set()
            assert stop_seen.wait(30), "the caller never asked to stop"

    def should_stop():
        if candidate_requested.is_set():
            stop_seen.set()
            return True
        return False

    seen = []
    with pytest.raises(EnvironmentEvalCancelled):
        evaluate(counter.url, tmp_path, ("naive", "skilled"), eval_config=SMALL, on_progress=seen.append,
                 should_stop=should_stop, factory=Factory({"agent-v1": "naive", "agent-v2": "skilled"},
                                                          before=hold_the_candidate))
    assert stop_seen.is_set() and seen and seen[-1]["state"] != "completed"
    assert not any((tmp_path / "eval").rglob("*.json*"))
