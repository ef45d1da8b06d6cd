"""Training → Rollouts end to end through the dashboard, on a real stack with the tiny model.

A browser-like client (httpx, logged in through the login form, CSRF tokens from the pages)
registers the example scorer, starts a generation on three example tasks × four seeds, waits on
the job page for completion, and checks the published files against the page's statistics. It
then clicks "Train on these rollouts" and waits for the recorded-policy training job to complete.
The web process, the GPU worker (gpu,infer) and the control worker are real processes; the
generation job reaches the model through the infer queue (no HTTP) and scores in the real sandbox.

Whether the tiny model's answers give a group reward contrast depends on the model build, and the
one-click training keeps GRPO's default dynamic sampling (a run whose groups are all flat fails
with zero_groups, as it should). So the run that is trained is scored by a shaped variant of the
example scorer (a small bonus on odd seeds) that gives every group contrast, whatever the model says.
"""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path

import httpx
import pytest

from core.contracts.groups import admit_jsonl
from tests.support.stack import wait_until

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpo-math"
PASSWORD = "correct-horse-42"
SEEDS = 4
TERMINAL = ("completed", "failed", "cancelled")
SHAPED_SCORER = b"""#!/usr/bin/env python3
import json
import re
import sys

row = json.load(sys.stdin)
numbers = re.findall(r"-?\\d+", row["content"])
correct = bool(numbers) and int(numbers[-1]) == row["task"]["answer"]
print((1.0 if correct else 0.0) + 0.25 * (row["seed"] % 2))
"""


def _csrf(html: str) -> str:
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match, "no CSRF token on the page"
    return match.group(1)


def _login(stack, username: str) -> httpx.Client:
    browser = httpx.Client(base_url=stack.url, timeout=60, follow_redirects=False)
    page = browser.get("/ui/login/")
    response = browser.post("/ui/login/", data={"username": username, "password": PASSWORD,
                                                "csrfmiddlewaretoken": _csrf(page.text), "next": "/ui/"})
    assert response.status_code == 302 and response.headers["location"] == "/ui/", response.text[:2000]
    return browser


def _job_state(browser: httpx.Client, path: str) -> tuple[str, str]:
    html = browser.get(path).text
    match = re.search(r'<dd id="job-state">\s*<span class="badge state-(\w+)">', html)
    assert match, html[:3000]
    return match.group(1), html


def _wait_for_job(browser, path: str, timeout: float, what: str) -> str:
    state_html = wait_until(lambda: (s := _job_state(browser, path))[0] in TERMINAL and s, timeout, interval=0.5,
                            what=what)
    state, html = state_html
    if state != "completed":
        error = re.search(r'<section class="card error" id="job-error">(.*?)</section>', html, re.S)
        pytest.fail(f"{what}: the job ended {state}: {unescape(error.group(1)) if error else html[:3000]}")
    return html


@pytest.fixture
def served(stack_factory, tiny_model_dir):
    stack = stack_factory(KILN_MODEL_PATH=tiny_model_dir)
    stack.start_web()
    stack.create_user("roller", PASSWORD)
    stack.start_worker("gpu-worker", "gpu,infer", threads=4)
    stack.start_worker("control-worker", "control")
    wait_until(lambda: stack.health()["training_backend"]["ready"], 120, what="the model to load")
    return stack


def _register(browser, name: str, content: bytes) -> str:
    page = browser.get("/ui/training/rollouts/")
    assert page.status_code == 200 and 'id="rollouts-form"' in page.text
    response = browser.post("/ui/training/rollouts/scorers/", data={
        "csrfmiddlewaretoken": _csrf(page.text), "scorer_name": name, "scorer_description": "example"},
        files={"scorer_file": ("score_math.py", content)})
    assert response.status_code == 302, response.text[:3000]
    page = browser.get(response.headers["location"])
    assert f'<option value="{name}" selected>' in page.text
    return page.text


def _generate(browser, page: str, scorer: str) -> tuple[str, str, str]:
    """Start three tasks × four seeds from the base model (short answers); (job path, id, finished page)."""
    tasks = "\n".join((EXAMPLE / "tasks.jsonl").read_text().splitlines()[:3]) + "\n"
    template = {**json.loads((EXAMPLE / "request.json").read_text()), "max_tokens": 16}
    response = browser.post("/ui/training/rollouts/", data={
        "csrfmiddlewaretoken": _csrf(page), "scorer": scorer, "adapter": "base", "seeds": str(SEEDS),
        "seed_start": "42", "concurrency": "4", "thinking_budget_tokens": "", "request_json": json.dumps(template)},
        files={"tasks_file": ("tasks.jsonl", tasks.encode())})
    assert response.status_code == 302, response.text[:3000]
    job_path = response.headers["location"]
    job_id = job_path.rstrip("/").rsplit("/", 1)[1]
    return job_path, job_id, _wait_for_job(browser, job_path, 150, f"rollout generation scored by {scorer}")


def test_generate_inspect_and_train_on_rollouts_from_the_dashboard(served):
    stack = served
    browser = _login(stack, "roller")

    # Register the example scorer and generate with it.
    page = _register(browser, "math-exact", (EXAMPLE / "score_math.py").read_bytes())
    job_path, job_id, html = _generate(browser, page, "math-exact")

    # The page's statistics are the published summary's.
    summary = browser.get(f"/ui/training/rollouts/{job_id}/files/summary.json")
    assert summary.status_code == 200 and "attachment" in summary.headers["content-disposition"]
    summary = summary.json()
    stats = summary["stats"]
    assert stats["count"] == 3 * SEEDS and stats["groups"] == 3
    assert 0.0 <= stats["min_reward"] <= stats["mean_reward"] <= stats["max_reward"] <= 1.0
    assert summary["scorer"]["sandboxed"] is True and summary["scorer"]["name"] == "math-exact"
    assert summary["adapter"] == "base" and summary["job"]["id"] == job_id
    mean = re.search(r'id="rollouts-mean">([^<]+)<', html).group(1)
    assert float(mean) == pytest.approx(stats["mean_reward"], rel=1e-3)
    flat = re.search(r'<dd id="rollouts-flat"><span class="mono">(\d+)</span>', html).group(1)
    assert int(flat) == stats["groups_without_contrast"]
    assert 'id="rollouts-histogram"' in html

    rollouts = browser.get(f"/ui/training/rollouts/{job_id}/files/rollouts.jsonl")
    assert rollouts.status_code == 200
    corpus = admit_jsonl(rollouts.content)
    assert corpus.rollouts == corpus.with_provenance == 3 * SEEDS
    assert corpus.sha256 == summary["output"]["sha256"]
    records = [c["provenance"] for g in corpus.groups for c in g["completions"]]
    assert [r["seed"] for r in records[:SEEDS]] == [42, 43, 44, 45]
    assert all(r["sampling"]["max_tokens"] == 16 and "adapter" not in r["behavior_policy"] for r in records)

    assert ('id="rollouts-all-flat"' in html) == (stats["groups_without_contrast"] == stats["groups"])
    assert 'id="train-on-rollouts"' in browser.get(job_path).text

    # A run whose every group has contrast (the shaped scorer), then one click: recorded-policy GRPO.
    page = _register(browser, "math-shaped", SHAPED_SCORER)
    job_path, job_id, html = _generate(browser, page, "math-shaped")
    assert re.search(r'<dd id="rollouts-flat"><span class="mono">0</span>', html), "a group without contrast"
    corpus = admit_jsonl(browser.get(f"/ui/training/rollouts/{job_id}/files/rollouts.jsonl").content)
    page = browser.get(job_path).text
    response = browser.post(f"/ui/training/rollouts/{job_id}/train/",
                            data={"csrfmiddlewaretoken": _csrf(page), "output_name": "ui-r001"})
    assert response.status_code == 302, response.text[:3000]
    training_path = response.headers["location"]
    assert training_path != job_path
    html = _wait_for_job(browser, training_path, 240, "recorded-policy training")
    assert 'id="training-section"' in html and "recorded" in html
    training_id = training_path.rstrip("/").rsplit("/", 1)[1]

    token = stack.kiln("token", "create", "roller").stdout.strip()
    api = stack.client(token)
    detail = api.get(f"/v1/train/jobs/{training_id}").json()
    assert detail["state"] == "completed" and detail["adapter_name"] == "ui-r001"
    assert detail["training_data"]["admitted_corpus_sha256"] == corpus.sha256
    receipt = api.get("/v1/adapters/ui-r001/receipt").json()
    assert receipt["grpo"]["behavior_policy"] == "recorded"
    assert receipt["grpo"]["policy_audit"]["recorded_provenance"]["completion_count"] == 3 * SEEDS
    assert api.get("/v1/adapters/ui-r001").json()["loaded"] is False  # auto_load off

    # The generation page links the training run it fed.
    assert training_id[:8] in browser.get(job_path).text
