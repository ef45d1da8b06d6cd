"""/v1/promotions over HTTP: request, list (with ?state=), one, approve and reject with their stable
codes; and `kiln promotions` against the same routes."""

from __future__ import annotations

import json

import pytest

from adapters.models import Adapter
from tests.promotions.support import client_for, error, published, send, users
from tests.support.canary import drain_activations

pytestmark = pytest.mark.django_db


@pytest.fixture
def team(home):
    users()
    published(home, "inc", loaded=True)
    published(home, "cand")
    return {name: client_for(name) for name in ("requester", "reviewer", "other")}


def test_request_list_show_approve(team):
    created = send(team["requester"], "/v1/promotions", {"candidate": "cand", "reason": "round two"})
    assert created.status_code == 200, created.content
    promotion = created.json()
    assert promotion["state"] == "pending" and promotion["incumbent"] == "inc"
    assert promotion["requested_by"] == "requester" and promotion["evidence"]["candidate"] == "cand"
    assert [r["kind"] for r in promotion["receipts"]] == ["promotion"]
    listed = team["reviewer"].get("/v1/promotions?state=pending").json()
    assert [p["id"] for p in listed] == [promotion["id"]]
    assert team["reviewer"].get("/v1/promotions?state=applied").json() == []
    error(team["reviewer"].get("/v1/promotions?state=bogus"), 400, "invalid_state")
    one = team["reviewer"].get(f"/v1/promotions/{promotion['id']}")
    assert one.status_code == 200 and one.json()["evidence_sha256"] == promotion["evidence_sha256"]

    approved = send(team["reviewer"], f"/v1/promotions/{promotion['id']}/approve", {"reason": "better"})
    assert approved.status_code == 200, approved.content
    body = approved.json()
    assert body["state"] == "approved" and body["decided_by"] == "reviewer" and body["activation_job_id"]
    assert [r["decision"] for r in body["receipts"]] == [None, "approved"]
    drain_activations()  # the activation job: the serving canary, then the candidate is active
    assert team["reviewer"].get(f"/v1/promotions/{promotion['id']}").json()["state"] == "applied"
    assert Adapter.objects.get(name="cand").loaded
    error(send(team["other"], f"/v1/promotions/{promotion['id']}/approve", {"reason": "again"}), 409,
          "promotion_not_pending")


def test_the_stable_codes(team, home):
    pid = send(team["requester"], "/v1/promotions", {"candidate": "cand"}).json()["id"]
    # the same promotion asked for again (by anyone) waits already: no second request for the approvers
    twice = error(send(team["reviewer"], "/v1/promotions", {"candidate": "cand"}), 409, "promotion_already_pending")
    assert f"promotion {pid} (inc -> cand)" in twice
    error(send(team["requester"], f"/v1/promotions/{pid}/approve", {"reason": "mine"}), 403,
          "approval_permission_required")
    error(send(team["reviewer"], f"/v1/promotions/{pid}/reject", {}), 400, "reason_required")
    error(team["reviewer"].get("/v1/promotions/9999"), 404, "promotion_not_found")
    error(send(team["reviewer"], "/v1/promotions/9999/approve", {"reason": "x"}), 404, "promotion_not_found")
    error(send(team["requester"], "/v1/promotions", {"candidate": "missing"}), 404, "adapter_not_found")
    published(home, "cand2")
    own = send(team["reviewer"], "/v1/promotions", {"candidate": "cand2"}).json()["id"]
    error(send(team["reviewer"], f"/v1/promotions/{own}/approve", {"reason": "mine"}), 403, "promotion_self_approval")
    assert send(team["other"], "/v1/adapters/load", {"name": "cand", "reason": "by hand"}).status_code == 200
    # QA: the request for cand stayed pending after the direct load (approve: promotion_stale; and it kept
    # cand from being deleted); it is fulfilled, so it is superseded, saying by whom
    superseded = team["reviewer"].get(f"/v1/promotions/{pid}").json()
    assert superseded["state"] == "superseded" and "cand was made active otherwise by other: by hand" in \
        superseded["reason"]
    error(send(team["reviewer"], f"/v1/promotions/{pid}/approve", {"reason": "ok"}), 409, "promotion_not_pending")
    # a request with another candidate, made while inc was active, can no longer be approved
    # (promotion_stale): QA found it left pending for ever, blocking cand2's deletion; it is superseded
    stale = team["reviewer"].get(f"/v1/promotions/{own}").json()
    assert stale["state"] == "superseded" and "cand was made active by other" in stale["reason"]
    error(send(team["other"], f"/v1/promotions/{own}/approve", {"reason": "ok"}), 409, "promotion_not_pending")
    assert team["reviewer"].get("/v1/promotions?state=pending").json() == []


def test_a_new_incumbent_supersedes_only_the_requests_made_against_another(team, home):
    """Loading or unloading by hand: what was requested against the adapter that serves now stays pending."""
    published(home, "cand2")
    against_inc = send(team["requester"], "/v1/promotions", {"candidate": "cand"}).json()["id"]
    assert send(team["other"], "/v1/adapters/load", {"name": "cand2", "reason": "by hand"}).status_code == 200
    against_cand2 = send(team["requester"], "/v1/promotions", {"candidate": "cand"}).json()
    assert against_cand2["incumbent"] == "cand2" and against_cand2["state"] == "pending"
    assert team["reviewer"].get(f"/v1/promotions/{against_inc}").json()["state"] == "superseded"
    # requested against cand2: making inc active supersedes it
    assert send(team["other"], "/v1/adapters/load", {"name": "inc", "reason": "back"}).status_code == 200
    assert team["reviewer"].get(f"/v1/promotions/{against_cand2['id']}").json()["state"] == "superseded"
    against_inc_again = send(team["requester"], "/v1/promotions", {"candidate": "cand"}).json()["id"]
    assert send(team["other"], "/v1/adapters/unload", {"name": "inc", "reason": "to the base"}).status_code == 200
    unloaded = team["reviewer"].get(f"/v1/promotions/{against_inc_again}").json()
    assert unloaded["state"] == "superseded" and "the base model was made active by other" in unloaded["reason"]
    against_base = send(team["requester"], "/v1/promotions", {"candidate": "cand"}).json()
    assert against_base["incumbent"] is None and against_base["state"] == "pending"
    approved = send(team["reviewer"], f"/v1/promotions/{against_base['id']}/approve", {"reason": "better than base"})
    assert approved.status_code == 200, approved.content
    drain_activations()
    assert team["reviewer"].get(f"/v1/promotions/{against_base['id']}").json()["state"] == "applied"


def test_the_cli_calls_the_routes(monkeypatch, capsys):
    from kiln_project.cli import main as cli_main
    from kiln_project.cli import promotions_cmd

    calls = []

    class FakeClient:
        def __init__(self, url=None):
            pass

        def get(self, path, params=None):
            calls.append(("GET", path, params))
            if path == "/v1/promotions":
                return [{"id": 1, "state": "pending", "candidate": "c", "incumbent": None, "flagged": True,
                         "requested_by": "a", "decided_by": None, "requested_at": "2026-01-01T00:00:00"},
                        {"id": 2, "state": "pending", "candidate": "d", "incumbent": None, "requested_by": None,
                         "job_id": "12d65255-0000-4000-8000-000000000000", "requested_at": "2026-01-01T00:00:01"},
                        {"id": 3, "state": "pending", "candidate": "e", "incumbent": None, "requested_by": None,
                         "job_id": None, "requested_at": "2026-01-01T00:00:02"}]
            return {"id": 1, "state": "pending", "candidate": "c", "alarms": ["reward rose"],
                    "evidence": {"gate": None, "gate_status": {"outcome": "error", "verdict": "its job was killed"}},
                    "requested_by": None, "job_id": None,
                    "receipts": [{"kind": "promotion", "sha256": "sha256:1", "created_at": "x"}]}

        def post(self, path, json=None):
            calls.append(("POST", path, json))
            return {"id": 1, "state": "applied" if path.endswith("approve") else "rejected", "candidate": "c"}

    monkeypatch.setattr(promotions_cmd, "KilnClient", FakeClient)
    assert cli_main.main(["promotions", "list", "--state", "pending"]) == 0
    listed = capsys.readouterr().out
    # who asked: a user, Kiln for a job (a gate, auto_load), or an anonymous caller (QA: a blank column)
    assert "pending" in listed and "kiln (job 12d65255)" in listed and "(anonymous)" in listed
    assert cli_main.main(["promotions", "show", "1"]) == 0
    shown = capsys.readouterr().out
    assert "ALARM: reward rose" in shown and "requested_by     (anonymous)" in shown
    assert "gate: error, no decision (its job was killed)" in shown  # a gate asked for that never decided
    assert cli_main.main(["promotions", "approve", "1", "--reason", "ok", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["state"] == "applied"
    assert cli_main.main(["promotions", "reject", "1", "--reason", "no"]) == 0
    assert calls == [("GET", "/v1/promotions", {"state": "pending"}), ("GET", "/v1/promotions/1", None),
                     ("POST", "/v1/promotions/1/approve", {"reason": "ok"}),
                     ("POST", "/v1/promotions/1/reject", {"reason": "no"})]
    with pytest.raises(SystemExit):  # --reason is required
        cli_main.main(["promotions", "reject", "1"])


def test_the_promotion_settings_load_from_toml_and_environment(tmp_path, monkeypatch):
    from kiln_project.config import ConfigError, load_config

    monkeypatch.chdir(tmp_path)
    assert load_config({"KILN_HOME": str(tmp_path)}).promotion_require_approval is None
    (tmp_path / "kiln.toml").write_text("[promotion]\nrequire_approval = false\nallow_self_approval = true\n")
    config = load_config({"KILN_HOME": str(tmp_path)})
    assert config.promotion_require_approval is False and config.promotion_allow_self_approval is True
    config = load_config({"KILN_HOME": str(tmp_path), "KILN_PROMOTION_REQUIRE_APPROVAL": "true"})
    assert config.promotion_require_approval is True
    (tmp_path / "kiln.toml").write_text('[promotion]\nrequire_approval = "yes"\n')
    with pytest.raises(ConfigError):
        load_config({"KILN_HOME": str(tmp_path)})


def test_an_unknown_key_is_refused_not_dropped(team):
    """QA: {"candidate": ..., "reasn": ...} created a promotion without its reason."""
    refused = send(team["requester"], "/v1/promotions", {"candidate": "cand", "reasn": "round two"})
    assert refused.status_code == 422 and "reasn" in json.dumps(refused.json()["error"])
    assert team["reviewer"].get("/v1/promotions").json() == []  # nothing recorded
    pid = send(team["requester"], "/v1/promotions", {"candidate": "cand", "reason": "round two"}).json()["id"]
    typo = send(team["reviewer"], f"/v1/promotions/{pid}/approve", {"reason": "ok", "overide": True})
    assert typo.status_code == 422 and team["reviewer"].get(f"/v1/promotions/{pid}").json()["state"] == "pending"
