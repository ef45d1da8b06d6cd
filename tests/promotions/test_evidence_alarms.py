"""The promotion evidence (policy audit, reward histogram, KL to the reference, held-out lengths and
side-by-side samples) and the reward-hacking alarms raised from it (adapters.promotion_evidence).

The train receipt is the trainer's own (`RunLedger` fed step stats with `grpo_loss`'s keys, then
`build_receipt`); the held-out figures come from a real `training.post_eval` job run in process: its
`eval.run` compare job is sampled from a fake model service in place of the GPU worker (as in
tests/evaluations/test_eval_jobs_api.py) and scored, and the real gate decides. No model, no torch."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from adapters.models import Adapter, Promotion
from adapters.promotion_evidence import (
    DEFAULT_MAX_KL_TO_REFERENCE,
    MAX_SAMPLES,
    SAMPLE_CHARS,
    histogram,
    kl_to_reference,
    promotion_alarms,
    promotion_evidence,
)
from adapters.promotions import promotion_out, promotion_request
from core.canonical import json_digest
from core.contracts.groups import admit_groups
from core.contracts.grpo_config import GrpoConfig
from core.contracts.grpo_submission import PostEvalConfig
from core.jobs.models import Job
from core.models import ReceiptKind
from core.receipts import receipt_record
from gpu_runtime.grpo.receipt import RunLedger, build_receipt
from kiln_project.cli.promotions_cmd import _print_detail
from tests.adapters_verify.chain_support import job_row
from tests.evaluations.test_eval_jobs_api import IDENTITY, gpu_worker  # noqa: F401 (the fixture)
from tests.promotions.support import client_for, policy, published, users

pytestmark = pytest.mark.django_db

N_EXAMPLES = 24
SUITE = {"name": "held", "scorer": {"type": "contains"},
         "examples": [{"id": f"q{i:02d}", "messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
                       "target": str(2 * i)} for i in range(N_EXAMPLES)]}


# -- a real train receipt ----------------------------------------------------------------------------

def _stats(kl: float, tokens: int = 8) -> dict:
    """One optimizer step's stats with the keys `losses.grpo_loss` returns."""
    return {"ratio_scope": "token", "action_tokens": tokens, "ratio_observations": tokens, "ratio_sum": float(tokens),
            "ratio_min": 0.7, "ratio_max": 1.4, "ratio_mean": 1.0, "below_clip_count": 1, "above_clip_count": 1,
            "kl_token_observations": tokens, "kl_entropy_mask_applied_tokens": tokens,
            "kl_log_ratio_sum": kl * tokens, "kl_estimator_sum": kl * tokens, "kl_masked_estimator_sum": kl * tokens,
            "kl_mean_log_ratio": kl, "kl_mean_estimator": kl, "kl_mean_masked_estimator": kl,
            "loss": 0.1, "policy_loss": 0.1, "kl_loss": 0.1 * kl, "echo_loss": 0.0}


def train_receipt(name: str, *, kls: list[float], groups: list[dict], corpus_sha256: str) -> dict:
    """The trainer's receipt of one step per group, with the per-step KL to the reference in `kls`."""
    ledger = RunLedger()
    rewards = [[c["reward"] for c in g["completions"]] for g in groups]
    for index, (kl, group_rewards) in enumerate(zip(kls, rewards, strict=True)):
        group = SimpleNamespace(index=index, rewards=group_rewards, completions=[
            SimpleNamespace(token_counts={"action_tokens": 4}, provenance=None) for _ in group_rewards])
        ledger.observe_group(group, [SimpleNamespace(stats=_stats(kl), grad_norm=0.5)], elapsed_secs=0.1,
                             total_steps=len(kls))
    return build_receipt(adapter_name=name, status="success", failure=None, config=GrpoConfig.from_dict({}),
                         ledger=ledger, groups_rewards=rewards, filter_result=None, model={}, tokenizer={},
                         adapters={}, training_data={"source": "inline", "sha256": corpus_sha256}, timings={},
                         runtime={}, fallbacks=[], lora_delta_norms=[], smoke_test=None)


def trained(home, name: str, *, kls: list[float], user=None) -> tuple[Adapter, Job]:
    """A finished training job (its pinned snapshot on disk), its published adapter and its TRAIN row."""
    groups = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
               "completions": [{"text": str(2 * i), "reward": 1.0}, {"text": "?", "reward": i / len(kls)}]}
              for i in range(len(kls))]
    corpus = admit_groups(groups)
    snapshot = home / "training" / "snapshots" / f"{name}.jsonl"
    snapshot.parent.mkdir(parents=True, exist_ok=True)
    snapshot.write_bytes(corpus.jsonl)
    training = job_row("training.grpo", payload={
        "adapter_name": name, "snapshot_path": str(snapshot),
        "training_data": {"source": "inline", "admitted_corpus_sha256": corpus.sha256}})
    if user is not None:
        Job.objects.filter(id=training.id).update(submitted_by=user)
        training.refresh_from_db()
    adapter = published(home, name, job=training)
    receipt_record(kind=ReceiptKind.TRAIN, subject=name, job=training,
                   body=train_receipt(name, kls=kls, groups=corpus.groups, corpus_sha256=corpus.sha256))
    return Adapter.objects.select_related("training_job").get(id=adapter.id), training


# -- a real post-eval compare ------------------------------------------------------------------------

class Model:
    """The model service: the candidate answers every sum right at length (`pad` words of reasoning
    first), the incumbent answers odd sums right and even ones wrong, in a few words."""

    def __init__(self, pad: int):
        self.pad = pad

    def __call__(self, body, timeout=900.0):
        number = int(body["messages"][-1]["content"].split()[2])
        adapter = Adapter.objects.filter(name=body.get("adapter") or "").first()
        if adapter is not None and adapter.name != "prev":
            answer = " ".join(["step"] * self.pad + [f"so {number} + {number} = {2 * number}."])
        else:
            answer = f"It is {2 * number if number % 2 else 2 * number + 1}."
        tokens = [len(word) for word in answer.split()]
        policy = {"base_model_sha256": IDENTITY["base_model_sha256"],
                  "inference_config_sha256": IDENTITY["inference_config_sha256"]}
        if adapter is not None:
            policy["adapter"] = {"name": adapter.name, "content_sha256": adapter.content_sha256}
        provenance = {"seed": body["seed"], "input_token_ids": [1, 2, 3, *tokens], "prompt_token_count": 3,
                      "behavior_policy": policy}
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop",
                             "rollout_provenance": provenance}],
                "usage": {"prompt_tokens": 3, "completion_tokens": len(tokens), "total_tokens": 3 + len(tokens)}}


@pytest.fixture
def model(monkeypatch, gpu_worker):  # noqa: F811
    """Install a Model (`model(pad)`), and let the post-eval job run its eval job inline (in the real
    worker it waits for the control queue to run it)."""
    from adapters.serving import sync_client
    from core.jobs import runner
    from training import post_eval_jobs

    def inline(ctx, eval_job):
        runner._run_one(eval_job.queue, "test-worker")
        return Job.objects.get(id=eval_job.id)

    monkeypatch.setattr(post_eval_jobs, "_wait_for", inline)
    return lambda pad: monkeypatch.setattr(sync_client, "chat_completion_sync", Model(pad))


def post_eval(home, capture, *, name: str, kls: list[float], user=None) -> Job:
    """Train (a receipt), then run the gated post-eval of `name` against the active `prev`."""
    from core.jobs.runner import run_queued_jobs
    from evaluations.suite_services import suite_store
    from training.post_eval_jobs import post_eval_submit

    suite = suite_store(body=SUITE)
    published(home, "prev", loaded=True)
    _, training = trained(home, name, kls=kls, user=user)
    with capture(execute=True):
        post = post_eval_submit(training_job=training, adapter_name=name, auto_load=True, suite_hash=suite.suite_hash,
                                post_eval=PostEvalConfig.from_dict({"suite": "held", "min_accuracy": 0.5}))
    Job.objects.filter(id=training.id).update(result={"post_eval_job_id": str(post.uuid)})
    with capture(execute=True):
        run_queued_jobs("control")
    post.refresh_from_db()
    assert post.state == "completed", (post.error_code, post.error_message)
    return post


LOW_KL = [0.01, 0.02, 0.02, 0.03, 0.03, 0.04, 0.04, 0.05]  # last quarter mean 0.045


def test_a_real_post_eval_gives_lengths_and_samples_and_a_length_explosion_is_flagged(
        home, settings, model, django_capture_on_commit_callbacks, capsys):
    from evaluations.eval_selectors import eval_records

    policy(settings, require_approval=False)  # so only the alarm can hold it back
    model(12)
    post = post_eval(home, django_capture_on_commit_callbacks, name="cand", kls=LOW_KL)
    assert post.result["gate_outcome"] == "promoted", post.result["post_eval_verdict"]
    promotion = Promotion.objects.get(id=post.result["promotion_id"])
    assert promotion.state == "pending" and promotion.incumbent == "prev"
    assert not Adapter.objects.get(name="cand").loaded  # flagged: never applied automatically
    assert not Job.objects.filter(kind="adapter.activate").exists()
    [alarm] = promotion.alarms
    assert alarm.startswith("completion lengths exploded") and "24" in alarm
    assert "vs baseline 'prev' 3 over 24" in alarm and "incumbent" not in alarm  # the gate's baseline arm
    evidence = promotion.evidence

    lengths = evidence["lengths"]
    candidate, incumbent = lengths["candidate"], lengths["incumbent"]
    assert candidate["count"] == incumbent["count"] == N_EXAMPLES
    assert candidate["mean"] == candidate["median"] == 18.0 and incumbent["mean"] == 3.0
    assert lengths["ratio"] == 6.0 and lengths["eval_job_id"] == evidence["gate"]["eval_job_id"]
    assert (lengths["candidate_adapter"], lengths["incumbent_adapter"]) == ("cand", "prev")

    eval_job = Job.objects.get(uuid=evidence["gate"]["eval_job_id"])
    records = {(r["example_id"], r["target_index"]): r for r in eval_records(job=eval_job)}
    samples = evidence["samples"]
    assert len(samples) == MAX_SAMPLES
    # the examples where the outcomes differ (the even sums) come first, in suite order
    assert [s["example_id"] for s in samples] == ["q00", "q02", "q04", "q06", "q08", "q10"]
    for sample in samples:
        assert sample["prompt"] == f"What is {int(sample['example_id'][1:])} + {int(sample['example_id'][1:])}?"
        assert sample["candidate"] == records[(sample["example_id"], 1)]["completion"]
        assert sample["incumbent"] == records[(sample["example_id"], 0)]["completion"]
        assert (sample["candidate_outcome"], sample["incumbent_outcome"]) == ("pass", "fail")

    assert evidence["kl_to_reference"]["value"] == pytest.approx(0.045)
    assert evidence["kl_to_reference"]["statistic"] == "last_quarter_mean"
    assert evidence["policy_audit"]["kl"]["step_max"] == 0.05 and evidence["policy_audit"]["kl_estimator"] == "k1"
    assert evidence["policy_audit"]["clip"]["outside_fraction"] == pytest.approx(0.25)
    hist = evidence["reward_histogram"]
    assert hist["of"] == "completion_reward" and hist["count"] == 16 and sum(hist["counts"]) == 16
    assert hist["counts"][-1] == 8 and hist["min"] == 0.0 and hist["max"] == 1.0  # the right answers (1.0)
    # the stored digest is reproducible: the evidence gathered again from the rows and files is the same
    again = promotion_evidence(adapter=Adapter.objects.get(name="cand"))
    assert json_digest(again) == json_digest(promotion_evidence(adapter=Adapter.objects.get(name="cand")))
    assert json_digest(again) == promotion.evidence_sha256

    _print_detail(promotion_out(promotion, detail=True))  # kiln promotions show
    shown = capsys.readouterr().out
    assert "ALARM: completion lengths exploded" in shown
    assert "KL to reference: 0.045 nats/token (last_quarter_mean" in shown and "bound 0.5" in shown
    assert "held-out lengths: candidate mean 18 / median 18 over 24, baseline prev mean 3 / median 3 over 24" in shown
    assert "ratio 6; allowed 0.5..2" in shown and "clipped ratios: 0.25 of 64" in shown
    assert "  q00: What is 0 + 0?" in shown and "    baseline prev [fail]: It is 1." in shown
    assert shown.count("    candidate [pass]: step step") == 2


def test_a_promoted_candidate_of_ordinary_length_raises_nothing(home, settings, model,
                                                                 django_capture_on_commit_callbacks):
    requester, _, _ = users()  # a team: the approval policy proposes it
    model(0)  # "so N + N = 2N." is 6 tokens against "It is M." (3): the ratio is exactly the bound, 2
    post = post_eval(home, django_capture_on_commit_callbacks, name="fine", kls=LOW_KL, user=requester)
    promotion = Promotion.objects.get(id=post.result["promotion_id"])
    assert promotion.alarms == [] and promotion.state == "pending"
    assert promotion.evidence["lengths"]["ratio"] == 2.0 and promotion.evidence["alarm_bounds"]["max_length_ratio"] == 2


def test_the_kl_alarm_needs_no_gate(home):
    """The auto_load path: an adapter with only its train receipt still raises the KL alarm."""
    high = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.9]  # last quarter mean 0.85
    adapter, _ = trained(home, "drifted", kls=high)
    evidence = promotion_evidence(adapter=adapter)
    assert evidence["gate"] is None and evidence["lengths"] is None and evidence["samples"] is None
    assert evidence["kl_to_reference"]["value"] == pytest.approx(0.85)
    [alarm] = promotion_alarms(evidence)
    assert "KL to the reference is 0.85" in alarm and "max_kl_to_reference = 0.5" in alarm
    promotion = promotion_request(candidate="drifted", reason="by hand")
    assert promotion.state == "pending" and promotion.alarms == [alarm]
    calm, _ = trained(home, "calm", kls=LOW_KL)
    assert promotion_alarms(promotion_evidence(adapter=calm)) == []


def test_missing_figures_raise_nothing_and_do_not_crash(home):
    bare = published(home, "bare")
    evidence = promotion_evidence(adapter=bare)
    for key in ("gate", "reward_statistics", "reward_trend", "reward_histogram", "policy_audit", "kl_to_reference",
                "lengths", "samples"):
        assert evidence[key] is None, key
    assert promotion_alarms(evidence) == [] and promotion_alarms({}) == []
    assert promotion_alarms({"kl_to_reference": {"value": None}, "lengths": {"candidate": {}, "incumbent": None}}) == []
    weird = {"gate": {"candidate_accuracy": "x"}, "reward_trend": {"rose": True, "first": 0, "last": 1},
             "kl_to_reference": {"value": float("nan")}, "lengths": {"candidate": {"mean": 5, "count": 9},
                                                                     "incumbent": {"mean": 0, "count": 9}}}
    assert promotion_alarms(weird) == []
    json_digest(evidence)  # canonical JSON: no NaN, no object the digest refuses


def test_a_tampered_results_file_gives_no_held_out_figures(home, settings, model, django_capture_on_commit_callbacks):
    policy(settings, require_approval=False)
    model(12)
    post = post_eval(home, django_capture_on_commit_callbacks, name="cand", kls=LOW_KL)
    eval_id = post.result["linked_eval_job_ids"][0]
    results = settings.KILN.layout.eval_job(eval_id) / "results.json"
    results.chmod(0o644)
    results.write_text(results.read_text().replace('"pass"', '"fail"'))
    evidence = promotion_evidence(adapter=Adapter.objects.get(name="cand"))
    assert evidence["lengths"] is None and evidence["samples"] is None and evidence["gate"] is not None


# -- the alarm rules at their bounds -------------------------------------------------------------------

def _kl(value):
    return {"kl_to_reference": {"value": value, "statistic": "last_quarter_mean", "source": "test"}}


def _lengths(candidate: float, incumbent: float, n_candidate: int = 8, n_incumbent: int = 8):
    return {"lengths": {"candidate": {"mean": candidate, "count": n_candidate},
                        "incumbent": {"mean": incumbent, "count": n_incumbent}}}


def test_the_kl_alarm_fires_only_above_the_bound():
    assert DEFAULT_MAX_KL_TO_REFERENCE == 0.5
    assert promotion_alarms(_kl(0.5)) == []  # at the bound: nothing
    assert promotion_alarms(_kl(0.49)) == [] and promotion_alarms(_kl(-0.2)) == []
    [alarm] = promotion_alarms(_kl(0.5001))
    assert alarm.startswith("KL to the reference is 0.5001 nats/token (last_quarter_mean of test)")


@pytest.mark.parametrize(("candidate", "incumbent", "fires"), [
    (50, 100, None), (49.9, 100, "collapsed"), (200, 100, None), (200.1, 100, "exploded"), (100, 100, None),
])
def test_the_length_alarm_fires_only_outside_the_ratios(candidate, incumbent, fires):
    alarms = promotion_alarms(_lengths(candidate, incumbent))
    assert alarms == [] if fires is None else (len(alarms) == 1 and f"completion lengths {fires}" in alarms[0])


def test_the_length_alarm_needs_enough_samples_on_both_sides():
    assert promotion_alarms(_lengths(10, 100, 7, 8)) == [] and promotion_alarms(_lengths(10, 100, 8, 7)) == []
    assert promotion_alarms(_lengths(10, 100, 8, 8))


def test_the_configured_bounds_are_respected_and_recorded(home, settings):
    policy(settings, max_kl_to_reference=1.0, min_length_ratio=0.25, max_length_ratio=4.0)
    assert promotion_alarms(_kl(0.9)) == [] and promotion_alarms(_kl(1.01))
    assert promotion_alarms(_lengths(30, 100)) == [] and promotion_alarms(_lengths(24, 100))
    assert promotion_alarms(_lengths(400, 100)) == [] and promotion_alarms(_lengths(401, 100))
    evidence = promotion_evidence(adapter=published(home, "a"))
    assert evidence["alarm_bounds"] == {"max_kl_to_reference": 1.0, "min_length_ratio": 0.25,
                                        "max_length_ratio": 4.0, "min_length_samples": 8}
    # the evidence's own bounds decide (what the digest bound), not a later configuration
    policy(settings, max_kl_to_reference=0.5)
    assert promotion_alarms({**evidence, **_kl(0.9)}) == [] and promotion_alarms(_kl(0.9))


def test_the_bounds_load_from_toml_and_environment_and_show_in_v1_config(tmp_path, monkeypatch, settings):
    from kiln_project.config import ConfigError, load_config

    monkeypatch.chdir(tmp_path)
    config = load_config({"KILN_HOME": str(tmp_path)})
    assert (config.promotion_max_kl_to_reference, config.promotion_min_length_ratio,
            config.promotion_max_length_ratio) == (0.5, 0.5, 2.0)
    (tmp_path / "kiln.toml").write_text("[promotion]\nmax_kl_to_reference = 0.2\nmin_length_ratio = 0.3\n"
                                        "max_length_ratio = 3\n")
    config = load_config({"KILN_HOME": str(tmp_path)})
    assert (config.promotion_max_kl_to_reference, config.promotion_min_length_ratio,
            config.promotion_max_length_ratio) == (0.2, 0.3, 3.0)
    config = load_config({"KILN_HOME": str(tmp_path), "KILN_PROMOTION_MAX_KL_TO_REFERENCE": "1.5",
                          "KILN_PROMOTION_MAX_LENGTH_RATIO": "2.5"})
    assert (config.promotion_max_kl_to_reference, config.promotion_max_length_ratio) == (1.5, 2.5)
    for text in ('max_kl_to_reference = "lots"', "max_kl_to_reference = 0", "max_kl_to_reference = inf",
                 "min_length_ratio = 1.5", "max_length_ratio = 0.9", "max_kl_to_reference = true"):
        (tmp_path / "kiln.toml").write_text(f"[promotion]\n{text}\n")
        with pytest.raises(ConfigError):
            load_config({"KILN_HOME": str(tmp_path)})
    users()
    settings.KILN = replace(settings.KILN, promotion_max_kl_to_reference=0.7)
    shown = client_for("reviewer").get("/v1/config").json()["config"]
    assert shown["promotion_max_kl_to_reference"] == 0.7
    assert (shown["promotion_min_length_ratio"], shown["promotion_max_length_ratio"]) == (0.5, 2.0)


# -- the figures -----------------------------------------------------------------------------------------

def test_the_histogram_has_fixed_bins_over_min_and_max():
    found = histogram([0.0, 0.05, 0.1, 0.95, 1.0, 1.0])
    assert found["bins"] == 10 and found["counts"] == [2, 1, 0, 0, 0, 0, 0, 0, 0, 3] and found["edges"][-1] == 1.0
    assert histogram([0.5, 0.5]) == {"count": 2, "min": 0.5, "max": 0.5, "bins": 1, "edges": [0.5, 0.5],
                                     "counts": [2]}
    assert histogram([]) is None and histogram([float("nan"), None]) is None


def test_the_kl_figure_is_the_last_quarter_of_the_steps_else_the_run_mean():
    receipt = train_receipt("x", kls=[0.1] * 6 + [0.3, 0.5], corpus_sha256="sha256:" + "0" * 64,
                            groups=[{"completions": [{"reward": 1.0}, {"reward": 0.0}]}] * 8)
    figure = kl_to_reference(receipt)
    assert figure["value"] == pytest.approx(0.4) and figure["window"] == 2 and figure["final"] == 0.5
    assert figure["source"] == "train_receipt.loss_history.kl_estimator_mean" and figure["max"] == 0.5
    run_mean = kl_to_reference({**receipt, "loss_history": []})
    assert run_mean["statistic"] == "run_mean" and run_mean["value"] == pytest.approx(1.4 / 8)
    live = kl_to_reference({}, {"kl_history": [{"step": 1, "kl_mean": 0.2}, {"step": 2, "kl_mean": 0.6}]})
    assert live["source"] == "training_job_metrics.kl_history" and live["value"] == 0.6
    assert kl_to_reference({}) is None and kl_to_reference({"grpo": "odd", "loss_history": "odd"}) is None


def test_samples_are_truncated(home):
    from adapters.promotion_heldout import _clip

    assert _clip("x" * 1000) == "x" * (SAMPLE_CHARS - 1) + "…" and _clip("short") == "short" and _clip(None) is None


def test_a_negative_kl_figure_is_said_to_be_a_signed_estimate(capsys):
    from kiln_project.cli.promotions_cmd import _print_figures

    _print_figures({"kl_to_reference": {"value": -0.67, "statistic": "last_quarter_mean", "source": "s"},
                    "alarm_bounds": {"max_kl_to_reference": 0.5}})
    shown = capsys.readouterr().out
    assert "KL to reference: -0.67" in shown and "a signed k1 estimate" in shown
    _print_figures({"kl_to_reference": {"value": 0.2, "statistic": "last_quarter_mean", "source": "s"},
                    "alarm_bounds": {"max_kl_to_reference": 0.5}})
    assert "signed" not in capsys.readouterr().out
