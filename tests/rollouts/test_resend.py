"""A GPU worker lost (or restarting) mid-run does not throw the run away: the seeded request is sent
again after a bounded wait that honours Retry-After, and the resent answer passes the same checks;
any other refusal still ends the run at once."""

from __future__ import annotations

import httpx
import pytest

from evaluations.generation.errors import RolloutError
from evaluations.generation.generate import ResendPolicy, plan_requests, run_requests
from kiln_project.cli import client as cli_client
from kiln_project.cli import main as cli_main
from kiln_project.cli.client import CliError, KilnClient
from tests.rollouts.fakes import FakeScore, FakeServer
from tests.rollouts.test_command import FakeClient, argv, workdir  # noqa: F401 - the command's fixture
from tests.rollouts.test_corpus_and_generate import BASE, TASKS, TEMPLATE

LOST = ("inference_worker_lost", "the GPU worker stopped while answering (worker gone)",
        "kiln serve restarts it; send the request again")


def _lost(retry_after=None, code=LOST[0]) -> CliError:
    error = CliError(code, LOST[1], LOST[2])
    error.retry_after = retry_after
    return error


class FlakyServer(FakeServer):
    """Refuses the request for (task prompt containing `needle`, `seed`) with `errors`, in turn, then answers."""

    def __init__(self, errors, needle="10 + 7", seed=2, tamper=None):
        super().__init__(tamper)
        self.errors, self.needle, self.seed = list(errors), needle, seed

    def __call__(self, body):
        if self.errors and body["seed"] == self.seed and self.needle in body["messages"][0]["content"]:
            self.bodies.append(body)
            raise self.errors.pop(0)
        return super().__call__(body)


def _generate(server, sleeps, notes=None, window_s=120.0):
    policy = ResendPolicy(window_s=window_s, sleep=sleeps.append, notify=(notes.append if notes is not None else None))
    planned = plan_requests(TEMPLATE, TASKS, [0, 1, 2, 3], BASE)
    return run_requests(planned, post=server, score=FakeScore(), options=BASE, concurrency=3, resend=policy)


def test_a_lost_worker_is_waited_for_and_the_same_request_sent_again():
    server, sleeps, notes = FlakyServer([_lost()]), [], []
    scored = _generate(server, sleeps, notes)
    assert len(scored) == 12 and [r.reward for r in scored[4:8]] == [1.0, 0.0, 1.0, 0.0]
    assert sleeps == [1.0]
    assert notes == ["task sum-10-7, seed 2: inference_worker_lost; sending it again in 1 s (waited 0 of 120 s)"]
    sent = [b for b in server.bodies if b["seed"] == 2 and "10 + 7" in b["messages"][0]["content"]]
    assert len(sent) == 2 and sent[0] == sent[1]  # the identical seeded body


@pytest.mark.parametrize("code", ["server_shutting_down", "service_unavailable", "model_loading",
                                  "inference_unavailable", "sampler_stopped"])
def test_restart_refusals_are_resent_with_backoff_honouring_retry_after(code):
    errors = [_lost(code=code), _lost(code=code), _lost(retry_after=5, code=code)]
    sleeps = []
    assert len(_generate(FlakyServer(errors), sleeps)) == 12
    assert sleeps == [1.0, 2.0, 5.0]


def test_other_refusals_still_end_the_run_at_once():
    refused = CliError("adapter_not_found", "no adapter named 'x'", "publish it first")
    sleeps = []
    with pytest.raises(RolloutError) as err:
        _generate(FlakyServer([refused]), sleeps)
    assert (err.value.code, err.value.task_id, err.value.seed, sleeps) == ("adapter_not_found", "sum-10-7", 2, [])
    assert err.value.message.endswith("chat completion request failed: no adapter named 'x'")  # no resend note


def test_a_worker_that_does_not_come_back_ends_the_run_after_the_window():
    sleeps = []
    with pytest.raises(RolloutError) as err:
        _generate(FlakyServer([_lost(retry_after=50)] * 10), sleeps)
    assert err.value.code == "inference_worker_lost" and err.value.seed == 2
    assert sleeps == [50.0, 50.0, 20.0]  # 120 s in all, then the failure
    assert "(sent 4 times, waiting 120 s for the GPU worker)" in err.value.message
    assert err.value.hint == LOST[2]


def test_the_resent_answer_is_checked_like_any_other():
    def tamper(body, response):
        if body["seed"] == 2 and "10 + 7" in body["messages"][0]["content"]:
            response["choices"][0]["seed"] = "3"

    with pytest.raises(RolloutError) as err:
        _generate(FlakyServer([_lost()], tamper=tamper), [])
    assert (err.value.task_id, err.value.seed, err.value.check) == ("sum-10-7", 2, "seed")


def test_the_client_keeps_a_refusals_retry_after():
    def answer(request):
        return httpx.Response(503, headers={"Retry-After": "7"}, json={"error": {
            "code": "server_shutting_down", "message": "the GPU worker is shutting down", "hint": "later"}})

    client = KilnClient("http://127.0.0.1:9", token="")
    client._http = cli_client._GuardedHttp(base_url=client.url, transport=httpx.MockTransport(answer))
    with pytest.raises(CliError) as err:
        client.post("/v1/chat/completions", json={})
    assert (err.value.code, err.value.retry_after) == ("server_shutting_down", 7.0)


def test_the_command_rides_out_a_lost_worker(workdir, capsys):  # noqa: F811 - the fixture
    FakeClient.server = FlakyServer([_lost(retry_after=0.01)], needle="", seed=43)
    assert cli_main.main(argv(workdir)) == 0
    out = capsys.readouterr()
    assert "wrote 3 groups (12 rollouts)" in out.out
    assert "kiln: task train-" in out.err and ", seed 43: inference_worker_lost; sending it again" in out.err
