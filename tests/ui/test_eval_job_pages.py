"""Eval job pages through the test client: the suite page's "Run evaluation" form, Evaluations → Jobs,
the compare view (targets side by side per example, with the completions and the differing-only
filter), the compare link on the job page, and the gate evidence include.

Eval jobs run in process (`run_queued_jobs("control")`) against the fake model service of the eval
job API tests (tests/evaluations/test_eval_jobs_api.py: `chat_completion_sync` replaced, a live GPU
worker's heartbeat faked). The fake answers "What is i + i?" right for odd i and wrong for even i;
here the adapter `a1` answers every one right, so base and a1 differ on q2 and q4.
"""

from __future__ import annotations

import re
from dataclasses import replace
from html import unescape

import pytest
from django.template.loader import render_to_string
from django.utils import timezone

from adapters.models import Adapter, AdapterState
from core.jobs.models import Job
from core.jobs.runner import run_queued_jobs
from evaluations import suite_services
from evaluations.gate import GateArm, finalize_evidence, paired_wilson_v1
from tests.evaluations.test_eval_jobs_api import ADAPTER_SHA, EXAMPLES, FakeModel, gpu_worker  # noqa: F401

pytestmark = pytest.mark.django_db

SUITE = {"name": "sums", "scorer": {"type": "exact"}, "examples": EXAMPLES}


class AdapterKnowsSums(FakeModel):
    """The API tests' fake model, except that adapter `a1` answers every sum right."""

    def __call__(self, body, timeout=900.0):
        response = super().__call__(body, timeout)
        if body.get("adapter") == "a1":
            number = int(body["messages"][-1]["content"].split()[2])
            answer = str(2 * number)
            choice = response["choices"][0]
            choice["message"]["content"] = answer
            choice["rollout_provenance"]["input_token_ids"] = [1, 2, 3, *(ord(c) for c in answer)]
        return response


@pytest.fixture
def home(settings, tmp_path):
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"


@pytest.fixture
def model(monkeypatch, gpu_worker):  # noqa: F811
    from adapters.serving import sync_client

    fake = AdapterKnowsSums()
    monkeypatch.setattr(sync_client, "chat_completion_sync", fake)
    return fake


@pytest.fixture
def suite(home, operator):
    return suite_services.suite_store(body=SUITE, force=False, user=operator)


@pytest.fixture
def adapter(home):
    path = home / "adapters" / "a1"
    path.mkdir(parents=True)
    return Adapter.objects.create(name="a1", state=AdapterState.PUBLISHED, path=str(path),
                                  content_sha256=ADAPTER_SHA, published_at=timezone.now())


def _html(response) -> str:
    return response.content.decode()


def _text(html: str, element_id: str) -> str:
    """The text of the element with this id (up to its tag's first closing tag), tags dropped."""
    at = html.index(f'id="{element_id}"')
    start = html.rindex("<", 0, at)
    tag = re.match(r"<(\w+)", html[start:]).group(1)
    inner = html[html.index(">", at) + 1:html.index(f"</{tag}>", at)]
    return " ".join(unescape(re.sub(r"<[^>]+>", "", inner)).split())


def _run_form(client, *targets, **fields):
    data = {"targets": list(targets), "temperature": "0", "max_tokens": "16", "seed": "5", **fields}
    return client.post("/ui/evaluations/suites/sums/run/", data)


def _compare_job(client) -> Job:
    response = _run_form(client, "base", "a1")
    assert response.status_code == 302, _html(response)
    job = Job.objects.get(kind="eval.run")
    assert response["Location"] == f"/ui/jobs/{job.uuid}/"
    run_queued_jobs("control")
    job.refresh_from_db()
    assert job.state == "completed", (job.error_code, job.error_message)
    return job


# ---- login --------------------------------------------------------------------------------------

@pytest.mark.parametrize("url", ["/ui/evaluations/jobs/",
                                 "/ui/evaluations/jobs/00000000-0000-0000-0000-000000000000/compare/"])
def test_the_eval_job_pages_need_login(client, url):
    response = client.get(url)
    assert response.status_code == 302 and response["Location"] == f"/ui/login/?next={url}"


def test_compare_of_an_unknown_job_is_404(operator_client, home):
    assert operator_client.get("/ui/evaluations/jobs/00000000-0000-0000-0000-000000000000/compare/").status_code == 404
    assert operator_client.post("/ui/evaluations/suites/ghost/run/", {"targets": ["base"]}).status_code == 404


# ---- the run form -------------------------------------------------------------------------------

def test_the_suite_page_offers_base_and_the_published_adapters(operator_client, suite, adapter):
    Adapter.objects.create(name="draft", state=AdapterState.WRITING)  # reserved by training: not a target
    html = _html(operator_client.get("/ui/evaluations/suites/sums/"))
    form = html[html.index('id="suite-run-form"'):html.index("</form>", html.index('id="suite-run-form"'))]
    assert form.count('name="targets"') == 8
    assert '<option value="base" selected>base model</option>' in form
    assert '<option value="a1">a1</option>' in form and "draft" not in form
    for name in ("temperature", "max_tokens", "seed"):
        assert f'id="id_{name}"' in form
    assert 'action="/ui/evaluations/suites/sums/run/" class="grpo-form" id="suite-run-form"' in html


def test_one_target_queues_a_run_and_several_a_compare(operator_client, suite, adapter, gpu_worker):  # noqa: F811
    response = _run_form(operator_client, "a1", "", "")
    assert response.status_code == 302
    run = Job.objects.get(kind="eval.run")
    assert run.payload["mode"] == "run" and run.payload["targets"][0]["adapter"] == "a1"
    assert run.payload["generation"]["seed"] == "5" and run.payload["generation"]["max_tokens"] == 16
    assert run.payload["suite"]["suite_hash"] == suite.suite_hash and run.submitted_by.username == "operator"
    page = operator_client.get(response["Location"])
    assert page.status_code == 200 and "Queued Eval run" in _html(page)

    response = _run_form(operator_client, "base", "", "base", "a1", seed="")
    assert response.status_code == 302
    compare = Job.objects.filter(kind="eval.run").order_by("-id").first()
    assert compare.payload["mode"] == "compare"
    assert [t["adapter"] for t in compare.payload["targets"]] == [None, None, "a1"]
    assert compare.payload["generation"]["seed_source"] == "derived"


def test_run_form_errors_are_shown_inline_and_queue_nothing(operator_client, viewer_client, suite, adapter):
    # No GPU worker: 503 inference_unavailable, for the form as a whole, with the chosen values kept.
    response = _run_form(operator_client, "base", "a1", seed="77")
    assert response.status_code == 503
    html = _html(response)
    assert "inference_unavailable" in _text(html, "run-form-error")
    assert 'value="77"' in html and '<option value="a1" selected>a1</option>' in html
    # A bad value sits next to its field.
    response = _run_form(operator_client, "base", temperature="hot")
    assert response.status_code == 400
    assert _text(_html(response), "run-error-temperature").startswith("eval_invalid_request generation.temperature")
    response = _run_form(operator_client, "", "")
    assert response.status_code == 400 and "choose a target" in _text(_html(response), "run-error-targets")
    response = _run_form(operator_client, "ghost")
    assert response.status_code == 400 and "no published adapter named 'ghost'" in _text(_html(response),
                                                                                        "run-error-targets")
    response = _run_form(operator_client, "base", max_tokens="0")
    assert response.status_code == 400 and 'id="run-error-max_tokens"' in _html(response)
    # A viewer may look but not run.
    response = _run_form(viewer_client, "base")
    assert response.status_code == 403 and "submit_job" in _html(response)
    assert 'id="suite-run-form"' in _html(viewer_client.get("/ui/evaluations/suites/sums/"))
    assert not Job.objects.filter(kind="eval.run").exists()


# ---- the compare view ---------------------------------------------------------------------------

def test_the_compare_view_shows_counts_every_example_and_the_completions(operator_client, suite, adapter, model):
    job = _compare_job(operator_client)
    html = _html(operator_client.get(f"/ui/evaluations/jobs/{job.uuid}/compare/"))
    # Per-target counts and accuracy on top.
    assert _text(html, "compare-target-0-pass") == "3" and _text(html, "compare-target-0-fail") == "2"
    assert _text(html, "compare-target-0-accuracy") == "0.6"
    assert _text(html, "compare-target-1-pass") == "5" and _text(html, "compare-target-1-fail") == "0"
    assert _text(html, "compare-target-1-accuracy") == "1"
    assert 'data-label="base"' in html and 'data-label="a1"' in html
    # One row per example, one column per target, with the reference target and the completion.
    rows = re.findall(r'<tr id="compare-row-\d+"[^>]*data-example-id="([^"]+)"', html)
    assert rows == [e["id"] for e in EXAMPLES]
    table = html[html.index('id="compare-table"'):]
    assert "<th scope=\"col\" class=\"mono\">base</th>" in table and "<th scope=\"col\" class=\"mono\">a1</th>" in table
    assert table.count('class="compare-cell"') == 10
    assert table.count("<details class=\"completion\">") == 10
    assert "<pre>5</pre>" in table and "<pre>4</pre>" in table  # q2: base says 5, a1 says 4
    assert "What is 2 + 2?" in table
    assert len(re.findall(r'data-differs="true"', html)) == 2
    assert _text(html, "filter-all") == "All (5)" and _text(html, "filter-differing") == "Differing only (2)"
    # The differing-only filter keeps q2 and q4.
    differing = _html(operator_client.get(f"/ui/evaluations/jobs/{job.uuid}/compare/?show=differing"))
    assert re.findall(r'data-example-id="([^"]+)"', differing) == ["q2", "q4"]
    assert 'id="filter-differing" aria-current="page"' in differing
    # The job page links the compare view.
    page = _html(operator_client.get(f"/ui/jobs/{job.uuid}/"))
    assert f'href="/ui/evaluations/jobs/{job.uuid}/compare/" id="eval-compare-link"' in page


def test_a_single_target_run_and_a_pending_job_have_a_compare_view(operator_client, suite, model):
    response = _run_form(operator_client, "base")
    job = Job.objects.get(kind="eval.run")
    pending = _html(operator_client.get(f"/ui/evaluations/jobs/{job.uuid}/compare/"))
    assert 'id="compare-pending"' in pending and "queued" in pending and 'id="compare-table"' not in pending
    assert response.status_code == 302
    run_queued_jobs("control")
    html = _html(operator_client.get(f"/ui/evaluations/jobs/{job.uuid}/compare/"))
    assert _text(html, "compare-target-0-pass") == "3" and _text(html, "compare-target-0-error") == "0"
    assert len(re.findall(r'<tr id="compare-row-', html)) == 5 and "Differing only (0)" in html
    nothing = _html(operator_client.get(f"/ui/evaluations/jobs/{job.uuid}/compare/?show=differing"))
    assert "No example where the targets differ." in nothing


def test_a_base_versus_base_compare_has_two_columns_that_agree(operator_client, suite, model):
    _run_form(operator_client, "base", "base")
    run_queued_jobs("control")
    job = Job.objects.get(kind="eval.run")
    html = _html(operator_client.get(f"/ui/evaluations/jobs/{job.uuid}/compare/"))
    assert "base #1" in html and "base #2" in html and "Differing only (0)" in html
    assert _text(html, "compare-target-0-pass") == _text(html, "compare-target-1-pass") == "3"


# ---- the jobs tab -------------------------------------------------------------------------------

def test_the_jobs_tab_lists_eval_jobs_with_accuracy_and_a_compare_link(operator_client, suite, adapter, model):
    empty = _html(operator_client.get("/ui/evaluations/jobs/"))
    assert "No evaluation jobs yet." in empty and 'data-active="false"' in empty
    assert '<a href="/ui/evaluations/jobs/" aria-current="page">Jobs</a>' in empty
    done = _compare_job(operator_client)
    _run_form(operator_client, "base")
    queued = Job.objects.filter(kind="eval.run").order_by("-id").first()
    html = _html(operator_client.get("/ui/evaluations/jobs/"))
    row = html[html.index(f'id="eval-job-{done.uuid}"'):]
    row = row[:row.index("</tr>")]
    assert "compare view" in row and ">compare<" in row and "sums" in row and "base, a1" in row
    assert f'href="/ui/evaluations/jobs/{done.uuid}/compare/"' in row
    assert "pass 3 · 5" in row and "pass 8 / 10" not in row  # each target's passes, not the pooled count
    # Each target's accuracy, in the targets' order, not the pooled 0.8.
    cell = row[row.index('eval-job-accuracy">') + len('eval-job-accuracy">'):]
    cell = cell[:cell.index("<")].strip()
    targets = operator_client.get(f"/v1/eval/jobs/{done.uuid}").json()["targets"]
    assert [float(part) for part in cell.split(" / ")] == pytest.approx([t["accuracy"] for t in targets], abs=1e-3)
    assert f'id="eval-job-{queued.uuid}"' in html
    assert 'data-active="true"' in html and 'hx-trigger="every 4s"' in html  # a queued job: the body re-reads
    fragment = _html(operator_client.get("/ui/evaluations/jobs/?fragment=rows"))
    assert fragment.lstrip().startswith('<tbody id="eval-jobs-body"') and "<html" not in fragment
    hub = _html(operator_client.get("/ui/evaluations/"))
    assert 'href="/ui/evaluations/jobs/"' in hub and 'ws-connect="/ws/ui/jobs/?category=evaluation"' in hub


class AdapterFailsSums(FakeModel):
    """Adapter `a1` answers every sum wrong: zero passes."""

    def __call__(self, body, timeout=900.0):
        response = super().__call__(body, timeout)
        if body.get("adapter") == "a1":
            response["choices"][0]["message"]["content"] = "wrong"
        return response


def test_a_target_with_no_passes_shows_zero_not_a_dash(operator_client, suite, adapter, monkeypatch, gpu_worker):  # noqa: F811
    """A pass count of 0 read as "—" (unknown) in the jobs tab; 0 passes is a result."""
    from adapters.serving import sync_client

    monkeypatch.setattr(sync_client, "chat_completion_sync", AdapterFailsSums())
    done = _compare_job(operator_client)
    html = _html(operator_client.get("/ui/evaluations/jobs/"))
    row = html[html.index(f'id="eval-job-{done.uuid}"'):]
    row = row[:row.index("</tr>")]
    assert "pass 3 · 0" in row


# ---- gate evidence ------------------------------------------------------------------------------

def _arm(adapter, outcomes):
    return GateArm(adapter=adapter, suite_name="held-out", suite_hash="sha256:" + "a" * 64,
                   effective_generation_hash="sha256:" + "9" * 64, outcomes=outcomes)


def _evidence(baseline: str, candidate: str, n: int = 20, **kwargs) -> dict:
    ids = [f"e{i:02d}" for i in range(n)]
    return paired_wilson_v1(baseline=_arm(None, dict.fromkeys(ids, baseline)),
                            candidate=_arm("round-2", dict.fromkeys(ids, candidate)),
                            eval_job_id="0d6f3a52-9c1e-4b7a-8f00-5b2e1c7d9a10", min_accuracy=0.8, **kwargs).evidence


def _gate(evidence: dict) -> str:
    return render_to_string("ui/evaluations/gate_evidence.html", {"evidence": evidence})


def test_gate_evidence_of_a_promoted_adapter(home):
    evidence = _evidence("fail", "pass")
    assert evidence["outcome"] == "promoted"
    html = _gate(evidence)
    assert 'data-outcome="promoted"' in html and _text(html, "gate-outcome") == "promoted"
    assert _text(html, "gate-decision") == "The new adapter passed the gate: the gate allowed its activation."
    # Nothing is active here: the box says so from the registry, not from the outcome.
    assert _text(html, "gate-serving") == "Serving now: the base model; the candidate round-2 is not served."
    assert _text(html, "gate-reason").startswith("Why: significant paired improvement")
    assert _text(html, "gate-paired") == "20 (at least 20 needed)"
    assert (_text(html, "gate-improved"), _text(html, "gate-regressed"), _text(html, "gate-tied")) == ("20", "0", "0")
    assert _text(html, "gate-p-value") == "1.907e-06" and _text(html, "gate-significance") == "significant improvement"
    assert "α = 0.05" in html and "95% Wilson bounds" in html
    low = f"{evidence['candidate_accuracy_lower_bound']:.4g}"
    assert _text(html, "gate-candidate-accuracy") == "1" and _text(html, "gate-candidate-bounds") == f"{low} – 1"
    assert _text(html, "gate-baseline-accuracy") == "0"
    assert _text(html, "gate-baseline-bounds") == f"0 – {evidence['baseline_accuracy_upper_bound']:.4g}"
    assert "round-2" in html and ">base<" in html and "reaches it" in _text(html, "gate-floor")
    assert "paired_wilson_v1" in html and "held-out" in html
    # This eval job id is in no registry: named, not linked to a page that would answer 404.
    assert _text(html, "gate-eval-job") == "0d6f3a52 · compare (deleted)" and "/compare/" not in html
    kept = _gate(finalize_evidence(evidence, auto_load=False))
    assert _text(kept, "gate-outcome") == "kept"
    assert "auto-load was off, so the gate did not activate it" in _text(kept, "gate-decision")


def test_gate_evidence_of_a_regression_and_of_an_unpaired_error(home):
    evidence = _evidence("pass", "fail")
    assert evidence["outcome"] == "regression"
    html = _gate(evidence)
    assert _text(html, "gate-outcome") == "regression" and "badge state-failed" in html
    assert _text(html, "gate-decision").endswith("worse than the baseline: the gate did not activate it.")
    assert _text(html, "gate-reason").startswith("Why: the candidate is significantly worse than the baseline")
    assert (_text(html, "gate-improved"), _text(html, "gate-regressed")) == ("0", "20")
    assert _text(html, "gate-p-value") == "1.907e-06" and _text(html, "gate-significance") == "significant regression"
    assert _text(html, "gate-candidate-bounds") == f"0 – {evidence['candidate_accuracy_upper_bound']:.4g}"
    assert "fall short of it" in _text(html, "gate-floor")

    few = _gate(_evidence("fail", "pass", n=5))
    assert _text(few, "gate-outcome") == "inconclusive" and "only 5 paired examples" in few
    assert _text(few, "gate-significance") == "not significant"
    broken = {**_evidence("fail", "pass"), "outcome": "error", "reason": "the arms cannot be paired: suite hash "
              "differs", "eval_job_id": "not-a-uuid"}
    html = _gate(broken)
    assert _text(html, "gate-outcome") == "error" and "could not compare" in html
    assert "not-a-uuid" in _text(html, "gate-eval-job")


def test_gate_evidence_is_includable_in_a_page(home):
    """How a page includes it (the training job page will): `with evidence=...`."""
    from django.template import engines

    template = engines["django"].from_string(
        '{% include "ui/evaluations/gate_evidence.html" with evidence=gate.evidence %}')
    html = template.render({"gate": {"evidence": _evidence("fail", "pass")}})
    assert 'id="gate-evidence"' in html and _text(html, "gate-outcome") == "promoted"

