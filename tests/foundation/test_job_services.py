"""The job lifecycle services: FIFO claims, caps, cancellation, finishing once, restart recovery."""

import pytest
from django.utils import timezone

from core.errors import KilnError
from core.jobs import services
from core.jobs.models import Job, WorkerHeartbeat
from core.jobs.runner import run_queued_jobs
from core.jobs.worker_state import recover_queues

pytestmark = pytest.mark.django_db


def test_claims_follow_submission_order_per_queue():
    a = services.job_submit(kind="test.steps", payload={})
    other = services.job_submit(kind="test.control_steps", payload={})
    b = services.job_submit(kind="test.steps", payload={})
    assert services.job_claim_next(queue="gpu", worker_id="w1").id == a.id
    assert services.job_claim_next(queue="gpu", worker_id="w1").id == b.id
    assert services.job_claim_next(queue="gpu", worker_id="w1") is None
    assert services.job_claim_next(queue="control", worker_id="w1").id == other.id


def test_unknown_kind_is_refused():
    with pytest.raises(KilnError) as info:
        services.job_submit(kind="nope", payload={})
    assert info.value.code == "job_kind_unknown"
    assert Job.objects.count() == 0


def test_queue_cap_refuses_with_retry_after_and_writes_nothing():
    services.job_submit(kind="test.steps", payload={}, max_queued=2)
    services.job_submit(kind="test.steps", payload={}, max_queued=2)
    with pytest.raises(KilnError) as info:
        services.job_submit(kind="test.steps", payload={}, max_queued=2)
    assert (info.value.code, info.value.status, info.value.headers) == ("job_queue_full", 503, {"Retry-After": "30"})
    assert Job.objects.count() == 2
    # Another queue has its own cap.
    services.job_submit(kind="test.control_steps", payload={}, max_queued=2)


def test_a_follow_up_of_a_publishing_job_is_never_refused_by_the_queue_cap():
    """A training's activation and gate are queued in the transaction that publishes it: a full control
    queue refusing them failed the whole finished training (review)."""
    for _ in range(2):
        services.job_submit(kind="test.control_steps", payload={}, max_queued=2)
    with pytest.raises(KilnError) as refused:
        services.job_submit(kind="test.control_steps", payload={}, max_queued=2)
    assert refused.value.code == "job_queue_full"
    follow_up = services.job_submit(kind="test.control_steps", payload={}, max_queued=2, follow_up=True)
    assert follow_up.state == "queued" and Job.objects.filter(queue="control").count() == 3


def test_a_job_finishes_only_once():
    job = services.job_submit(kind="test.steps", payload={})
    job = services.job_claim_next(queue="gpu", worker_id="w1")
    assert services.job_complete(job=job, result={"ok": 1}) is True
    assert services.job_fail(job=job, code="late", message="too late") is False
    job.refresh_from_db()
    assert (job.state, job.result, job.error_code) == ("completed", {"ok": 1}, "")


def test_cancel_queued_then_running_then_terminal():
    queued = services.job_submit(kind="test.steps", payload={})
    assert services.job_cancel(job=queued).state == "cancelled"
    assert services.job_claim_next(queue="gpu", worker_id="w1") is None  # a cancelled job never starts
    running = services.job_submit(kind="test.steps", payload={})
    running = services.job_claim_next(queue="gpu", worker_id="w1")
    after = services.job_cancel(job=running)
    assert (after.state, after.cancel_requested) == ("running", True)
    assert services.job_mark_cancelled(job=running) is True
    with pytest.raises(KilnError) as info:
        services.job_cancel(job=running)
    assert (info.value.code, info.value.status) == ("job_not_cancellable", 409)


def test_runner_completes_fails_and_cancels(tmp_path, monkeypatch):
    ok = services.job_submit(kind="test.steps", payload={"steps": 4})
    run_queued_jobs("gpu")
    ok.refresh_from_db()
    assert (ok.state, ok.progress, ok.result) == ("completed", 1.0, {"steps_done": 4})
    assert ok.progress_message == "completed"  # not the last step's line, which read as still going
    assert [e.type for e in ok.events.all()].count("progress") == 4

    bad = services.job_submit(kind="test.fail", payload={"message": "nope"})
    run_queued_jobs("control")
    bad.refresh_from_db()
    assert (bad.state, bad.error_code, bad.error_message) == ("failed", "test_failure", "nope")

    stopped = services.job_submit(kind="test.steps", payload={"steps": 4})
    Job.objects.filter(id=stopped.id).update(cancel_requested=True)  # as if cancelled just after it started
    run_queued_jobs("gpu")
    stopped.refresh_from_db()
    assert (stopped.state, stopped.progress, stopped.error_code) == ("cancelled", 0.0, "job_cancelled")


def test_a_cancel_is_decided_once_at_the_point_of_publication():
    """should_stop() is polled (a stale answer for up to half a second); begin_publishing reads the row:
    a cancel that came while the last work ran stops the job, and one after it is refused, never
    accepted and then ignored."""
    from core.jobs.runner import JobCancelled, JobContext

    late = services.job_submit(kind="test.steps", payload={})
    late = services.job_claim_next(queue="gpu", worker_id="w1")
    ctx = JobContext(late)
    assert ctx.should_stop() is False  # the poll that the last step saw
    services.job_cancel(job=late)  # the cancel arrives while the last step runs
    assert ctx.should_stop() is False  # still the stale answer
    with pytest.raises(JobCancelled):
        ctx.begin_publishing()
    late.refresh_from_db()
    assert (late.cancel_requested, late.publishing) == (True, False)

    publishing = services.job_submit(kind="test.steps", payload={})
    publishing = services.job_claim_next(queue="gpu", worker_id="w1")
    ctx = JobContext(publishing)
    ctx.begin_publishing()
    with pytest.raises(KilnError) as refused:
        services.job_cancel(job=publishing)
    assert (refused.value.code, refused.value.status) == ("job_not_cancellable", 409)
    assert "publishing its result" in refused.value.message
    publishing.refresh_from_db()
    assert (publishing.state, publishing.cancel_requested) == ("running", False)

    # A worker that stalled while restart recovery failed its job publishes nothing either.
    stalled = services.job_submit(kind="test.steps", payload={})
    stalled = services.job_claim_next(queue="gpu", worker_id="w1")
    ctx = JobContext(stalled)
    assert services.jobs_fail_interrupted(job_ids=[stalled.id], reason="its worker stopped") == 1
    with pytest.raises(JobCancelled):
        ctx.begin_publishing()
    stalled.refresh_from_db()
    assert (stalled.state, stalled.error_code, stalled.publishing) == ("failed", "job_interrupted", False)


def _heartbeat(worker_id: str, *, pid: int, seconds_ago: float = 0, stopped: bool = False, host=None):
    import socket

    now = timezone.now() - timezone.timedelta(seconds=seconds_ago)
    WorkerHeartbeat.objects.create(worker_id=worker_id, hostname=host or socket.gethostname(), pid=pid,
                                   queues=["gpu"], started_at=now, last_seen=now, stopped=stopped)


def test_recovery_fails_jobs_of_dead_workers_only():
    import os

    jobs = [services.job_submit(kind="test.steps", payload={}) for _ in range(4)]
    for job, worker in zip(jobs[:3], ["alive", "stale", "gone"], strict=True):
        Job.objects.filter(id=job.id).update(state="running", worker_id=worker)
    _heartbeat("alive", pid=os.getpid())
    _heartbeat("stale", pid=os.getpid(), seconds_ago=120)
    # "gone" has no heartbeat row at all.
    queued = recover_queues(["gpu"])
    states = {j.id: Job.objects.get(id=j.id) for j in jobs}
    assert states[jobs[0].id].state == "running"
    assert (states[jobs[1].id].state, states[jobs[1].id].error_code) == ("failed", "job_interrupted")
    assert (states[jobs[2].id].state, states[jobs[2].id].error_code) == ("failed", "job_interrupted")
    assert queued == [jobs[3].id]


def test_recovery_detects_a_dead_pid_on_this_host_at_once():
    job = services.job_submit(kind="test.steps", payload={})
    Job.objects.filter(id=job.id).update(state="running", worker_id="dead-pid")
    _heartbeat("dead-pid", pid=2**22 + 12345)  # fresh heartbeat, but no such process
    recover_queues(["gpu"])
    job.refresh_from_db()
    assert job.error_code == "job_interrupted"


def test_a_queue_whose_jobs_wait_with_nothing_running_is_woken_again(monkeypatch):
    """A wake-up lost while Redis stalled leaves a job queued: kiln serve re-sends the wake-up of a
    queue whose oldest job has waited, unless a job runs there (the worker takes the next one itself)."""
    from datetime import timedelta

    from django.utils import timezone

    from core.jobs import dispatch, tasks
    from core.jobs.models import Job

    sent = []
    monkeypatch.setattr(dispatch, "wake_queue", lambda queue: sent.append(queue))
    fresh = services.job_submit(kind="test.steps", payload={"steps": 1})
    assert dispatch.wake_stalled_queues(waited_seconds=20) == [] and sent == []  # too fresh to be stalled
    Job.objects.filter(id=fresh.id).update(created_at=timezone.now() - timedelta(seconds=60))
    assert dispatch.wake_stalled_queues(waited_seconds=20) == [fresh.queue] and sent == [fresh.queue]
    running = services.job_submit(kind="test.steps", payload={"steps": 1})
    Job.objects.filter(id=running.id).update(state="running")
    sent.clear()
    assert dispatch.wake_stalled_queues(waited_seconds=20) == [] and sent == []
    assert fresh.queue in tasks.WAKE_ACTORS


def test_a_failed_jobs_error_always_carries_a_hint():
    from core.jobs.error_hints import job_error

    job = services.job_submit(kind="test.steps", payload={"steps": 1})
    assert job_error(job) is None
    job = services.job_claim_next(queue="gpu", worker_id="w1")
    services.job_fail(job=job, code="checkpoint_source_mismatch", message="another route")
    hint = job_error(Job.objects.get(id=job.id))["hint"]
    assert "same route" in hint
    services.job_submit(kind="test.steps", payload={"steps": 1})
    other = services.job_claim_next(queue="gpu", worker_id="w1")
    services.job_fail(job=other, code="something_new", message="?")
    assert job_error(Job.objects.get(id=other.id)) == {"code": "something_new", "message": "?",
                                                       "hint": "see the job's events (kiln jobs show ID) for what happened"}


def test_only_the_submitter_or_a_holder_of_delete_others_jobs_cancels_a_job():
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission

    users = get_user_model().objects
    owner, other, admin = (users.create_user(name, password="x" * 12) for name in ("owner", "other", "admin"))
    admin.user_permissions.add(Permission.objects.get(codename="delete_others_jobs"))
    admin = users.get(id=admin.id)  # a fresh permission cache
    queued = services.job_submit(kind="test.steps", payload={}, user=owner)
    with pytest.raises(KilnError) as refused:
        services.job_cancel(job=queued, user=other)
    assert (refused.value.code, refused.value.status) == ("job_cancel_forbidden", 403)
    queued.refresh_from_db()
    assert queued.state == "queued" and not queued.cancel_requested  # nothing changed
    assert services.job_cancel(job=queued, user=admin).state == "cancelled"
    mine = services.job_submit(kind="test.steps", payload={}, user=owner)
    assert services.job_cancel(job=mine, user=owner).state == "cancelled"
    anyones = services.job_submit(kind="test.steps", payload={})  # submitted anonymously
    assert services.job_cancel(job=anyones, user=other).state == "cancelled"


def test_a_delete_that_lost_the_race_answers_the_routes_own_not_found_code():
    """Two DELETEs of one training job at once: the loser read the row before the winner hid it."""
    job = services.job_submit(kind="test.steps", payload={})
    Job.objects.filter(id=job.id).update(state="completed", finished_at=timezone.now())
    job.refresh_from_db()
    stale = Job.objects.get(id=job.id)
    services.job_delete(job=job, not_found_code="training_job_not_found")
    with pytest.raises(KilnError) as info:
        services.job_delete(job=stale, not_found_code="training_job_not_found")
    assert (info.value.code, info.value.status) == ("training_job_not_found", 404)


def test_a_status_source_is_read_at_every_beat_and_one_that_fails_is_left_out(monkeypatch):
    from core.jobs import worker_state

    monkeypatch.setattr(worker_state, "_status_sources", {})
    monkeypatch.setattr(worker_state, "_worker_status", {"model": {"loaded": True}})
    readings = iter([{"available_for_training_mib": 100.0}, {"available_for_training_mib": 60.0}])
    worker_state.set_worker_status_source("memory", lambda: next(readings))
    worker_state.beat()
    row = WorkerHeartbeat.objects.get(worker_id=worker_state.current_worker_id())
    assert row.status == {"model": {"loaded": True}, "memory": {"available_for_training_mib": 100.0}}
    worker_state.beat()
    row.refresh_from_db()
    assert row.status["memory"] == {"available_for_training_mib": 60.0}
    worker_state.beat()  # the source is exhausted (it raises): the fact is absent, the beat still lands
    row.refresh_from_db()
    assert row.status == {"model": {"loaded": True}}
