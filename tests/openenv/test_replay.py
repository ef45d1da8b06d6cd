"""Live replay: verify, then the recorded transcript again; `matched`, or the first divergence."""

import json

import pytest

from openenv.collector import CollectionError
from openenv.replay import replay
from openenv.verify import VerificationError
from tests.openenv.collector_fakes import config_for, run_collection
from tests.openenv.fake_server import CounterEnv, FakeServer

pytestmark = pytest.mark.timeout(120)


class ChangedRewards(CounterEnv):
    def step(self, data):
        reply = super().step(data)
        if reply["type"] == "observation" and self.step_count == 2:
            reply["data"]["reward"] = 0.5
        return reply


class ChangedReset(CounterEnv):
    def reset(self, data):
        return super().reset({**data, "target": 4})


def collected(server, tmp_path, **overrides):
    config = config_for([server.url], tmp_path, reset_options={"target": 5}, **overrides)
    run_collection(config)
    return config


def test_replay_against_the_same_server_matches(tmp_path):
    with FakeServer() as server:
        config = collected(server, tmp_path)
        before = len(server.received)
        report = replay(config.summary_output_path)
        frames = server.received[before:]
    assert report["outcome"] == "matched" and report["schema"] == "kiln.openenv-replay-run.v1"
    assert report["rollouts"] == 4 and report["groups"] == 2
    replayed = json.loads(config.replay_output_path.read_text())
    sent = [e["action"] for g in replayed["groups"] for c in g["candidates"] for e in c["exchanges"]]
    assert sorted(map(json.dumps, (f["data"] for f in frames if f["type"] == "step"))) == sorted(map(json.dumps, sent))
    assert report["environment_exchanges"] == len(sent)


def test_changed_dynamics_name_the_first_divergence(tmp_path):
    with FakeServer() as server:
        config = collected(server, tmp_path)
        server.env_factory = ChangedRewards
        report = replay(config.summary_output_path, concurrency=1)
    assert report["outcome"] == "diverged"
    divergence = report["divergence"]
    assert (divergence["group_index"], divergence["candidate_index"], divergence["step_index"]) == (0, 0, 1)
    assert divergence["field"] == "result.observation.reward" and divergence["actual"] == 0.5


def test_a_changed_reset_diverges_at_the_reset(tmp_path):
    with FakeServer() as server:
        config = collected(server, tmp_path)
        server.env_factory = ChangedReset
        report = replay(config.summary_output_path)
    divergence = report["divergence"]
    assert divergence["step_index"] is None and divergence["field"] == "reset_observation.observation.target"


def test_a_changed_identity_refuses_to_replay(tmp_path):
    with FakeServer() as server:
        config = collected(server, tmp_path)
        server.documents["/metadata"]["description"] = "another counter"
        with pytest.raises(CollectionError) as info:
            replay(config.summary_output_path)
    assert info.value.code == "environment_identity_changed"


def test_replay_verifies_first(tmp_path):
    with FakeServer() as server:
        config = collected(server, tmp_path)
        config.output_path.write_bytes(config.output_path.read_bytes() + b"\n")
        before = len(server.received)
        with pytest.raises(VerificationError):
            replay(config.summary_output_path)
        assert len(server.received) == before


def test_kiln_openenv_replay_cli(tmp_path, capsys):
    from kiln_project.cli.main import main

    with FakeServer() as server:
        config = collected(server, tmp_path)
        assert main(["openenv", "replay", "--summary", str(config.summary_output_path)]) == 0
        assert capsys.readouterr().out.startswith("matched: 4 rollouts")
        server.env_factory = ChangedRewards
        assert main(["openenv", "replay", str(config.summary_output_path), "--concurrency", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: openenv_replay_diverged: group 0 candidate 0 step 1: result.observation.reward")
