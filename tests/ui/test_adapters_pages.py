"""Adapters pages through the test client: the registry with each adapter's state, status (writing,
available, active, failed, quarantined), content digest, lineage parent and producing job; an adapter's
page with its history of transitions (who, when, why), lineage up the base_adapter chain, files,
receipts, evaluations and promotions; and the read-only admin of transitions, promotions and receipts."""

from __future__ import annotations

import re
from dataclasses import replace
from html import unescape

import pytest
from django.test import Client

from adapters.content import file_sha256
from adapters.models import Adapter
from adapters.promotions import promotion_request
from adapters.services import adapter_publish, adapter_reserve
from core.jobs.models import Job
from core.jobs.services import job_submit
from tests.promotions.support import users

pytestmark = pytest.mark.django_db


@pytest.fixture
def home(settings, tmp_path):
    """A private KILN_HOME for published adapter folders."""
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"


def _client(user) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def _row(html: str, element_id: str, end: str = "</tr>") -> str:
    start = html.index(f'id="{element_id}"')
    return html[start:html.index(end, start)]


def _job(user, state: str = "completed") -> Job:
    job = job_submit(kind="test.steps", payload={"steps": 1}, title="grpo", user=user)
    Job.objects.filter(id=job.id).update(kind="training.grpo", state=state)
    return Job.objects.get(id=job.id)


def _publish(home, name: str, *, user=None, base: str = "", loaded: bool = False, job=None) -> Adapter:
    folder = home / "adapters" / name
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights of " + name.encode())
    (folder / "adapter_config.json").write_text('{"r": 4}')
    adapter_reserve(name=name, job=job, base_adapter=base, actor=user)
    return adapter_publish(name=name, path=folder, content_sha256="sha256:" + name.encode().hex().ljust(64, "0"),
                           base_model_sha256="sha256:" + "b0" * 32, loaded=loaded, actor=user,
                           reason="published by the test")


@pytest.fixture
def registry(home):
    """r1 serving; r2 available, trained from r1 by a job; r3 from r2; a writing and a failed reservation."""
    requester, reviewer, _ = users()
    _publish(home, "r1", user=requester, loaded=True)
    job = _job(requester)
    _publish(home, "r2", user=requester, base="r1", job=job)
    _publish(home, "r3", user=requester, base="r2")
    adapter_reserve(name="r4", job=_job(requester, state="running"), base_adapter="r3")
    adapter_reserve(name="r5", job=_job(requester, state="failed"))
    return requester, reviewer, job


def test_registry_lists_state_status_content_lineage_and_job(registry):
    requester, _, job = registry
    html = _client(requester).get("/ui/adapters/").content.decode()
    assert 'Serving now: <a class="mono" href="/ui/adapters/r1/" id="adapters-serving">r1</a>' in html
    r1 = _row(html, "adapter-row-r1")
    assert 'badge adapter-published">published<' in r1 and 'data-status="active">active<' in r1
    assert 'class="badge serving"' in r1 and 'class="ok">loaded<' in r1
    assert "sha256:" + b"r1".hex() in r1 and ">base model<" in r1
    r2 = _row(html, "adapter-row-r2")
    assert 'data-status="available">available<' in r2 and "serving" not in r2
    assert 'href="/ui/adapters/r1/">r1</a>' in r2 and f'href="/ui/jobs/{job.uuid}/"' in r2
    assert 'href="/ui/adapters/r2/">r2</a>' in _row(html, "adapter-row-r3")
    r4 = _row(html, "adapter-row-r4")
    assert 'badge adapter-writing">writing<' in r4 and 'data-status="writing"' in r4
    assert 'data-status="failed">failed<' in _row(html, "adapter-row-r5")
    assert html.index("adapter-row-r5") < html.index("adapter-row-r1")  # newest first


def test_a_quarantined_adapter_is_marked_in_the_list_and_on_its_page(registry):
    requester, _, _ = registry
    Adapter.objects.filter(name="r3").update(quarantined=True, canary={
        "schema": "kiln.serving-canary.v1", "passed": False, "reasons": ["'Say hi': a log-probability is not finite"]})
    client = _client(requester)
    row = _row(client.get("/ui/adapters/").content.decode(), "adapter-row-r3")
    assert "adapter-quarantined" in row and ">quarantined<" in row
    html = client.get("/ui/adapters/r3/").content.decode()
    assert 'id="adapter-quarantined" role="alert"' in html and "allow_quarantined" in html
    canary = _row(html, "adapter-canary", "</dd>")
    assert 'class="bad">failed<' in canary and "is not finite" in unescape(canary)


def test_adapter_row_reads_quarantine_and_revision_when_the_model_has_them(registry):
    from adapters.views import adapter_row

    adapter = Adapter.objects.get(name="r2")
    plain = adapter_row(adapter)
    assert plain["status"] == "available" and plain["revision"] is None and not plain["serving"]
    adapter.quarantined, adapter.revision = True, 3
    marked = adapter_row(adapter, active_name="r2")
    assert marked["quarantined"] and marked["revision"] == 3 and marked["serving"]


def test_adapter_page_shows_history_lineage_files_receipts_and_promotions(home, registry):
    requester, reviewer, job = registry
    promotion = promotion_request(candidate="r3", user=requester, reason="try round three")
    html = _client(reviewer).get("/ui/adapters/r3/").content.decode()
    assert 'data-status="available">available<' in html
    assert "sha256:" + b"r3".hex() in _row(html, "adapter-content", "</dd>")

    lineage = _row(html, "adapter-lineage", "</section>")
    assert lineage.index('href="/ui/adapters/r2/"') < lineage.index('href="/ui/adapters/r1/"')
    assert f'href="/ui/jobs/{job.uuid}/"' in lineage and "the base model" in lineage
    assert 'badge adapter-active">active<' in lineage  # r1's status in the chain

    history = _row(html, "adapter-history", "</section>")
    rows = re.findall(r'<tr class="transition to-(\w+)"', history)
    assert rows == ["writing", "available"]  # oldest first
    assert history.count('transition-actor">requester<') == 2
    assert "reserved" in history and "published by the test" in history

    files = _row(html, "adapter-files", "</section>")
    weights = home / "adapters" / "r3" / "adapter_model.safetensors"
    assert "adapter_model.safetensors" in files and file_sha256(weights)[:23] in files
    assert str(weights.stat().st_size) in files and 'href="/v1/adapters/r3/download"' in files

    receipts = _row(html, "adapter-receipts", "</section>")
    assert "kind-promotion" in receipts and "kiln.promotion.v1" in receipts
    promotions = _row(html, "adapter-promotions", "</section>")
    assert f'href="/ui/promotions/{promotion.id}/"' in promotions and ">pending<" in promotions
    assert "No eval job has sampled this adapter yet." in html
    assert "No post-eval gate ran" in html


def test_lineage_names_a_parent_that_left_the_registry(home, registry):
    requester, _, _ = registry
    _publish(home, "orphan", user=requester, base="gone")
    lineage = _row(_client(requester).get("/ui/adapters/orphan/").content.decode(), "adapter-lineage", "</section>")
    assert "gone" in lineage and "no longer in the registry" in lineage and "the base model" not in lineage


def test_the_admin_shows_transitions_promotions_and_receipts_read_only(admin_client, registry):
    requester, _, _ = registry
    promotion = promotion_request(candidate="r2", user=requester, reason="round two")
    for model, text in (("adapters/adaptertransition", "published by the test"),
                        ("adapters/promotion", "r2"),
                        ("core/receipt", "promotion request")):
        listing = admin_client.get(f"/admin/{model}/")
        assert listing.status_code == 200 and text in listing.content.decode(), model
        assert admin_client.get(f"/admin/{model}/add/").status_code == 403, model
    from adapters.models import AdapterTransition
    from core.models import Receipt

    for model, pk in (("adapters/adaptertransition", AdapterTransition.objects.first().pk),
                      ("adapters/promotion", promotion.pk), ("core/receipt", Receipt.objects.first().pk)):
        change = admin_client.get(f"/admin/{model}/{pk}/change/")
        assert change.status_code == 200 and 'name="_save"' not in change.content.decode(), model
        assert admin_client.post(f"/admin/{model}/{pk}/delete/", {"post": "yes"}).status_code == 403, model


def test_the_gate_box_says_the_gate_did_not_activate_an_adapter_that_serves_now(home, registry):
    """An inconclusive gate, then r2 made active by hand: the box used to say "it is not served"."""
    from evaluations.gate import GateArm, paired_wilson_v1

    requester, _, job = registry
    ids = [f"e{i}" for i in range(5)]
    arms = [GateArm(adapter=name, suite_name="held-out", suite_hash="sha256:" + "a" * 64,
                    effective_generation_hash="sha256:" + "9" * 64, outcomes=dict.fromkeys(ids, outcome))
            for name, outcome in (("r1", "fail"), ("r2", "pass"))]
    evidence = paired_wilson_v1(baseline=arms[0], candidate=arms[1], eval_job_id=None, min_accuracy=0.5).evidence
    assert evidence["outcome"] == "inconclusive"
    post_eval = job_submit(kind="test.steps", payload={"steps": 1}, title="post-eval", user=requester)
    Job.objects.filter(id=post_eval.id).update(kind="training.post_eval", state="completed", result={
        "gate_outcome": "inconclusive", "post_eval_gate_evidence": [evidence]})
    Job.objects.filter(id=job.id).update(result={"post_eval_job_id": str(post_eval.uuid)})
    client = _client(requester)

    def box(element_id: str) -> str:  # an element's text, tags dropped
        inner = _row(html, element_id, "</p>").split(">", 1)[1]
        return " ".join(unescape(re.sub(r"<[^>]+>", "", inner)).split())

    html = client.get("/ui/adapters/r2/").content.decode()
    assert box("gate-decision").endswith("above the floor: the gate did not activate it.")
    assert box("gate-serving") == "Serving now: r1; the candidate r2 is not served."
    Adapter.objects.filter(name="r1").update(loaded=False)
    Adapter.objects.filter(name="r2").update(loaded=True)
    html = client.get("/ui/adapters/r2/").content.decode()
    assert box("gate-serving") == "Serving now: r2, this candidate." and "not served" not in html
