"""`kind: train` runs with `environment_eval` against a real openenv==0.10.0 server (its own venv), jobs in
process: the scripted fake policy collects, the real GRPO trainer trains the tiny model (lora rank 2),
then the run's `openenv.environment_eval` job evaluates baseline (base) against candidate (the published
output adapter) on 20 held-out seed groups through injected fake policies of known skill (reset target 4,
two steps: the skilled policy earns 4 per episode, the naive one 2, so 20 of 20 groups differ and the
exact sign test gives p = 2 / 2^20 = 1.9073486328125e-06; deterministic, no false-failure rate).

Covers: a better candidate passes and is promoted through the promotion workflow (the serving canary
answered by the `canary_worker` stand-in; with the approval policy on, a pending promotion instead); a
worse one is rejected and never served; without a gate the result is diagnostic; cancellation while
evaluating; restoration of a run interrupted in environment_evaluating; the receipt row and the
downloaded receipt artifact agree on their digest."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
from dataclasses import replace
from datetime import timedelta

import pytest
from django.utils import timezone

from adapters.models import Adapter, Promotion
from adapters.selectors import adapter_active
from core.jobs import services as job_services
from core.jobs.models import Job, WorkerHeartbeat
from core.jobs.runner import run_queued_jobs
from core.models import Receipt, ReceiptKind
from openenv.collector import PolicyReply
from openenv.models import OpenEnvRun
from openenv.runs.services import runs_restore
from tests.openenv.collector_fakes import last_observation
from tests.openenv.training.conftest import post_run, train_body

pytestmark = [pytest.mark.integration, pytest.mark.django_db, pytest.mark.timeout(600)]

GATE = {"groups": 20, "gate": {"min_mean_improvement": 0.5}}
P_20_OF_20 = 2 / 2 ** 20
EVAL_KINDS = [f"environment_eval_{side}_{what}" for side in ("baseline", "candidate")
              for what in ("dataset", "replay", "summary")] + ["environment_eval_receipt"]


def status(api, run_id):
    return api.get(f"/v1/openenv/runs/{run_id}").json()


def download(api, run_id, kind) -> bytes:
    response = api.get(f"/v1/openenv/runs/{run_id}/artifacts/{kind}")
    assert response.status_code == 200, (kind, response.content)
    return b"".join(response.streaming_content)


class SkillPolicy:
    """Moves straight at the target (skilled: by up to 3) or always +1 (naive), answering with the run's
    sealed behavior policy plus the adapter the evaluation asked for (its published revision)."""

    def __init__(self, skill: str, behavior: dict, hang: bool = False):
        self.skill, self.behavior, self.hang = skill, behavior, hang
        self.calls = 0

    async def __call__(self, request):
        self.calls += 1
        if self.hang:
            await asyncio.sleep(3600)  # until the evaluation is cancelled
        observation = last_observation(request.messages)
        distance = observation["target"] - observation["value"]
        move = 1 if self.skill == "naive" else (max(-3, min(3, distance)) or 1)
        content = "\n\n" + json.dumps({"delta": move})
        return PolicyReply(content=content, reasoning="thinking about the counter\n" if request.sampling.thinking
                           else None, behavior_policy=dict(self.behavior), tokens=len(content))


class EvalPolicies:
    """Stands in for openenv.training.evaluation.make_policy_factory: adapter -> a SkillPolicy."""

    def __init__(self):
        self.skills = {"baseline": "naive", "candidate": "skilled"}
        self.hang_candidate = False
        self.made: dict = {}

    def __call__(self, run, ctx):  # the job's thread; the factory itself is called on the evaluation's loop
        expected = run.training_contract["behavior_policy"]
        output = run.request["output_adapter"]
        revision = Adapter.objects.get(name=output).content_sha256

        def factory(adapter):
            side = "candidate" if adapter == output else "baseline"
            behavior = {**expected, "adapter": {"name": output, "content_sha256": revision}} \
                if side == "candidate" else dict(expected)
            policy = SkillPolicy(self.skills[side], behavior, hang=side == "candidate" and self.hang_candidate)
            self.made[side] = policy
            return policy
        return factory


@pytest.fixture
def eval_policies(monkeypatch):
    factory = EvalPolicies()
    monkeypatch.setattr("openenv.training.evaluation.make_policy_factory", factory)
    return factory


def train_and_wait(api, body, capture) -> dict:
    """POST, collect, train (the follower queues the evaluation job): the run in environment_evaluating."""
    response = post_run(api, body)
    assert response.status_code == 202, response.content
    run_id = response.json()["run_id"]
    run_queued_jobs("control")
    assert status(api, run_id)["state"] == "training_queued", status(api, run_id)
    with capture(execute=True):
        run_queued_jobs("gpu")
    evaluating = status(api, run_id)
    assert evaluating["state"] == "environment_evaluating", evaluating
    return evaluating


def test_a_better_candidate_passes_the_gate_and_is_promoted(api, home, counter, served, policies, eval_policies,
                                                           canary_worker, django_capture_on_commit_callbacks):
    body = train_body(counter.url, auto_load=True, environment_eval=GATE, idempotency_key="gate:pass")
    evaluating = train_and_wait(api, body, django_capture_on_commit_callbacks)
    run_id = evaluating["run_id"]
    # The gate owns promotion: training was sealed (and ran) without loading the adapter.
    assert evaluating["training_contract"]["effective_config"]["auto_load"] is False
    adapter = Adapter.objects.get(name="counter-agent")
    assert adapter.state == "published" and not adapter.loaded
    pending = evaluating["environment_evaluation"]
    assert pending["state"] == "pending" and (pending["seed_start"], pending["groups"], pending["group_size"]) == \
        (103, 20, 1)
    assert pending["baseline"] == {"adapter": None, "adapter_content_revision": None}
    assert pending["candidate"] == {"adapter": "counter-agent", "adapter_content_revision": adapter.content_sha256}
    eval_job = Job.objects.get(uuid=evaluating["environment_eval_job_id"])
    assert eval_job.kind == "openenv.environment_eval" and eval_job.queue == "control"

    with django_capture_on_commit_callbacks(execute=True):
        run_queued_jobs("control")  # the evaluation, then the activation it asked for (canary, then active)
    done = status(api, run_id)
    assert done["state"] == "completed" and done["stage"] == "environment_evaluation", done
    block = done["environment_evaluation"]
    assert block["state"] == "completed" and block["outcome"] == "promoted"
    evidence = block["evidence"]
    assert evidence["decision"] == "passed" and evidence["policy_version"] == "paired_return_sign_test_v1"
    assert (evidence["paired_groups"], evidence["improved_groups"], evidence["regressed_groups"],
            evidence["tied_groups"]) == (20, 20, 0, 0)
    assert evidence["exact_sign_test_p_value"] == P_20_OF_20
    assert (evidence["baseline_mean_return"], evidence["candidate_mean_return"]) == (2.0, 4.0)
    assert block["baseline_stats"]["mean_episode_return"] == 2.0
    assert block["candidate"]["adapter_content_revision"] == adapter.content_sha256
    assert block["promotion"]["action"] == "activation_submitted"
    assert eval_policies.made["candidate"].calls == 40 and eval_policies.made["baseline"].calls == 40
    adapter.refresh_from_db()
    assert adapter_active() == adapter and adapter.loaded
    assert canary_worker.calls and canary_worker.calls[0]["adapter"] == "counter-agent"

    kinds = [a["kind"] for a in done["artifacts"]]
    assert kinds == ["dataset", "replay", "summary", "train_receipt", "adapter_manifest", *EVAL_KINDS]
    folder = home / "adapters" / ".openenv" / "runs" / run_id / "environment-evaluation"
    for entry in done["artifacts"]:
        data = download(api, run_id, entry["kind"])
        assert len(data) == entry["bytes"] and "sha256:" + hashlib.sha256(data).hexdigest() == entry["sha256"]
    assert download(api, run_id, "environment_eval_candidate_summary") == \
        (folder / "candidate" / "summary.json").read_bytes()
    # The receipt row binds exactly the downloaded receipt's bytes.
    receipt_bytes = download(api, run_id, "environment_eval_receipt")
    row = Receipt.objects.get(kind=ReceiptKind.ENVIRONMENT_EVAL)
    assert row.sha256 == "sha256:" + hashlib.sha256(receipt_bytes).hexdigest() == block["receipt_sha256"]
    receipt = json.loads(receipt_bytes)
    assert receipt["run_id"] == run_id and receipt["outcome"] == "promoted" and row.subject == "counter-agent"
    assert receipt["evidence"] == evidence and row.job_id == eval_job.id
    assert json.loads((folder.parent / "run.json").read_text())["environment_evaluation"]["outcome"] == "promoted"

    # kiln adapters verify walks the environment gate too (QA: it said "no gate decided"): the receipt
    # row, its published bytes, the side summaries and the decision recomputed from them, and the
    # activation that gate queued
    from adapters.verify import verify_adapter

    report = verify_adapter("counter-agent")
    assert report.ok, report.to_dict()
    links = {link.link: link.detail for link in report.links}
    assert f"receipt row {row.id} (run {run_id}): recomputed paired_return_sign_test_v1 gives promoted (20 improved" \
        in links["environment_gate"]
    assert links["environment_gate.activation"].startswith("1 activation(s) queued by a promoted environment gate")
    summary = folder / "baseline" / "summary.json"
    original = summary.read_bytes()
    summary.write_bytes(original.replace(b'"mean_episode_return": 2', b'"mean_episode_return": 5', 1))
    assert summary.read_bytes() != original
    first = verify_adapter("counter-agent").first_broken
    assert first.link == "environment_gate" and "baseline/summary.json hashes to" in first.detail
    summary.write_bytes(original)
    (folder / "receipt.json").write_bytes(receipt_bytes.replace(b'"promoted"', b'"kept"'))
    first = verify_adapter("counter-agent").first_broken
    assert first.link == "environment_gate" and "receipt.json is not receipt row" in first.detail


def test_with_the_approval_policy_on_a_passed_gate_waits_for_a_person(api, home, counter, served, policies,
                                                                     eval_policies, settings,
                                                                     django_capture_on_commit_callbacks):
    settings.KILN = replace(settings.KILN, promotion_require_approval=True)
    body = train_body(counter.url, auto_load=True, environment_eval=GATE)
    run_id = train_and_wait(api, body, django_capture_on_commit_callbacks)["run_id"]
    with django_capture_on_commit_callbacks(execute=True):
        run_queued_jobs("control")
    block = status(api, run_id)["environment_evaluation"]
    assert block["outcome"] == "promoted" and block["promotion"]["action"] == "promotion_requested"
    promotion = Promotion.objects.get(id=block["promotion"]["promotion_id"])
    assert promotion.candidate == "counter-agent" and promotion.state == "pending"
    assert adapter_active() is None and not Adapter.objects.get(name="counter-agent").loaded


def test_a_worse_candidate_is_rejected_and_never_served(api, home, counter, served, policies, eval_policies,
                                                        canary_worker, django_capture_on_commit_callbacks):
    eval_policies.skills = {"baseline": "skilled", "candidate": "naive"}
    body = train_body(counter.url, auto_load=True, environment_eval=GATE)
    run_id = train_and_wait(api, body, django_capture_on_commit_callbacks)["run_id"]
    with django_capture_on_commit_callbacks(execute=True):
        run_queued_jobs("control")
    done = status(api, run_id)
    assert done["state"] == "completed", done
    block = done["environment_evaluation"]
    assert block["outcome"] == "rejected" and block["evidence"]["decision"] == "rejected"
    assert (block["evidence"]["improved_groups"], block["evidence"]["regressed_groups"]) == (0, 20)
    assert block["evidence"]["exact_sign_test_p_value"] == P_20_OF_20
    assert block["promotion"]["action"] == "not_served"
    assert adapter_active() is None and not Adapter.objects.get(name="counter-agent").loaded
    assert not Job.objects.filter(kind="adapter.activate").exists() and not Promotion.objects.exists()
    assert canary_worker.calls == []
    receipt = json.loads(download(api, run_id, "environment_eval_receipt"))
    assert receipt["outcome"] == "rejected" and receipt["evidence"]["decision"] == "rejected"
    from adapters.verify import verify_adapter

    report = verify_adapter("counter-agent")  # the rejection is recomputed too: a recorded fact, not a break
    assert report.ok and "gives rejected (0 improved, 20 regressed" in \
        {link.link: link.detail for link in report.links}["environment_gate"]


def test_without_a_gate_the_evaluation_is_diagnostic(api, home, counter, served, policies, eval_policies,
                                                    django_capture_on_commit_callbacks):
    body = train_body(counter.url, environment_eval={"groups": 4, "group_size": 2, "seed_start": 500})
    run_id = train_and_wait(api, body, django_capture_on_commit_callbacks)["run_id"]
    with django_capture_on_commit_callbacks(execute=True):
        run_queued_jobs("control")
    done = status(api, run_id)
    assert done["state"] == "completed", done
    block = done["environment_evaluation"]
    assert block["outcome"] == "diagnostic" and block["evidence"]["decision"] == "diagnostic"
    assert (block["seed_start"], block["groups"], block["group_size"]) == (500, 4, 2)
    assert block["evidence"]["improved_groups"] == 4 and block["promotion"]["action"] == "none"
    assert not Adapter.objects.get(name="counter-agent").loaded  # auto_load false: nobody loads it
    assert [a["kind"] for a in done["artifacts"]][-7:] == EVAL_KINDS


def test_cancel_while_evaluating_stops_the_evaluation_and_publishes_nothing(
        api, home, counter, served, policies, eval_policies, monkeypatch, django_capture_on_commit_callbacks):
    from openenv.training import evaluation

    eval_policies.hang_candidate = True
    body = train_body(counter.url, environment_eval=GATE)
    run_id = train_and_wait(api, body, django_capture_on_commit_callbacks)["run_id"]
    seen, asked = [], []
    persist = evaluation._Persist.__call__

    def watching(self, snapshot):  # the job's own thread: cancel through the route once the candidate runs
        persist(self, snapshot)
        seen.append(snapshot["state"])
        if snapshot["state"] == "collecting_candidate" and not asked:
            asked.append(api.delete(f"/v1/openenv/runs/{run_id}").json())

    monkeypatch.setattr(evaluation._Persist, "__call__", watching)
    run_queued_jobs("control")
    assert asked[0]["state"] == "environment_evaluating" and asked[0]["cancel_requested"] is True
    assert asked[0]["environment_evaluation"]["state"] == "collecting_candidate"
    assert "collecting_baseline" in seen
    done = status(api, run_id)
    assert done["state"] == "cancelled" and done["environment_evaluation"]["state"] == "cancelled", done
    assert not any(a["kind"].startswith("environment_eval_") for a in done["artifacts"])
    assert not (home / "adapters" / ".openenv" / "runs" / run_id / "environment-evaluation" / "baseline").exists()
    assert Job.objects.get(uuid=done["environment_eval_job_id"]).state == "cancelled"
    assert not Receipt.objects.filter(kind=ReceiptKind.ENVIRONMENT_EVAL).exists()


def test_restart_fails_a_run_interrupted_while_evaluating(api, home, counter, served, policies, eval_policies,
                                                         django_capture_on_commit_callbacks):
    body = train_body(counter.url, groups=1, environment_eval={"groups": 2})
    created = post_run(api, body).json()
    run = OpenEnvRun.objects.get(id=created["run_id"])
    # A run whose evaluation job was claimed by a worker that then died (its heartbeat is stale).
    job = job_services.job_submit(kind="openenv.environment_eval", payload={"run_id": str(run.id)})
    OpenEnvRun.objects.filter(id=run.id).update(state="environment_evaluating", stage="environment_evaluation",
                                                environment_eval_job=job, admitted_at=timezone.now(),
                                                environment_evaluation={"state": "collecting_baseline"})
    Job.objects.filter(kind="openenv.run").update(state="completed")
    stale = timezone.now() - timedelta(minutes=10)
    WorkerHeartbeat.objects.create(worker_id="dead-control", hostname=socket.gethostname(), pid=os.getpid(),
                                   queues=["control"], started_at=stale, last_seen=stale, status={})
    assert job_services.job_claim_next(queue="control", worker_id="dead-control") == job
    with django_capture_on_commit_callbacks(execute=True):
        report = runs_restore(worker_id="control-after-restart")
    assert report["interrupted"] == [str(run.id)]
    failed = status(api, str(run.id))
    assert failed["state"] == "failed" and failed["failure"]["code"] == "run_interrupted"
    assert failed["failure"]["stage"] == "restoration" and failed["failure"]["retryable"] is True
    assert failed["environment_evaluation"]["state"] == "failed"
    assert Job.objects.get(id=job.id).error_code == "job_interrupted"
