"""/health and serving profiles."""

import pytest

from core.errors import KilnError
from kiln_project.health import check_model_files

pytestmark = pytest.mark.django_db


def test_health_reports_broker_down_as_503(client):
    # tests/settings.py points Redis at a socket nobody serves, so the broker check fails.
    response = client.get("/health")
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["database"]["ok"] is True
    assert body["broker"]["ok"] is False
    assert body["error"]["code"] == "service_unavailable"
    assert body["serving_profile"] == "stable"
    assert body["training_backend"]["ready"] is False


def test_health_ok_when_broker_answers(client, monkeypatch):
    from kiln_project import health

    monkeypatch.setattr(health, "check_broker", lambda: {"ok": True, "url": "x"})
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json()["status"] == "degraded"  # no workers and no model yet


def test_model_file_checks(tmp_path):
    assert check_model_files(None)["reason"].startswith("no model configured")
    assert "not a directory" in check_model_files(tmp_path / "missing")["reason"]
    (tmp_path / "config.json").write_text("{}")
    result = check_model_files(tmp_path)
    assert result["loadable"] is False and "weights" in result["reason"] and "tokenizer" in result["reason"]
    (tmp_path / "model.safetensors").write_bytes(b"x")
    (tmp_path / "tokenizer.json").write_text("{}")
    assert check_model_files(tmp_path) == {"configured": True, "loadable": True, "path": str(tmp_path), "reason": ""}


@pytest.mark.parametrize("profile, activity, refused", [
    ("stable", "inference", False), ("stable", "training", False),
    ("maintenance", "inference", True), ("maintenance", "evaluation", True),
    ("maintenance", "training", False), ("maintenance", "adapter_change", False),
    ("experimental", "inference", False),
])
def test_serving_profiles(settings, profile, activity, refused):
    from dataclasses import replace

    from core.profiles import require_profile_allows

    settings.KILN = replace(settings.KILN, serving_profile=profile)
    if refused:
        with pytest.raises(KilnError) as info:
            require_profile_allows(activity)
        assert (info.value.code, info.value.status) == ("inference_disabled_by_profile", 503)
    else:
        require_profile_allows(activity)


def test_maintenance_admits_the_serving_canary_of_an_adapter_change(settings, monkeypatch):
    """The canary's in-cluster completion is part of an adapter change, which maintenance admits;
    any other in-cluster completion is inference, which it refuses."""
    from dataclasses import replace

    from adapters import canary
    from adapters.serving import sync_client

    settings.KILN = replace(settings.KILN, serving_profile="maintenance")
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with pytest.raises(KilnError) as refused:
        sync_client.chat_completion_sync(dict(body), timeout=1)
    assert refused.value.code == "inference_disabled_by_profile"
    with pytest.raises(KilnError) as admitted:  # past the profile: no GPU worker in this test
        sync_client.chat_completion_sync(dict(body), timeout=1, activity="adapter_change")
    assert admitted.value.code == "inference_unavailable"
    seen = {}
    monkeypatch.setattr(sync_client, "chat_completion_sync",
                        lambda body, timeout, activity="inference": seen.setdefault("activity", activity))
    canary._complete(dict(body), 1.0)
    assert seen == {"activity": "adapter_change"}


def test_health_without_credentials_gives_status_fields_only(client, monkeypatch, settings):
    import json

    from core.accounts.services import token_create, user_create
    from kiln_project import health

    monkeypatch.setattr(health, "check_broker", lambda: {"ok": True, "url": "unix:///secret/redis.sock"})
    public = client.get("/health").json()
    text = json.dumps(public)
    assert public["status"] == "degraded" and public["broker"] == {"ok": True}
    assert set(public["workers"]) == {"ok", "queues_served"} and "training_backend" in public
    assert "/secret/" not in text and str(settings.KILN.home) not in text and "pid" not in text
    user_create(username="ops", password="long-enough-pw")
    full = client.get("/health", HTTP_AUTHORIZATION=f"Bearer {token_create(username='ops')[1]}").json()
    assert full["broker"]["url"] == "unix:///secret/redis.sock" and "workers" in full["workers"]
    assert "reason" in full["training_backend"]


def test_a_worker_that_runs_but_stopped_reporting_is_named_not_called_missing(admin_client, monkeypatch):
    """QA: with KILN_HOME's disk full the GPU worker could not write its heartbeat, and /health and
    chat completions said no worker was running and to start one."""
    import os
    import socket

    from django.utils import timezone

    from adapters.serving.selectors import require_inference_ready
    from core.jobs.models import WorkerHeartbeat
    from kiln_project import health

    monkeypatch.setattr(health, "check_broker", lambda: {"ok": True, "url": "x"})
    never = admin_client.get("/health").json()["training_backend"]["reason"]
    assert "no GPU worker is running" in never
    quiet_since = timezone.now() - timezone.timedelta(seconds=95)
    WorkerHeartbeat.objects.create(worker_id="gpu-1", hostname=socket.gethostname(), pid=os.getpid(),
                                   queues=["gpu", "infer"], started_at=quiet_since, last_seen=quiet_since)
    reason = admin_client.get("/health").json()["training_backend"]["reason"]
    assert f"its worker (pid {os.getpid()}) still runs but has not reported for 9" in reason
    assert "is the disk full?" in reason and "kiln serve starts one" not in reason
    with pytest.raises(KilnError) as raised:
        require_inference_ready()
    assert raised.value.code == "inference_unavailable" and "has not reported" in raised.value.message
    assert "free disk space" in raised.value.hint
    # a worker whose process is gone is simply not running
    WorkerHeartbeat.objects.filter(worker_id="gpu-1").update(pid=2**22 + 17)
    assert "no GPU worker is running" in admin_client.get("/health").json()["training_backend"]["reason"]
