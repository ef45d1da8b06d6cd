"""KilnClient never lets a name or id change the route a request reaches, and a wrong --url (another web
server) answers one `not_a_kiln_server` line, never a page of HTML or a JSONDecodeError."""

from __future__ import annotations

import httpx
import pytest

from kiln_project.cli import adapters_cmd, client, eval_cmd, jobs_cmd, train_cmd
from kiln_project.cli.client import CliError, api_path, check_path, job_id_arg
from tests.cli.recording_server import Recorder, fake_client, run_cli, serve_commands

JOB = "3f1f8c5e-0000-4000-8000-000000000001"


@pytest.fixture
def server(monkeypatch):
    """Every client command's KilnClient talks to a recorder that answers an empty JSON object."""
    return serve_commands(monkeypatch, (adapters_cmd, jobs_cmd, train_cmd, eval_cmd),
                          lambda request: httpx.Response(200, json={}))


_run = run_cli


# --- ids and names in paths -----------------------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["jobs", "cancel", "../adapters/probe-victim"],
    ["jobs", "show", "../adapters"],
    ["jobs", "show", "../adapters", "--follow"],
    ["train", "cancel", "--job-id", "../../adapters/probe-victim"],
    ["train", "status", "--job-id", "../../adapters/probe-victim"],
    ["train", "status", "--job-id", "..", "--follow"],
    ["eval", "status", "../../adapters/probe-victim"],
    ["eval", "rerun", ".."],
])
def test_a_job_id_that_is_not_a_uuid_is_refused_before_any_request(server, capsys, argv):
    code, out, err = _run(capsys, *argv)
    assert server.requests == []
    assert code == 1 and out == ""
    assert err.startswith("error: invalid_job_id: ") and len(err.strip().splitlines()) == 1, err


def test_a_valid_job_id_reaches_its_own_route(server, capsys):
    server.answer = lambda request: httpx.Response(200, json={
        "id": JOB, "kind": "grpo", "state": "cancelled", "progress": 0.0, "queue_position": None})
    code, out, _ = _run(capsys, "jobs", "cancel", JOB.upper())  # any spelling of the UUID: sent canonical
    assert code == 0 and out == f"cancelled {JOB}\n"
    assert server.requests == [("DELETE", f"/v1/jobs/{JOB}")]


@pytest.mark.parametrize("argv", [["adapters", "delete", ".."], ["adapters", "show", ".."],
                                  ["adapters", "activate", "..", "--reason", "x"]])
def test_the_client_guard_stops_dot_segments_from_commands_that_splice_names(server, capsys, argv):
    """adapters_cmd builds /v1/adapters/{name} itself: the client still refuses to send a '..' segment."""
    code, _, err = _run(capsys, *argv)
    assert server.requests == []
    assert code == 1 and err.startswith("error: invalid_path_segment: "), err


@pytest.mark.parametrize("path", ["/v1/jobs/../adapters/victim", "/v1/jobs/./x", "/v1/jobs/%2e%2e/adapters/v",
                                  "/v1/jobs/%2E./adapters/v", "/v1/jobs/%252e%252e/x", "/v1/adapters/..",
                                  "/v1/adapters/v#/../../jobs", "//evil.example/v1/jobs", "v1/jobs",
                                  "/v1/adapters/a\\..\\b"])
def test_the_guard_refuses_paths_that_would_reach_another_route(path):
    recorder = Recorder(lambda request: httpx.Response(200, json={}))
    kiln = fake_client(recorder)()
    for send in (lambda: kiln.request("DELETE", path), lambda: kiln._http.request("DELETE", path)):
        with pytest.raises(CliError) as caught:
            send()
        assert caught.value.code == "invalid_path_segment"
    with pytest.raises(CliError), kiln._http.stream("GET", path):  # the streamed downloads too
        pass
    assert recorder.requests == []


def test_api_path_encodes_each_segment_and_refuses_dot_segments():
    assert api_path("/v1/jobs", JOB, "events") == f"/v1/jobs/{JOB}/events"
    assert api_path("/v1/eval/suites/", "a/b c?d#e") == "/v1/eval/suites/a%2Fb%20c%3Fd%23e"
    assert api_path("/v1/adapters", "...") == "/v1/adapters/..."  # three dots are a plain name
    for bad in ("", ".", ".."):
        with pytest.raises(CliError) as caught:
            api_path("/v1/adapters", bad)
        assert caught.value.code == "invalid_path_segment"
    check_path("GET", "/v1/adapters/...")  # allowed
    check_path("GET", "/v1/jobs?limit=5&state=../x")  # a query is not a path


def test_job_id_arg_canonicalises_uuids_and_names_the_listing():
    assert job_id_arg(" " + JOB.replace("-", "") + " ") == JOB
    with pytest.raises(CliError) as caught:
        job_id_arg("../x", "training job")
    assert caught.value.code == "invalid_job_id" and caught.value.hint.endswith("kiln train status")


# --- a server that is not Kiln ----------------------------------------------------------------------

HTML = "<!DOCTYPE HTML>\n<html>\n<head><title>Error response</title></head>\n<body>\n<h1>404</h1>\n</body>\n</html>\n"


@pytest.mark.parametrize("status, body, content_type, expected", [
    (404, HTML, "text/html;charset=utf-8", "answered 404 Not Found with text/html"),
    (500, "oops\nline two", "text/plain", "answered 500 Internal Server Error with text/plain"),
    (404, '{"detail": "Not Found"}', "application/json", "answered 404 Not Found with application/json"),
    (200, HTML, "text/html", "answered 200 OK with text/html"),
    (301, "", "text/html", "answered 301 Moved Permanently (redirecting to https://elsewhere/) with text/html"),
])
def test_another_web_server_is_one_not_a_kiln_server_line(server, capsys, status, body, content_type, expected):
    headers = {"content-type": content_type}
    if status == 301:
        headers["location"] = "https://elsewhere/"
    server.answer = lambda request: httpx.Response(status, text=body, headers=headers)
    code, out, err = _run(capsys, "jobs", "list")
    assert code == 1 and out == ""
    assert err == (f"error: not_a_kiln_server: http://kiln.test {expected}, not Kiln's JSON API (hint: check "
                   "--url or KILN_URL: it should name the Kiln server, e.g. http://127.0.0.1:8420)\n")


def test_kiln_error_envelopes_still_pass_through(server, capsys):
    server.answer = lambda request: httpx.Response(404, json={"error": {
        "code": "job_not_found", "message": "no job with id 'x'", "hint": "list jobs with GET /v1/jobs"}})
    code, _, err = _run(capsys, "jobs", "show", JOB)
    assert code == 1
    assert err == "error: job_not_found: no job with id 'x' (hint: list jobs with GET /v1/jobs)\n"


def test_a_streamed_refusal_from_another_server_is_one_line():
    response = httpx.Response(404, text=HTML, headers={"content-type": "text/html"},
                              request=httpx.Request("GET", "http://other.test:8000/v1/adapters/x/download"))
    with pytest.raises(CliError) as caught:
        client.raise_for_stream_error(response)
    assert caught.value.code == "not_a_kiln_server"
    assert caught.value.message == ("http://other.test:8000 answered 404 Not Found with text/html, "
                                    "not Kiln's JSON API")
    moved = httpx.Response(302, headers={"location": "/login"}, request=httpx.Request("GET", "http://o.test/x"))
    with pytest.raises(CliError) as caught:
        client.raise_for_stream_error(moved)
    assert caught.value.message == "http://o.test answered 302 Found (redirecting to /login) with no content type, " \
        "not Kiln's JSON API"
    envelope = httpx.Response(409, json={"error": {"code": "busy", "message": "a\nb", "hint": "wait"}},
                              request=httpx.Request("GET", "http://kiln.test/x"))
    with pytest.raises(CliError) as caught:
        client.raise_for_stream_error(envelope)
    assert (caught.value.code, caught.value.message, caught.value.hint) == ("busy", "a b", "wait")
