"""Training → Rollouts refuses a hostile tasks file with a 400 next to the field (never a 500) and
accepts a leading UTF-8 BOM in the tasks file and the template, as `kiln rollout-generate` does."""

from __future__ import annotations

import pytest

from core.jobs.models import Job
from tests.ui.test_rollouts_pages import TASKS, TEMPLATE, URL, _form, _inputs, _register, _upload, home  # noqa: F401

pytestmark = pytest.mark.django_db

BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize(("line", "text"), [
    ("[" * 100_000 + "]" * 100_000, "my-tasks.jsonl:1: nested too deeply"),
    ('{"id": "big", "prompt": "x", "answer": 1' + "0" * 5000 + "}", "my-tasks.jsonl:1: not valid JSON (Exceeds"),
    ('{"id": "n", "prompt": "x", "answer": NaN}', "my-tasks.jsonl:1: not valid JSON (NaN is not JSON)"),
])
def test_hostile_tasks_are_a_400_next_to_the_field(operator_client, home, line, text):  # noqa: F811
    _register(operator_client)
    response = operator_client.post(URL, _form(tasks_file=_upload(line + "\n", "my-tasks.jsonl")))
    html = response.content.decode()
    assert response.status_code == 400, html[:2000]
    assert "<code>tasks_invalid</code>" in html and 'id="error-tasks"' in html and text in html
    assert not Job.objects.exists() and _inputs(home) == []


def test_a_leading_bom_is_accepted_in_tasks_and_template(operator_client):
    _register(operator_client)
    response = operator_client.post(URL, _form(tasks_file=_upload(BOM + TASKS.encode(), "tasks.jsonl"),
                                               request_file=_upload(BOM + TEMPLATE.encode(), "request.json")))
    assert response.status_code == 302, response.content.decode()[:3000]
    assert Job.objects.get().payload["inputs"]["tasks"]["count"] == 3
