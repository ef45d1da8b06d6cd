"""Promotions pages through the test client: the queue (pending first, filter, polled rows), one
promotion with its evidence on screen (gate counts and bounds, reward trend and curve, samples, alarm),
the receipts, approve / reject with a required reason, refusals shown on the page with their stable
code (permission, self-approval, stale, not pending), and the live fragment that shows another
reviewer's decision.

Approval may be asynchronous (`approved` while the activation job runs its canary, then `applied` or
`failed`), so a posted approval is asserted to leave `pending` for approved or applied, and the later
states are rendered from rows set directly."""

from __future__ import annotations

from dataclasses import replace
from html import unescape

import pytest
from django.test import Client

from adapters.models import Adapter, Promotion, PromotionState
from adapters.promotions import promotion_reject, promotion_request
from core.jobs.models import Job
from core.jobs.services import job_submit
from evaluations.gate import GateArm, paired_wilson_v1
from tests.promotions.support import published, users
from tests.ui.page_text import block_of, html_of, text_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def home(settings, tmp_path):
    """A private KILN_HOME for published adapter folders."""
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"

REWARDS = [{"step": s, "reward_mean": round(0.2 + 0.08 * s, 4)} for s in range(1, 9)]  # rising


def _client(user) -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


_html, _text, _block = html_of, text_of, block_of


def _gate(candidate_outcomes: list[str], baseline_outcomes: list[str], name: str) -> dict:
    ids = [f"e{i:02d}" for i in range(len(candidate_outcomes))]

    def arm(adapter, outcomes):
        return GateArm(adapter=adapter, suite_name="held-out", suite_hash="sha256:" + "a" * 64,
                       effective_generation_hash="sha256:" + "9" * 64, outcomes=dict(zip(ids, outcomes, strict=True)))

    return paired_wilson_v1(baseline=arm("r1", baseline_outcomes), candidate=arm(name, candidate_outcomes),
                            eval_job_id="0d6f3a52-9c1e-4b7a-8f00-5b2e1c7d9a10", min_accuracy=0.3).evidence


def _training_job(user, rewards):
    job = job_submit(kind="test.steps", payload={"steps": 1}, title="grpo", user=user)
    Job.objects.filter(id=job.id).update(kind="training.grpo", state="completed", metrics={"reward_history": rewards})
    return Job.objects.get(id=job.id)


@pytest.fixture
def team(home):
    """requester (may submit, not approve), reviewer and other (may approve); r1 serving."""
    requester, reviewer, other = users()
    published(home, "r1", loaded=True)
    return requester, reviewer, other


def _flagged(home, requester) -> Promotion:
    """r2: training reward rose while the held-out accuracy fell below r1's: an alarm."""
    published(home, "r2", job=_training_job(requester, REWARDS))
    gate = _gate(["pass"] * 10 + ["fail"] * 10, ["pass"] * 16 + ["fail"] * 4, "r2")
    promotion = promotion_request(candidate="r2", user=requester, reason="round two", evidence=gate)
    assert promotion.alarms, promotion.evidence
    return promotion


# ---- the queue ---------------------------------------------------------------------------------

def test_queue_lists_pending_first_filters_and_polls_its_rows(home, team):
    requester, reviewer, _ = team
    published(home, "r2")
    published(home, "r3")
    older = promotion_request(candidate="r2", user=requester, reason="older")
    newer = promotion_request(candidate="r3", user=requester, reason="newer")
    promotion_reject(promotion_id=newer.id, user=reviewer, reason="not this one")
    html = _html(_client(reviewer).get("/ui/promotions/"))
    assert 'id="promotions-empty"' not in html and "Nothing to decide" not in html
    # Pending first although the rejected one is newer.
    assert html.index(f'id="promotion-row-{older.id}"') < html.index(f'id="promotion-row-{newer.id}"')
    row = html[html.index(f'id="promotion-row-{newer.id}"'):]
    row = row[:row.index("</tr>")]
    assert 'badge promotion-rejected' in row and ">rejected<" in row and "reviewer" in row and ">r3<" in row
    assert f'href="/ui/promotions/{newer.id}/"' in row
    assert 'hx-get="/ui/promotions/?fragment=rows"' in html and 'hx-trigger="every 3s"' in html
    assert "Your account may approve or reject promotions." in html

    pending = _html(_client(reviewer).get("/ui/promotions/?state=pending"))
    assert f"promotion-row-{older.id}" in pending and f"promotion-row-{newer.id}" not in pending
    assert '?state=pending" aria-current="page">pending<' in pending
    assert "fragment=rows&amp;state=pending" in pending
    fragment = _html(_client(reviewer).get("/ui/promotions/?fragment=rows&state=rejected"))
    assert fragment.lstrip().startswith('<tbody id="promotions-body"') and "<html" not in fragment
    assert f"promotion-row-{newer.id}" in fragment and f"promotion-row-{older.id}" not in fragment
    assert "No applied promotions." in _html(_client(reviewer).get("/ui/promotions/?state=applied"))
    bad = _html(_client(reviewer).get("/ui/promotions/?state=bogus"))
    assert "there is no promotion state" in bad and f"promotion-row-{older.id}" in bad


def test_who_requested_is_a_user_kiln_for_a_job_or_an_anonymous_caller_never_a_made_up_gate(home, team):
    """QA: a hand activation by an anonymous loopback caller read "Requested ... by the post-eval gate"."""
    requester, reviewer, _ = team
    for name in ("r2", "r3", "r4"):
        published(home, name)
    by_hand = promotion_request(candidate="r2", user=None, reason="rollback by hand")
    by_job = promotion_request(candidate="r3", user=None, reason="post_eval gate passed",
                               job=_training_job(requester, REWARDS))
    by_user = promotion_request(candidate="r4", user=requester, reason="round four")
    client = _client(reviewer)
    said = {p.id: _text(_html(client.get(f"/ui/promotions/{p.id}/")), "promotion-requested-by")
            for p in (by_hand, by_job, by_user)}
    assert said[by_hand.id] == "an anonymous caller"
    assert said[by_job.id] == f"Kiln, for job {str(by_job.job.uuid)[:8]}"
    assert said[by_user.id] == requester.username
    rows = _html(client.get("/ui/promotions/"))
    assert "the gate" not in rows and "the post-eval gate" not in rows
    for promotion, who in ((by_hand, "an anonymous caller"), (by_job, "Kiln, for a job"), (by_user, requester.username)):
        row = rows[rows.index(f'id="promotion-row-{promotion.id}"'):]
        assert row[:row.index("</tr>")].count(f'<div class="sub promotion-requested-by">{who}</div>') == 1, who


def test_empty_queue_and_the_approver_hint(team):
    requester, _, _ = team
    html = _html(_client(requester).get("/ui/promotions/"))
    assert "Nothing to decide" in html and 'id="promotions-empty"' in html
    assert "Approving needs the approve_promotion permission" in html


def test_queue_flags_a_promotion_with_an_alarm(home, team):
    requester, reviewer, _ = team
    promotion = _flagged(home, requester)
    html = _html(_client(reviewer).get("/ui/promotions/"))
    row = html[html.index(f'id="promotion-row-{promotion.id}"'):]
    row = row[:row.index("</tr>")]
    assert "badge flagged" in row and "alarm: 1" in row and "training reward rose" in unescape(row)
    assert "regression" in row  # the gate's outcome, with both accuracies
    assert "0.5 vs 0.8" in row


# ---- one promotion: the evidence -----------------------------------------------------------------

def test_promotion_page_shows_gate_counts_bounds_reward_and_alarm(home, team):
    requester, reviewer, _ = team
    promotion = _flagged(home, requester)
    gate = promotion.evidence["gate"]
    html = _html(_client(reviewer).get(f"/ui/promotions/{promotion.id}/"))
    assert f"Promotion #{promotion.id}" in html and ">r2<" in html and ">r1<" in html
    # The alarm, prominently.
    alarm = html[html.index('id="promotion-alarms"'):]
    alarm = unescape(alarm[:alarm.index("</section>")])
    assert 'role="alert"' in alarm and promotion.alarms[0] in alarm
    # Gate counts and Wilson bounds from the shared partial.
    assert _text(html, "gate-outcome") == "regression"
    assert (_text(html, "gate-improved"), _text(html, "gate-regressed"), _text(html, "gate-tied")) == ("0", "6", "14")
    assert _text(html, "gate-paired").startswith("20")
    assert _text(html, "gate-candidate-accuracy") == "0.5" and _text(html, "gate-baseline-accuracy") == "0.8"
    low, high = gate["candidate_accuracy_lower_bound"], gate["candidate_accuracy_upper_bound"]
    assert _text(html, "gate-candidate-bounds") == f"{low:.4g} – {high:.4g}"
    # The reward trend and curve (the producing job's history).
    trend = promotion.evidence["reward_trend"]
    assert trend["rose"] and _text(html, "reward-trend") == f"first {trend['first']:.4g} → last {trend['last']:.4g} rose"
    assert 'id="reward-curve"' in html and "<polyline" in html and "training job metrics" in html
    assert "Samples: candidate vs" not in html  # no samples in this evidence
    assert "Not recorded" in _block(html, "kl-to-reference") and "Not measured" in _block(html, "completion-lengths")
    assert promotion.evidence_sha256 in html
    # The request receipt, and the decide forms (CSRF) for a reviewer.
    receipts = html[html.index('id="promotion-receipts"'):]
    assert "promotion request" in receipts and "requester" in receipts and "round two" in receipts
    assert f'action="/ui/promotions/{promotion.id}/approve/"' in html and "csrfmiddlewaretoken" in html
    assert 'id="approve-button" disabled' not in html and 'id="reject-button" disabled' not in html
    assert "Approving it is an override" in html
    assert f'hx-get="/ui/promotions/{promotion.id}/?fragment=live" hx-trigger="every 2s"' in html
    assert _text(html, "promotion-state") == "pending"


def test_samples_and_further_evidence_render_when_present(home, team):
    requester, reviewer, _ = team
    published(home, "r2")
    promotion = promotion_request(candidate="r2", user=requester, reason="with samples")
    evidence = {**promotion.evidence, "future_figure": {"entropy_drop": 0.0421},
                "kl_to_reference": {"value": 0.61, "statistic": "last_quarter_mean", "steps": 8, "window": 2,
                                    "source": "train_receipt.loss_history.kl_mean", "final": 0.7, "max": 0.7},
                "alarm_bounds": {"max_kl_to_reference": 0.5, "min_length_ratio": 0.5, "max_length_ratio": 2.0,
                                 "min_length_samples": 8},
                "lengths": {"unit": "completion_tokens", "candidate_adapter": "r2", "incumbent_adapter": "r1",
                            "candidate": {"count": 10, "mean": 12.5, "median": 12.0, "truncated": 0},
                            "incumbent": {"count": 10, "mean": 40.0, "median": 38.0, "truncated": 1}, "ratio": 0.3125},
                "policy_audit": {"schema": "kiln.grpo-policy-audit.v1", "kl": {"mean_estimator": 0.0179, "steps": 8}},
                "reward_histogram": {"count": 6, "min": 0.0, "max": 1.0, "bins": 2, "edges": [0.0, 0.5, 1.0],
                                     "counts": [2, 4], "of": "completion_reward", "source": "training_snapshot"},
                "samples": [{"example_id": "q1", "prompt": "What is 2 + 2?", "candidate": "4", "incumbent": "5",
                             "candidate_outcome": "pass", "incumbent_outcome": "fail"},
                            {"prompt": [{"role": "user", "content": "Name a prime"}], "candidate": "7",
                             "incumbent": "<b>9</b>"}]}
    Promotion.objects.filter(id=promotion.id).update(evidence=evidence)
    html = _html(_client(reviewer).get(f"/ui/promotions/{promotion.id}/"))
    samples = html[html.index('id="promotion-samples"'):]
    samples = samples[:samples.index("</section>")]
    first = samples[samples.index('id="sample-1"'):samples.index('id="sample-2"')]
    assert "What is 2 + 2?" in first and ">q1<" in first
    assert 'sample-candidate"><span class="badge outcome-pass">pass</span><pre>4</pre>' in first
    assert 'sample-incumbent"><span class="badge outcome-fail">fail</span><pre>5</pre>' in first
    second = samples[samples.index('id="sample-2"'):]
    assert '<td class="sample-candidate"><pre>7</pre>' in second
    assert "&lt;b&gt;9&lt;/b&gt;" in samples and "<b>9</b>" not in samples  # escaped
    assert "Name a prime" in samples
    kl = _block(html, "kl-to-reference")
    assert kl.startswith("0.61 nats per action token") and "(above the bound 0.5)" in kl
    lengths = html[html.index('id="completion-lengths"'):html.index("</table>", html.index('id="completion-lengths"'))]
    assert ">12.5<" in lengths and ">40<" in lengths
    assert _block(html, "length-ratio").startswith("Ratio 0.3125 ; the alarm's bounds are 0.5 – 2")
    assert "kiln.grpo-policy-audit.v1" in html and "mean_estimator" in html
    bins = html[html.index('id="reward-histogram-bins"'):html.index("</table>", html.index('id="reward-histogram-bins"'))]
    assert "0 – 0.5" in bins and ">4<" in bins and "width: 100.0%" in bins
    more = html[html.index('id="promotion-more-evidence"'):]
    assert "future_figure" in more and "0.0421" in more
    assert 'id="gate-evidence-missing"' in html  # requested by hand: no gate
    assert "No reward history recorded" in html and "fewer than two reward points" in html


# ---- deciding ----------------------------------------------------------------------------------

def test_a_user_without_the_permission_sees_disabled_buttons_and_is_refused(home, team):
    requester, _, _ = team
    published(home, "r2")
    promotion = promotion_request(candidate="r2", user=requester, reason="round two")
    client = _client(requester)
    html = _html(client.get(f"/ui/promotions/{promotion.id}/"))
    assert 'id="approve-button" disabled' in html and 'id="reject-button" disabled' in html
    assert "You lack the approve_promotion permission" in _text(html, "approve-blocked")
    refused = client.post(f"/ui/promotions/{promotion.id}/approve/", {"reason": "I want it"})
    assert refused.status_code == 403
    page = _html(refused)
    assert _text(page, "decision-error-code") == "approval_permission_required"
    assert "needs the approve_promotion permission" in _text(page, "decision-error-message")
    assert "I want it" in page  # the typed reason is kept
    assert Promotion.objects.get(id=promotion.id).state == "pending"
    assert client.post(f"/ui/promotions/{promotion.id}/reject/", {"reason": "no"}).status_code == 403


def test_a_reason_is_required(home, team):
    requester, reviewer, _ = team
    published(home, "r2")
    promotion = promotion_request(candidate="r2", user=requester, reason="round two")
    client = _client(reviewer)
    for action in ("approve", "reject"):
        response = client.post(f"/ui/promotions/{promotion.id}/{action}/", {"reason": "   "})
        assert response.status_code == 400
        html = _html(response)
        assert _text(html, "decision-error-code") == "reason_required" and f"Could not {action}" in html
        # QA: the page's hint told a browser user to pass the CLI's --reason; the box had no limit
        assert "say why in the reason" in html and html.count('maxlength="2000"') == 2
    assert Promotion.objects.get(id=promotion.id).state == "pending"
    back = client.get(f"/ui/promotions/{promotion.id}/approve/")  # a reloaded form action: its page
    assert (back.status_code, back["Location"]) == (302, f"/ui/promotions/{promotion.id}/")


def test_approve_leaves_pending_and_shows_the_decision(home, team):
    requester, reviewer, other = team
    published(home, "r2")
    promotion = promotion_request(candidate="r2", user=requester, reason="round two")
    client = _client(reviewer)
    response = client.post(f"/ui/promotions/{promotion.id}/approve/", {"reason": "held-out improved"})
    assert response.status_code == 302 and response["Location"] == f"/ui/promotions/{promotion.id}/"
    state = Promotion.objects.get(id=promotion.id).state
    assert state in ("approved", "applied")
    html = _html(client.get(response["Location"]))
    assert f"Promotion {promotion.id} approved" in html  # the flash message
    assert _text(html, "promotion-state") == ("approved — activating" if state == "approved" else "applied")
    assert _text(html, "promotion-decided-by") == "reviewer" and _text(html, "promotion-reason") == "held-out improved"
    receipts = html[html.index('id="promotion-receipts"'):html.index("</table>", html.index('id="promotion-receipts"'))]
    assert 'receipt-decision">approved' in receipts and 'receipt-actor">reviewer<' in receipts
    assert 'id="approve-form"' not in html and "it cannot be decided again" in html
    # A second reviewer's late approval: refused with its code, shown on the page.
    late = _client(other).post(f"/ui/promotions/{promotion.id}/approve/", {"reason": "me too"})
    assert late.status_code == 409 and "promotion_not_pending" in _html(late)


def test_reject_and_the_live_fragment_another_reviewer_sees(home, team):
    requester, reviewer, other = team
    published(home, "r2")
    promotion = promotion_request(candidate="r2", user=requester, reason="round two")
    watcher = _client(other)
    live = _html(watcher.get(f"/ui/promotions/{promotion.id}/?fragment=live"))
    assert live.lstrip().startswith('<section class="card promotion-live" id="promotion-live" data-state="pending"')
    assert 'hx-trigger="every 2s"' in live and "<html" not in live and 'id="promotion-decide"' not in live

    response = _client(reviewer).post(f"/ui/promotions/{promotion.id}/reject/", {"reason": "the alarm is real"})
    assert response.status_code == 302
    assert Promotion.objects.get(id=promotion.id).state == "rejected"
    live = _html(watcher.get(f"/ui/promotions/{promotion.id}/?fragment=live"))
    assert 'data-state="rejected"' in live and "hx-trigger" not in live.split("</section>")[0]  # polling stops
    assert _text(live, "promotion-decided-by") == "reviewer" and "the alarm is real" in live
    assert 'id="promotion-decide" data-state="rejected" hx-swap-oob="true"' in live  # the forms go away
    assert 'receipt-decision">rejected' in live


def test_self_approval_is_disabled_and_refused(home, team):
    _, reviewer, _ = team
    published(home, "r2")
    promotion = promotion_request(candidate="r2", user=reviewer, reason="my round")
    client = _client(reviewer)
    html = _html(client.get(f"/ui/promotions/{promotion.id}/"))
    assert 'id="approve-button" disabled' in html and 'id="reject-button" disabled' not in html
    assert "another reviewer must approve it" in _text(html, "approve-blocked")
    refused = client.post(f"/ui/promotions/{promotion.id}/approve/", {"reason": "looks good"})
    assert refused.status_code == 403 and _text(_html(refused), "decision-error-code") == "promotion_self_approval"
    assert Promotion.objects.get(id=promotion.id).state == "pending"


def test_a_stale_promotion_is_marked_and_its_approval_refused(home, team):
    requester, reviewer, _ = team
    published(home, "r2")
    promotion = promotion_request(candidate="r2", user=requester, reason="round two")
    published(home, "r3", loaded=True)  # the incumbent changed meanwhile
    client = _client(reviewer)
    html = _html(client.get(f"/ui/promotions/{promotion.id}/"))
    assert "Stale: this promotion was requested against" in html
    refused = client.post(f"/ui/promotions/{promotion.id}/approve/", {"reason": "fine"})
    assert refused.status_code == 409 and _text(_html(refused), "decision-error-code") == "promotion_stale"
    assert Promotion.objects.get(id=promotion.id).state == "pending"


def test_the_queue_marks_a_pending_promotion_whose_incumbent_no_longer_serves(home, team):
    """Only the detail page said so; the queue showed it like any other pending row."""
    requester, reviewer, _ = team
    published(home, "r2")
    promotion = promotion_request(candidate="r2", user=requester, reason="round two")
    def row():
        html = _html(_client(reviewer).get("/ui/promotions/?fragment=rows"))
        found = html[html.index(f'id="promotion-row-{promotion.id}"'):]
        return found[:found.index("</tr>")]
    assert "promotion-stale" not in row()
    published(home, "r3", loaded=True)  # the incumbent changed meanwhile
    assert "stale</span> r3 serves now" in row()


def test_a_negative_kl_estimate_is_not_called_within_the_bound(home, team):
    requester, reviewer, _ = team
    published(home, "r2")
    promotion = promotion_request(candidate="r2", user=requester, reason="signed")
    evidence = {**promotion.evidence, "alarm_bounds": {"max_kl_to_reference": 0.5},
                "kl_to_reference": {"value": -0.2, "statistic": "last_quarter_mean", "source": "x"}}
    Promotion.objects.filter(id=promotion.id).update(evidence=evidence)
    kl = _block(_html(_client(reviewer).get(f"/ui/promotions/{promotion.id}/")), "kl-to-reference")
    assert "(below zero: not measured by the bound 0.5)" in kl and "within" not in kl


def test_a_post_eval_without_a_floor_is_not_described_as_absent(home, team):
    """It said "requested for an adapter trained without post_eval" when a post-eval had run."""
    import uuid

    requester, reviewer, _ = team
    published(home, "r2")
    promotion = promotion_request(candidate="r2", user=requester, reason="diagnostic eval only")
    post_eval_job = _training_job(requester, REWARDS)  # any live job stands for the post-eval here
    for job_id, link in ((str(post_eval_job.uuid), True), (str(uuid.uuid4()), False)):
        Promotion.objects.filter(id=promotion.id).update(
            evidence={**promotion.evidence, "gate": None, "post_eval_job_id": job_id})
        html = _html(_client(reviewer).get(f"/ui/promotions/{promotion.id}/"))
        said = _text(html, "gate-not-configured")
        assert said.startswith("No gate decision: the adapter's training ran a post-eval") and "min_accuracy" in said
        assert (f'href="/ui/jobs/{job_id}/"' in html) is link and ("(deleted)" in said) is not link
        assert "trained without" not in html
        facts = html[html.index("<dt>Post-eval job</dt>"):]
        assert ("(deleted)" in facts[:facts.index("</dd>")]) is not link  # no link to a 404 in the facts either


@pytest.mark.parametrize(("post_state", "result", "outcome", "code"), [
    ("failed", {}, "error", "job_interrupted"),  # its worker killed before the gate decided
    ("running", {}, "pending", None),
    ("completed", {"gate_outcome": "error", "post_eval_verdict": "the held-out evaluation failed"}, "error", None),
])
def test_a_gate_that_did_not_decide_is_named_not_described_as_no_floor(home, team, post_state, result, outcome, code):
    """QA: a post-eval with min_accuracy whose job was killed read "ran a post-eval without min_accuracy"."""
    requester, reviewer, _ = team
    post = job_submit(kind="test.steps", payload={"steps": 1}, title="post-eval", user=requester)
    Job.objects.filter(id=post.id).update(
        kind="training.post_eval", state=post_state, result=result, error_code=code or "",
        payload={"post_eval": {"suite": "held-out", "min_accuracy": 0.25}})
    training = _training_job(requester, REWARDS)
    Job.objects.filter(id=training.id).update(result={"post_eval_job_id": str(post.uuid)})
    published(home, "r2", job=Job.objects.get(id=training.id))
    promotion = promotion_request(candidate="r2", user=requester, reason="the gate crashed; by hand")
    status = promotion.evidence["gate_status"]
    assert (status["outcome"], status["error_code"], status["min_accuracy"]) == (outcome, code, 0.25)
    assert promotion.evidence["gate"] is None and promotion.evidence["post_eval_job_id"] == str(post.uuid)
    html = _html(_client(reviewer).get(f"/ui/promotions/{promotion.id}/"))
    assert 'id="gate-not-configured"' not in html
    said = _block(html, "gate-status")
    assert _text(html, "gate-status-outcome") == outcome and "min_accuracy 0.25" in said
    assert (f"( {code} )" in said) is bool(code)


@pytest.mark.parametrize("state", PromotionState.values)
def test_every_state_renders(home, team, state):
    requester, reviewer, other = team
    published(home, "r2")
    promotion = promotion_request(candidate="r2", user=requester, reason="round two")
    if state != "pending":
        Promotion.objects.filter(id=promotion.id).update(state=state, decided_by=reviewer, reason=f"why {state}")
    client = _client(other)
    html = _html(client.get(f"/ui/promotions/{promotion.id}/"))
    label = "approved — activating" if state == "approved" else state
    assert _text(html, "promotion-state") == label
    live = ("pending", "approved")
    assert ('hx-trigger="every 2s"' in html) == (state in live)
    assert ('id="approve-form"' in html) == (state == "pending")
    queue = _html(client.get("/ui/promotions/"))
    assert f'badge promotion-{state}" data-state="{state}">{label}<' in queue
    assert client.get(f"/ui/promotions/{promotion.id}/?fragment=live").status_code == 200


def test_unknown_promotion_is_404_and_pages_need_login(team, client):
    _, reviewer, _ = team
    assert _client(reviewer).get("/ui/promotions/999/").status_code == 404
    assert _client(reviewer).post("/ui/promotions/999/approve/", {"reason": "x"}).status_code == 404
    assert client.get("/ui/promotions/1/")["Location"] == "/ui/login/?next=/ui/promotions/1/"
    assert client.post("/ui/promotions/1/approve/", {"reason": "x"}).status_code == 302


# ---- the gate box: the gate's decision, and what serves now -------------------------------------

def test_a_passed_gate_awaiting_approval_does_not_claim_the_candidate_is_served(home, team):
    """Was: "The new adapter passed the gate and is served." while the promotion waited and r1 served."""
    requester, reviewer, _ = team
    published(home, "r2")
    gate = _gate(["pass"] * 20, ["fail"] * 20, "r2")
    assert gate["outcome"] == "promoted"
    promotion = promotion_request(candidate="r2", user=requester, reason="round two", evidence=gate)
    html = _html(_client(reviewer).get(f"/ui/promotions/{promotion.id}/"))
    assert _text(html, "promotion-state") == "pending"
    assert _block(html, "gate-decision") == "The new adapter passed the gate: the gate allowed its activation."
    assert _block(html, "gate-serving") == "Serving now: r1 ; the candidate r2 is not served."
    assert "is served" not in html


def test_an_inconclusive_gate_of_an_adapter_made_active_later_says_it_serves(home, team):
    """Was: "... it is not served." while the adapter was active (activated by hand after the gate)."""
    requester, reviewer, _ = team
    published(home, "r2")
    gate = _gate(["pass"] * 5, ["fail"] * 5, "r2")
    assert gate["outcome"] == "inconclusive"
    promotion = promotion_request(candidate="r2", user=requester, reason="by hand", evidence=gate)
    Adapter.objects.filter(name="r1").update(loaded=False)
    Adapter.objects.filter(name="r2").update(loaded=True)
    html = _html(_client(reviewer).get(f"/ui/promotions/{promotion.id}/"))
    assert _block(html, "gate-decision").endswith("the gate did not activate it.")
    assert _block(html, "gate-serving") == "Serving now: r2 , this candidate."
    assert "not served" not in html


def test_the_gate_eval_job_link_becomes_plain_text_once_the_job_is_deleted(home, team):
    from core.jobs.services import job_delete

    requester, reviewer, _ = team
    published(home, "r2")
    eval_job = job_submit(kind="test.steps", payload={"steps": 1}, title="post-eval compare", user=requester)
    Job.objects.filter(id=eval_job.id).update(kind="eval.run", state="completed")
    gate = {**_gate(["pass"] * 20, ["fail"] * 20, "r2"), "eval_job_id": str(eval_job.uuid)}
    promotion = promotion_request(candidate="r2", user=requester, reason="round two", evidence=gate)
    page = f"/ui/promotions/{promotion.id}/"
    html = _html(_client(reviewer).get(page))
    assert f'href="/ui/jobs/{eval_job.uuid}/"' in html
    assert f'href="/ui/evaluations/jobs/{eval_job.uuid}/compare/"' in html
    job_delete(job=Job.objects.get(id=eval_job.id), user=requester)
    html = _html(_client(reviewer).get(page))
    assert _block(html, "gate-eval-job", "</dd>") == f"{str(eval_job.uuid)[:8]} · compare (deleted)"
    assert f'href="/ui/jobs/{eval_job.uuid}/"' not in html and "/compare/" not in html
