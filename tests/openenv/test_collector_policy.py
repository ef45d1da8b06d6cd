"""Kiln's chat route as the behavior policy: the request body and the provenance checks, and `kiln openenv rollout`.

The model server is a test double (tests/rollouts/fakes.fake_response builds answers with the real
provenance builder); the environment is the fake counter server.
"""

import asyncio
import json

import pytest

from openenv.collector import ChatCompletionPolicy, CollectionError, PolicyRequest, Sampling
from tests.openenv.collector_fakes import FakeCounterPolicy
from tests.openenv.fake_server import FakeServer
from tests.rollouts.fakes import fake_response

pytestmark = pytest.mark.timeout(120)

REQUEST = PolicyRequest(messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                        seed=12345, sampling=Sampling(max_tokens=64, temperature=0.7, thinking=True),
                        group_index=0, candidate_index=1, step_index=2)


def answer(body, **kwargs):
    return fake_response({**body, "model": "kiln"}, content='{"delta": 1}', **kwargs)


def test_the_body_and_a_valid_answer():
    seen = []

    async def post(body):
        seen.append(body)
        return answer(body, reasoning="because")

    reply = asyncio.run(ChatCompletionPolicy(post, adapter=None)(REQUEST))
    body = seen[0]
    assert body["seed"] == 12345 and body["n"] == 1 and body["stream"] is False and body["adapter"] == "base"
    assert body["rollout_provenance"] is True and body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body["thinking_budget_tokens"] is None and body["thinking_budget_ms"] is None
    assert body["max_tokens"] == 64 and body["temperature"] == 0.7
    assert reply.content == '{"delta": 1}' and reply.reasoning == "because"
    assert reply.behavior_policy["served_model_id"] == "kiln-tiny" and reply.tokens > 0


@pytest.mark.parametrize(("tamper", "check"), [
    (lambda r: r["choices"][0].update(seed="1"), "seed"),
    (lambda r: r["choices"][0]["message"].update(content='{"delta": 2}'), "content_digest"),
    (lambda r: r["choices"][0]["rollout_provenance"].update(prompt_messages_sha256="sha256:" + "0" * 64), "prompt_digest"),
    (lambda r: r["choices"][0].pop("rollout_provenance"), "response_shape"),
    (lambda r: r["choices"][0]["rollout_provenance"]["sampling"].update(max_tokens=65), "sampling"),
])
def test_responses_that_disagree_with_their_provenance_are_refused(tamper, check):
    async def post(body):
        response = answer(body)
        tamper(response)
        return response

    with pytest.raises(CollectionError) as info:
        asyncio.run(ChatCompletionPolicy(post, adapter=None)(REQUEST))
    assert info.value.code == "openenv_policy_response_invalid" and f": {check}:" in info.value.message


def _fake_model(monkeypatch, content=None):
    """KilnClient.post answers like a Kiln server, stepping the counter toward its target (or with
    `content`, when given)."""
    from kiln_project.cli import client as client_module

    decide = FakeCounterPolicy()

    def post(self, path, json=None, **kwargs):
        assert path == "/v1/chat/completions"
        request = PolicyRequest(messages=json["messages"], seed=json["seed"],
                                sampling=Sampling(json["max_tokens"], json["temperature"], True),
                                group_index=0, candidate_index=0, step_index=0)
        return fake_response({**json, "model": "kiln"}, content=content or decide.answer(request))

    monkeypatch.setattr(client_module.KilnClient, "post", post)


def test_kiln_openenv_rollout_then_verify(tmp_path, monkeypatch, capsys):
    from kiln_project.cli.main import main

    _fake_model(monkeypatch)
    (tmp_path / "task.json").write_text('{"target": 2}')
    out = [str(tmp_path / name) for name in ("r.jsonl", "r.replay.json", "r.summary.json")]
    with FakeServer() as server:
        code = main(["openenv", "rollout", "--environment", server.url, "--groups", "2", "--group-size", "2",
                     "--seed-start", "7", "--max-steps", "3", "--reset-options", str(tmp_path / "task.json"),
                     "--output", out[0], "--replay-output", out[1], "--summary-output", out[2], "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["stats"]["done_count"] + report["stats"]["max_steps_count"] == 4
    assert report["warnings"] == []
    summary = json.loads(open(out[2]).read())
    assert summary["behavior_policy"]["served_model_id"] == "kiln-tiny" and summary["thinking"] is True
    assert main(["openenv", "verify", "--summary", out[2], "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rollouts"] == 4


def test_kiln_openenv_rollout_errors_are_one_line(tmp_path, monkeypatch, capsys):
    from kiln_project.cli.main import main

    _fake_model(monkeypatch)
    with FakeServer() as server:
        code = main(["openenv", "rollout", "--environment", server.url, "--environment", server.url + "/",
                     "--groups", "1", "--output", str(tmp_path / "x.jsonl")])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: openenv_invalid_collection:") and "\n" not in err
    assert not (tmp_path / "x.jsonl").exists()


def test_kiln_openenv_rollout_warns_when_most_actions_break_the_schema(tmp_path, monkeypatch, capsys):
    from kiln_project.cli.main import main

    _fake_model(monkeypatch, content='{"delta": 99}')  # the counter's delta is bounded
    with FakeServer() as server:
        code = main(["openenv", "rollout", "--environment", server.url, "--groups", "2", "--group-size", "2",
                     "--output", str(tmp_path / "r.jsonl"), "--replay-output", str(tmp_path / "r.replay.json"),
                     "--summary-output", str(tmp_path / "r.summary.json")])
    assert code == 0, "the collection is published: the warning explains it, it does not refuse it"
    captured = capsys.readouterr()
    assert "invalid 4," in captured.out
    [warning] = [line for line in captured.err.splitlines() if line.startswith("warning: ")]
    assert warning.startswith("warning: 4 of 4 episodes ended at an action Kiln refused "
                              "(ACTION_SCHEMA_VALIDATION_FAILED 4; e.g. ")
    assert "/delta" in warning and "break the action schema" in warning
