"""Collection, verify and replay through a real openenv==0.10.0 server (its own venv, a separate process).

2 groups x 2 candidates with the deterministic fake policy (not a model) reading the environment's
`input_text` observations; see tests/openenv/real_server.py for when this skips.
"""

import json

import pytest

from core.contracts.groups import admit_jsonl
from openenv.replay import replay
from openenv.verify import verify
from tests.openenv.collector_fakes import FakeCounterPolicy, config_for, run_collection
from tests.openenv.real_server import TEST_ENVS, RealServer, openenv_python

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


def test_collect_verify_and_replay_against_a_real_server(tmp_path):
    with RealServer(openenv_python(), tmp_path / "server", max_sessions=4) as server:
        config = config_for([server.url], tmp_path, groups=2, group_size=2, max_steps=4,
                            reset_options={"target": 4})
        policy = FakeCounterPolicy()
        bundle = run_collection(config, policy)
        assert admit_jsonl(config.output_path.read_bytes()).rollouts == 4
        group = json.loads(config.output_path.read_text().splitlines()[0])
        assert group["messages"][1]["content"] == "The counter is 0. Reach 4 with moves of at most 3."
        assert bundle.summary_value["stats"]["done_count"] == 4
        assert verify(config.summary_output_path).report["rollouts"] == 4
        report = replay(config.summary_output_path)
    assert report["outcome"] == "matched" and report["environment_exchanges"] > 0


def test_a_server_that_draws_random_episode_ids_collects_and_replays(tmp_path):
    """OpenEnv's servers give an episode that a reset does not name a random id and may echo it in
    every observation: Kiln names one per seed, so a group's candidates start alike and the replay's
    reset, observations and final state match the collection's."""
    source = TEST_ENVS / "kiln_random_id_env.py"
    with RealServer(openenv_python(), tmp_path / "server", max_sessions=4, module_source=source) as server:
        config = config_for([server.url], tmp_path, groups=2, group_size=2, max_steps=4,
                            reset_options={"target": 4})
        run_collection(config, FakeCounterPolicy())
        replay_file = json.loads(config.replay_output_path.read_text())
        [first, second] = replay_file["groups"]
        assert first["reset_observation"]["metadata"]["episode_id"] == f"kiln-seed-{first['seed']}"
        assert second["reset_payload"]["episode_id"] == f"kiln-seed-{second['seed']}"
        assert verify(config.summary_output_path).report["rollouts"] == 4
        report = replay(config.summary_output_path)
    assert report["outcome"] == "matched" and report["environment_exchanges"] > 0
