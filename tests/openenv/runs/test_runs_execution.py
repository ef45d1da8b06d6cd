"""Persisted rollout runs executed in process against a real openenv==0.10.0 server (its own venv).

The behavior policy is the deterministic fake (tests/openenv/collector_fakes.py), not a model; the
jobs run through `run_queued_jobs("control")`. Covers the stages to rollout_ready, the artifacts
and their re-checked downloads (modified, truncated, symlinked, replaced, missing: 409), FIFO order
under max_active_runs=1, cancellation while collecting, and a queued run resuming after a restart.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time

import pytest
from django.db import connections

from core.jobs.models import Job
from core.jobs.runner import run_queued_jobs
from openenv.models import ACTIVE_STATES, OpenEnvRun
from openenv.runs.services import runs_restore
from tests.openenv.collector_fakes import FakeCounterPolicy
from tests.openenv.runs.conftest import error_of, metric, post_run, rollout_body

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def status(api, run_id):
    return api.get(f"/v1/openenv/runs/{run_id}").json()


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.mark.django_db
def test_a_rollout_run_publishes_its_artifacts_and_downloads_recheck_them(api, home, counter, policies):
    run = post_run(api, rollout_body(counter.url, idempotency_key="counter:1")).json()
    run_queued_jobs("control")
    done = status(api, run["run_id"])
    assert done["state"] == "rollout_ready", done
    assert done["stage"] == "artifact_publication" and "failure" not in done and "finished_unix_ms" in done
    assert done["progress"] == {"groups_completed": 2, "groups_total": 2, "rollouts_completed": 4,
                                "rollouts_total": 4}
    stats = done["rollout_stats"]
    assert stats["done_count"] == 4 and stats["min_episode_return"] <= stats["mean_episode_return"] \
        <= stats["max_episode_return"]
    [identity] = done["environments"]
    assert identity["base_url"] == counter.url and identity["metadata"]["name"] == "kiln_counter"
    assert [a["kind"] for a in done["artifacts"]] == ["dataset", "replay", "summary"]
    folder = home / "adapters" / ".openenv" / "runs" / run["run_id"]
    assert sorted(p.name for p in folder.iterdir()) == ["replay.json", "rollouts.jsonl", "run.json", "summary.json"]
    record = json.loads((folder / "run.json").read_text())
    assert record["state"] == "rollout_ready" and record["artifacts"] == done["artifacts"]
    assert record["idempotency_key"] == "counter:1" and "queue_position" not in record["admission"]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["stats"] == stats and summary["groups"] == 2 and summary["seed_start"] == 100
    assert Job.objects.get(uuid=done["job_id"]).state == "completed"
    # GET /metrics counts the published collection with the summary's own numbers, and no label names it
    assert metric(api, "kiln_openenv_episode_terminations_total", termination="done") == 4
    assert metric(api, "kiln_openenv_episode_terminations_total", termination="protocol_error") == 0
    assert metric(api, "kiln_openenv_environment_steps_total") == stats["total_environment_steps"] > 0
    assert metric(api, "kiln_openenv_model_tokens_total") == stats["total_model_tokens"]
    assert metric(api, "kiln_openenv_model_latency_seconds_total") == pytest.approx(
        stats["mean_model_latency_ms"] * 4 / 1000)
    assert metric(api, "kiln_openenv_tracked_runs", state="rollout_ready") == 1
    assert metric(api, "kiln_jobs", kind="openenv.run", state="completed") == 1
    exposition = api.get("/metrics").content.decode()
    assert run["run_id"] not in exposition and counter.url not in exposition and "127.0.0.1" not in exposition

    for artifact in done["artifacts"]:
        response = api.get(artifact["url"])
        assert response.status_code == 200, response.content
        body = b"".join(response.streaming_content)
        assert sha(body) == artifact["sha256"] and len(body) == artifact["bytes"]
        extension = "jsonl" if artifact["kind"] == "dataset" else "json"
        assert response["Content-Length"] == str(artifact["bytes"])
        assert response["ETag"] == f'"{artifact["sha256"]}"'
        assert response["Cache-Control"] == "private, no-store"
        assert response["X-Content-Type-Options"] == "nosniff"
        assert response["Content-Disposition"] == \
            f'attachment; filename="openenv-{run["run_id"]}-{artifact["kind"]}.{extension}"'
    error_of(api.get(f"/v1/openenv/runs/{run['run_id']}/artifacts/train_receipt"), 404, "openenv_artifact_not_found")
    error_of(api.get(f"/v1/openenv/runs/{run['run_id']}/artifacts/secrets"), 404, "openenv_artifact_not_found")
    error_of(api.delete(f"/v1/openenv/runs/{run['run_id']}"), 409, "openenv_run_not_cancellable")

    url = f"/v1/openenv/runs/{run['run_id']}/artifacts/"
    dataset, summary_path, replay = folder / "rollouts.jsonl", folder / "summary.json", folder / "replay.json"
    original = dataset.read_bytes()
    # Modified in place (same length), truncated, replaced by a symlink to an identical copy, missing.
    dataset.write_bytes(original[:-2] + b"X\n")
    assert "does not hash" in error_of(api.get(url + "dataset"), 409, "openenv_artifact_integrity_failed")["message"]
    dataset.write_bytes(original[:-10])
    assert "bytes" in error_of(api.get(url + "dataset"), 409, "openenv_artifact_integrity_failed")["message"]
    dataset.write_bytes(original)
    assert api.get(url + "dataset").status_code == 200
    copy = folder.parent / "copy.json"
    copy.write_bytes(summary_path.read_bytes())
    summary_path.unlink()
    os.symlink(copy, summary_path)
    assert "symlink" in error_of(api.get(url + "summary"), 409, "openenv_artifact_integrity_failed")["message"]
    replay.unlink()
    replay.write_bytes(b"{}\n")  # replaced by another file
    error_of(api.get(url + "replay"), 409, "openenv_artifact_integrity_failed")
    replay.unlink()
    assert "missing" in error_of(api.get(url + "replay"), 409, "openenv_artifact_integrity_failed")["message"]


@pytest.mark.django_db
def test_fifo_admission_runs_one_at_a_time_in_sequence_order(api, home, counter, policies, bounds):
    bounds(max_active_runs=1)
    snapshots = []
    policies.on_start = lambda run: snapshots.append(
        (str(run.id), sorted((str(r.id), r.state) for r in OpenEnvRun.objects.filter(state__in=ACTIVE_STATES))))
    ids = [post_run(api, rollout_body(counter.url, seed_start=s)).json()["run_id"] for s in (10, 20, 30)]
    assert [status(api, i)["state"] for i in ids] == ["discovering", "queued", "queued"]
    run_queued_jobs("control")
    assert policies.started == ids  # started in sequence order
    for run_id, active in snapshots:  # and each alone
        assert active == [(run_id, "discovering")], snapshots
    finals = [status(api, i) for i in ids]
    assert [f["state"] for f in finals] == ["rollout_ready"] * 3
    admitted = [f["admission"]["admitted_unix_ms"] for f in finals]
    assert admitted == sorted(admitted) and finals[2]["admission"]["queue_wait_ms"] >= 0
    # Each run used its own seeds.
    seeds = [{r.seed for r in policies.policies[i].requests} for i in ids]
    assert all(s and max(s) < 2 ** 64 for s in seeds) and len({frozenset(s) for s in seeds}) == 3


@pytest.mark.django_db
def test_a_run_whose_actions_break_the_schema_says_why_among_its_warnings(api, home, counter, policies):
    policies.policy_type = lambda: FakeCounterPolicy(content=lambda request: '{"delta": 99}')
    run = post_run(api, rollout_body(counter.url)).json()
    run_queued_jobs("control")
    done = status(api, run["run_id"])
    assert done["state"] == "rollout_ready" and done["rollout_stats"]["invalid_model_action_count"] == 4, done
    [warning] = done["warnings"]
    assert warning.startswith("4 of 4 episodes ended at an action Kiln refused (ACTION_SCHEMA_VALIDATION_FAILED 4;")
    assert "/delta" in warning
    assert status(api, post_run(api, rollout_body(counter.url, seed_start=7)).json()["run_id"])["warnings"] == []


class BlockingPolicy(FakeCounterPolicy):
    """Answers the first turn of each episode only once `release` is set: the run stays collecting."""

    entered = threading.Event()
    release = threading.Event()

    async def __call__(self, request):
        BlockingPolicy.entered.set()
        while not BlockingPolicy.release.is_set():
            await asyncio.sleep(0.02)
        return await super().__call__(request)


@pytest.mark.django_db(transaction=True)
def test_cancel_while_collecting_stops_at_the_boundary_and_publishes_nothing(api, home, counter, policies):
    BlockingPolicy.entered.clear()
    BlockingPolicy.release.clear()
    policies.policy_type = BlockingPolicy
    run_id = post_run(api, rollout_body(counter.url)).json()["run_id"]
    errors = []

    def worker():
        try:
            run_queued_jobs("control")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=worker)
    thread.start()
    try:
        assert BlockingPolicy.entered.wait(60), "the collection never asked the policy"
        deadline = time.monotonic() + 30
        while True:  # the in-memory test database refuses a second writer now and then: ask again
            response = api.delete(f"/v1/openenv/runs/{run_id}")
            if response.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert response.status_code == 200, response.content
        assert response.json()["cancel_requested"] is True
        # The job persists the collector's phase when it next polls it, so the row may still say
        # discovering although the policy was already asked; what counts is where it stops (below).
        assert response.json()["state"] in ("discovering", "collecting", "cancelled")
    finally:
        thread.join(120)
        BlockingPolicy.release.set()
    assert not errors and not thread.is_alive()
    final = status(api, run_id)
    assert final["state"] == "cancelled" and final["stage"] == "collection", final
    assert final["artifacts"] == [] and "rollout_stats" not in final
    assert Job.objects.get(uuid=final["job_id"]).state == "cancelled"
    folder = home / "adapters" / ".openenv" / "runs" / run_id
    assert sorted(p.name for p in folder.iterdir()) == ["run.json"]
    assert json.loads((folder / "run.json").read_text())["state"] == "cancelled"
    ended = error_of(api.get(f"/v1/openenv/runs/{run_id}/artifacts/dataset"), 404, "openenv_artifact_not_found")
    # a run that ended never publishes: not "not ready", and no "wait until the run publishes it"
    assert "ended cancelled without publishing its dataset" in ended["message"] and "wait" not in ended["hint"]


@pytest.mark.django_db
def test_after_a_restart_the_queued_run_resumes_and_completes(api, home, counter, policies, bounds):
    bounds(max_active_runs=1)
    first, second = (post_run(api, rollout_body(counter.url, seed_start=s)).json()["run_id"] for s in (0, 40))
    from core.jobs.services import job_claim_next
    from core.jobs.worker_state import recover_queues

    job_claim_next(queue="control", worker_id="gone-host:7:dead")  # the first run's worker died
    recover_queues(["control"])
    assert runs_restore(worker_id="me") == {"interrupted": [first], "admitted": [second]}
    run_queued_jobs("control")
    assert policies.started == [second]
    assert status(api, first)["failure"]["code"] == "run_interrupted"
    assert status(api, second)["state"] == "rollout_ready"


@pytest.mark.django_db
def test_a_change_between_the_runs_discovery_and_its_episodes_fails_it(api, home, policies, monkeypatch):
    """The identity a run shows while collecting is the one its episodes are checked against: a
    redeploy right after that discovery is caught, not bound by a second discovery."""
    from openenv.runs import jobs
    from tests.openenv.fake_server import FakeServer

    with FakeServer() as server:
        discover = jobs.discover

        async def then_redeployed(config):
            found = await discover(config)
            server.documents["/metadata"]["version"] = "0.2.0"
            return found

        monkeypatch.setattr(jobs, "discover", then_redeployed)
        run = post_run(api, rollout_body(server.url, groups=1, group_size=2, max_steps=2)).json()
        run_queued_jobs("control")
        failed = status(api, run["run_id"])
    assert failed["state"] == "failed", failed
    assert failed["failure"]["code"] == "environment_identity_changed", failed["failure"]
    assert failed["failure"]["stage"] == "identity_verification" and "metadata" in failed["failure"]["message"]
    assert failed["artifacts"] == [] and server.sessions == 2  # its episodes ran, then nothing was published


@pytest.mark.django_db
def test_a_cancel_answered_while_the_files_are_published_still_wins(api, home, counter, policies, monkeypatch):
    """A DELETE that lands after collection's last check (the QA soak's run answered 200
    cancel_requested, then ended rollout_ready with its artifacts): the run ends cancelled instead."""
    from openenv.runs import jobs

    policies.policy_type = FakeCounterPolicy
    run_id = post_run(api, rollout_body(counter.url)).json()["run_id"]
    real_publish, answers = jobs.publish, []

    def publish_then_cancel(bundle):
        real_publish(bundle)
        answers.append(api.delete(f"/v1/openenv/runs/{run_id}"))

    monkeypatch.setattr(jobs, "publish", publish_then_cancel)
    run_queued_jobs("control")
    assert answers and answers[0].status_code == 200 and answers[0].json()["cancel_requested"] is True
    final = status(api, run_id)
    assert final["state"] == "cancelled" and final["artifacts"] == [], final
    assert Job.objects.get(uuid=final["job_id"]).state == "cancelled"
    error_of(api.get(f"/v1/openenv/runs/{run_id}/artifacts/dataset"), 404, "openenv_artifact_not_found")
