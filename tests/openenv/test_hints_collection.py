"""Collection, replay and `kiln openenv rollout` hints name what to fix: another deployment at a recorded URL
(not a broken server), a bad local setting (not the environment), and an environment that died mid-collection
(how far the collection got, and that no files were written)."""

import pytest

from kiln_project.cli.main import main
from openenv.client.errors import OpenEnvError
from openenv.collector import CollectionError
from openenv.collector.errors import DEFAULT_HINTS
from openenv.collector.policy import PolicyRequest, Sampling
from openenv.replay import replay
from tests.openenv.collector_fakes import FakeCounterPolicy, config_for, run_collection
from tests.openenv.fake_server import FakeServer
from tests.rollouts.fakes import fake_response

pytestmark = pytest.mark.timeout(120)


def test_a_changed_identity_at_replay_says_to_pin_the_deployment(tmp_path):
    with FakeServer() as server:
        config = config_for([server.url], tmp_path, reset_options={"target": 3})
        run_collection(config)
        server.documents["/metadata"]["description"] = "another counter"
        with pytest.raises(CollectionError) as info:
            replay(config.summary_output_path)
    assert info.value.code == "environment_identity_changed"
    assert info.value.hint == DEFAULT_HINTS["environment_identity_changed"]
    assert info.value.hint != OpenEnvError.default_hint  # the server is fine: it is another deployment
    assert info.value.as_failure()["hint"] == DEFAULT_HINTS["environment_identity_changed"]


@pytest.mark.parametrize("overrides", [{"temperature": float("nan")}, {"temperature": 5.0},
                                       {"capacity_wait_seconds": 0}, {"groups": 1, "urls": 2}])
def test_a_bad_collection_setting_is_not_blamed_on_the_environment(tmp_path, overrides):
    urls = ["http://127.0.0.1:1"] * overrides.pop("urls", 1)
    with pytest.raises(CollectionError) as info:
        config_for(urls, tmp_path, **overrides).check()
    assert info.value.code == "openenv_invalid_collection"
    assert info.value.hint != OpenEnvError.default_hint and "environment" not in info.value.hint
    assert "collection setting" in info.value.hint and "--capacity-wait-seconds" in info.value.hint


@pytest.mark.parametrize("option", ["--temperature", "--protocol-error-reward", "--capacity-wait-seconds"])
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_rollout_refuses_a_non_finite_number_at_parsing(tmp_path, capsys, option, value):
    with FakeServer() as server:
        with pytest.raises(SystemExit) as info:
            main(["openenv", "rollout", server.url, f"{option}={value}", "--output", str(tmp_path / "o.jsonl")])
        assert server.request_headers == []
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: usage_error: ") and f"argument {option}: expected a finite number" in err
    assert "OpenEnv server" not in err


def _dying_model(monkeypatch, server, *, stop_at_episode: int):
    """KilnClient.post answers like a Kiln server and stops the environment server when episode
    `stop_at_episode` (1-based; episodes run one at a time) asks for its first action."""
    from kiln_project.cli import client as client_module

    decide = FakeCounterPolicy()
    first_turns = []

    def post(self, path, json=None, **kwargs):
        if len(json["messages"]) <= 2:  # system prompt and the reset observation: an episode's first turn
            first_turns.append(1)
            if len(first_turns) == stop_at_episode:
                server.run(server._stop())  # the environment dies: its sockets close, new connections fail
        request = PolicyRequest(messages=json["messages"], seed=json["seed"],
                                sampling=Sampling(json["max_tokens"], json["temperature"], True),
                                group_index=0, candidate_index=0, step_index=0)
        return fake_response({**json, "model": "kiln"}, content=decide.answer(request))

    monkeypatch.setattr(client_module.KilnClient, "post", post)


def test_an_environment_dying_mid_rollout_says_the_collection_wasinterrupted_error(tmp_path, monkeypatch, capsys):
    out = [tmp_path / name for name in ("r.jsonl", "r.replay.json", "r.summary.json")]
    with FakeServer() as server:
        _dying_model(monkeypatch, server, stop_at_episode=3)
        code = main(["openenv", "rollout", server.url, "--groups", "2", "--group-size", "2", "--concurrency", "1",
                     "--max-steps", "3", "--output", str(out[0]), "--replay-output", str(out[1]),
                     "--summary-output", str(out[2])])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: openenv_")
    assert "the collection was interrupted after 2 of 4 episodes (1 of 2 groups complete)" in err
    assert "no files were written" in err and "then run kiln openenv rollout again" in err
    assert not any(path.exists() for path in out)


def test_a_failure_before_any_episode_is_not_called_an_interruption(tmp_path, capsys):
    with FakeServer(health_status=503) as server:
        code = main(["openenv", "rollout", server.url, "--output", str(tmp_path / "o.jsonl")])
    assert code == 1
    err = capsys.readouterr().err.strip()
    # the environment is named: with several URLs, the one that failed (QA)
    assert err.startswith(f"error: openenv_unavailable: environment {server.url.rstrip('/')}: GET /health answered "
                          "HTTP 503")
    assert "interrupted" not in err


def test_a_failed_final_check_says_every_episode_ran_and_nothing_was_written():
    from kiln_project.cli.openenv_interrupted import CollectionTally, interrupted_error

    tally = CollectionTally(2, 2)
    for number, label in enumerate(["group 0 candidate 0", "group 1 candidate 0", "group 0 candidate 1",
                                    "group 1 candidate 1"], start=1):
        tally(number, 4, label)
    assert (tally.episodes, tally.complete_groups) == (4, 2)
    exc = CollectionError("openenv_unavailable", "GET /health failed: ConnectError", stage="identity_verification",
                          failure_code="environment_unavailable", retryable=True)
    error = interrupted_error(exc, tally)
    assert error.message == ("GET /health failed: ConnectError; the final check of the environment failed after "
                             "all 4 episodes; no files were written")
    changed = CollectionError("environment_identity_changed", "x changed during the collection (a); nothing was "
                              "published", stage="identity_verification", hint="collect again")
    assert interrupted_error(changed, tally).message == changed.message  # it already says so


def test_with_several_environments_the_error_names_the_one_that_died(tmp_path, monkeypatch, capsys):
    """QA: with three URLs and one killed, the failure said `GET /health failed: ConnectError` and no URL."""
    out = tmp_path / "r.jsonl"
    with FakeServer() as alive, FakeServer() as dying:
        _dying_model(monkeypatch, dying, stop_at_episode=3)  # group 1 runs on the second URL
        code = main(["openenv", "rollout", "--environment", alive.url, "--environment", dying.url, "--groups", "2", "--group-size", "2",
                     "--concurrency", "1", "--max-steps", "3", "--output", str(out)])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert f"environment {dying.url.rstrip('/')}: " in err and alive.url.rstrip("/") not in err, err
    assert not out.exists()


def test_the_reply_timeout_is_the_rollouts_to_set(tmp_path, capsys):
    """QA: a reset slower than 60 s could not be waited for; --reply-timeout-seconds sets the wait."""

    async def never_answers(server, ws):
        while await server.recv(ws) is not None:
            pass

    with FakeServer(ws_handler=never_answers) as server:
        code = main(["openenv", "rollout", server.url, "--groups", "1", "--group-size", "1",
                     "--reply-timeout-seconds", "1", "--output", str(tmp_path / "o.jsonl")])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert "openenv_timeout" in err and "reset got no reply within 1 s" in err, err
    assert "--reply-timeout-seconds" in err  # the hint says how to allow longer
