"""The all-jobs page a page at a time and by state, the Overview's counters, the eval jobs tab's
polling, the favicon, and Kiln's page for a body over the request limit (through the test client)."""

from __future__ import annotations

import re

import pytest

from core.jobs import services
from core.jobs.fragments import DEFAULT_LIMIT
from core.jobs.models import Job, JobState

pytestmark = pytest.mark.django_db


def _jobs(user, count: int) -> list[Job]:
    return [services.job_submit(kind="test.steps", payload={"steps": 1}, user=user, max_queued=10_000)
            for _ in range(count)]


def _row_ids(html: str) -> list[str]:
    return re.findall(r'<tr id="job-row-([0-9a-f-]+)"', html)


def test_every_job_is_reachable_through_older_pages(operator_client, operator):
    jobs = _jobs(operator, DEFAULT_LIMIT + 5)
    newest_first = [str(job.uuid) for job in reversed(jobs)]

    first = operator_client.get("/ui/jobs/").content.decode()
    assert _row_ids(first) == newest_first[:DEFAULT_LIMIT]
    assert 'ws-connect="/ws/ui/jobs/"' in first  # the first page stays live
    assert 'id="jobs-newest"' not in first
    older = re.search(r'<a href="(/ui/jobs/\?before=[0-9a-f-]+)" id="jobs-older">', first).group(1)
    assert older == f"/ui/jobs/?before={newest_first[DEFAULT_LIMIT - 1]}"

    second = operator_client.get(older).content.decode()
    assert _row_ids(second) == newest_first[DEFAULT_LIMIT:]
    assert "ws-connect" not in second and "hx-ext=\"ws\"" not in second  # an older page stays as loaded
    assert 'id="jobs-older"' not in second  # the oldest job is on it
    assert '<a href="/ui/jobs/" id="jobs-newest">' in second


def test_one_page_has_no_pager(operator_client, operator):
    _jobs(operator, 3)
    html = operator_client.get("/ui/jobs/").content.decode()
    assert len(_row_ids(html)) == 3 and 'id="jobs-older"' not in html and 'class="actions job-pages"' not in html


def test_an_unknown_page_is_404(operator_client):
    assert operator_client.get("/ui/jobs/?before=33333333-3333-3333-3333-333333333333").status_code == 404
    assert operator_client.get("/ui/jobs/?before=nonsense").status_code == 404


def test_the_state_filter_keeps_one_state_and_pages_within_it(operator_client, operator):
    queued = _jobs(operator, DEFAULT_LIMIT + 1)
    cancelled = _jobs(operator, 2)
    for job in cancelled:
        services.job_cancel(job=job, user=operator)

    html = operator_client.get("/ui/jobs/?state=cancelled").content.decode()
    assert _row_ids(html) == [str(job.uuid) for job in reversed(cancelled)]
    assert 'ws-connect="/ws/ui/jobs/?state=cancelled"' in html
    assert '<a id="filter-cancelled" href="/ui/jobs/?state=cancelled" aria-current="page">' in html

    page = operator_client.get("/ui/jobs/?state=queued").content.decode()
    ids = _row_ids(page)
    assert ids == [str(job.uuid) for job in reversed(queued)][:DEFAULT_LIMIT]
    link = re.search(r'href="([^"]+)" id="jobs-older"', page).group(1).replace("&amp;", "&")
    assert link == f"/ui/jobs/?state=queued&before={ids[-1]}"
    rest = operator_client.get(link).content.decode()
    assert _row_ids(rest) == [str(queued[0].uuid)]
    assert '<a href="/ui/jobs/?state=queued" id="jobs-newest">' in rest

    empty = operator_client.get("/ui/jobs/?state=failed").content.decode()
    assert _row_ids(empty) == [] and "No failed jobs." in empty


def test_an_unknown_state_is_a_clear_message(operator_client, operator):
    _jobs(operator, 1)
    response = operator_client.get("/ui/jobs/?state=bogus")
    assert response.status_code == 400
    html = response.content.decode()
    message = html[html.index('id="state-error"'):]
    message = message[:message.index("</div>")]
    assert "<code>invalid_state</code>" in message and "there is no job state &#x27;bogus&#x27;" in message
    assert "choose one of queued, running, completed, failed, cancelled" in message
    assert _row_ids(html) == []  # no table pretending to be filtered
    assert '<a id="filter-all" href="/ui/jobs/"' in html


def test_each_overview_counter_links_to_its_filter(operator_client, operator):
    _jobs(operator, 2)
    html = operator_client.get("/ui/").content.decode()
    for state in JobState.values:
        match = re.search(rf'<a class="count state-{state}" href="([^"]+)" id="count-{state}">\s*'
                          rf'<span class="n">(\d+)</span>', html)
        assert match.group(1) == f"/ui/jobs/?state={state}"
        assert int(match.group(2)) == (2 if state == "queued" else 0)


def test_the_eval_jobs_tab_polls_even_when_no_job_is_active(operator_client):
    html = operator_client.get("/ui/evaluations/jobs/").content.decode()
    body = html[html.index('<tbody id="eval-jobs-body"'):]
    body = body[:body.index(">")]
    assert 'hx-get="/ui/evaluations/jobs/?fragment=rows"' in body
    assert 'hx-trigger="every 15s"' in body and 'hx-swap="outerHTML"' in body
    assert 'data-active="false"' in body
    # The fragment it polls keeps polling too, so a new job appears without a reload.
    fragment = operator_client.get("/ui/evaluations/jobs/?fragment=rows").content.decode()
    assert fragment.lstrip().startswith('<tbody id="eval-jobs-body" hx-get="/ui/evaluations/jobs/?fragment=rows" '
                                        'hx-trigger="every 15s"')


def test_pages_name_a_favicon_that_is_served(operator_client, client):
    for html in (operator_client.get("/ui/").content.decode(), client.get("/ui/login/").content.decode()):
        assert '<link rel="icon" href="/static/kiln/favicon.svg" type="image/svg+xml">' in html
    icon = client.get("/static/kiln/favicon.svg")
    assert icon.status_code == 200
    assert icon["Content-Type"].startswith("image/svg+xml")
    assert b"<svg" in b"".join(icon.streaming_content if icon.streaming else [icon.content])


def test_a_form_body_over_the_request_limit_is_kilns_page_with_request_too_large(operator_client, settings):
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert limit == 8 * 1024 * 1024
    response = operator_client.post("/ui/evaluations/suites/", {"suite_json": "x" * (9 * 1024 * 1024)})
    assert response.status_code == 413
    html = response.content.decode()
    assert "Bad Request (400)" not in html
    assert '<code id="request-error-code">request_too_large</code>' in html
    message = re.search(r'id="request-error-message">([^<]+)<', html).group(1)
    assert re.fullmatch(rf"the request body has \d+ bytes; the limit is {limit} bytes \(KILN_MAX_REQUEST_BYTES\)",
                        message), message
    assert int(re.search(r"has (\d+) bytes", message).group(1)) > 9 * 1024 * 1024
    assert "raise KILN_MAX_REQUEST_BYTES" in html
    assert '<a href="/ui/evaluations/suites/" id="request-error-back">' in html
    assert '<span class="user">operator</span>' in html  # the dashboard's shell, signed in


def test_other_bad_requests_keep_djangos_page(operator_client, settings):
    fields = {f"f{i}": "x" for i in range(settings.DATA_UPLOAD_MAX_NUMBER_FIELDS + 1)}  # TooManyFieldsSent
    response = operator_client.post("/ui/evaluations/suites/", fields)
    assert response.status_code == 400 and b"request_too_large" not in response.content


def test_a_failed_jobs_page_says_what_to_do_about_its_error(operator_client, operator):
    """The API and CLI give the hint with the code; the page showed only the code and message."""
    from core.jobs.error_hints import job_error

    [job] = _jobs(operator, 1)
    Job.objects.filter(id=job.id).update(state=JobState.FAILED, error_code="zero_groups",
                                         error_message="every group was filtered")
    job.refresh_from_db()
    html = operator_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    hint = html[html.index('id="job-error-hint">') + len('id="job-error-hint">'):]
    from html import unescape

    assert unescape(hint[:hint.index("</p>")]) == "What to do: " + job_error(job)["hint"]
    assert "reward contrast" in job_error(job)["hint"]
