"""Collections through real openenv==0.10.0 servers that misbehave the way real deployments do.

Each server runs in its own virtual environment as a separate process (tests/openenv/real_server.py
says how, and when these skip), with the deterministic fake policy (not a model):
- a capacity of one session and a 2-candidate group at concurrency 2: the second candidate is
  refused with CAPACITY_REACHED, retried on fresh sessions, counted in the summary, and every
  episode completes;
- an environment whose step raises mid-episode (tests/openenv/interop_env/kiln_flaky_env.py): a
  recoverable EXECUTION_ERROR, fed back on the same socket, and the collection completes;
- an environment redeployed with a different action schema while the collection runs:
  revalidation fails with `environment_identity_changed` and nothing is published.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from core.contracts.groups import admit_jsonl
from openenv.collector import CollectionError, collect_and_publish
from openenv.verify import verify
from tests.openenv.collector_fakes import FakeCounterPolicy, config_for, run_collection
from tests.openenv.real_server import TEST_ENVS, RealServer, free_port, openenv_python

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]

FLAKY_SOURCE = TEST_ENVS / "kiln_flaky_env.py"


@pytest.fixture(scope="module")
def python():
    return openenv_python()


def candidates(bundle):
    return [c for g in json.loads(bundle.replay)["groups"] for c in g["candidates"]]


class SlowFirstThought(FakeCounterPolicy):
    """Candidate 0 thinks for a second before its first move, holding the only slot while candidate 1 connects."""

    async def __call__(self, request):
        if request.candidate_index == 0 and request.step_index == 0:
            await asyncio.sleep(1.0)
        return await super().__call__(request)


def test_a_capacity_of_one_is_retried_counted_and_every_episode_completes(python, tmp_path):
    with RealServer(python, tmp_path / "server", max_sessions=1) as server:
        config = config_for([server.url], tmp_path, groups=1, group_size=2, concurrency=2, max_steps=6,
                            capacity_wait_seconds=120, reset_options={"target": 3})
        bundle = run_collection(config, SlowFirstThought())
    stats = bundle.summary_value["stats"]
    assert stats["capacity_retry_count"] >= 1  # the second candidate waited for the only slot
    assert stats["done_count"] == 2  # and both episodes reached the target
    rollouts = bundle.summary_value["rollouts"]
    assert sum(r["capacity_retries"] for r in rollouts) == stats["capacity_retry_count"]
    assert all(c["termination"] == "done" for c in candidates(bundle))
    # retries never became observations: each candidate saw exactly one reset, the same one
    replay = json.loads(bundle.replay)
    assert replay["groups"][0]["reset_observation"]["observation"]["target"] == 3
    assert admit_jsonl(config.output_path.read_bytes()).rollouts == 2
    assert verify(config.summary_output_path).report["rollouts"] == 2


def test_a_step_that_raises_mid_episode_is_feedback_on_the_same_socket(python, tmp_path):
    with RealServer(python, tmp_path / "server", module_source=FLAKY_SOURCE, max_sessions=4) as server:
        config = config_for([server.url], tmp_path, groups=2, group_size=2, concurrency=2, max_steps=8,
                            reset_options={"target": 4})
        bundle = run_collection(config, FakeCounterPolicy())
    stats = bundle.summary_value["stats"]
    assert stats["done_count"] == 4 and stats["recoverable_protocol_error_count"] == 4
    for candidate in candidates(bundle):
        exchanges = candidate["exchanges"]
        kinds = [e["result"]["kind"] for e in exchanges]
        assert kinds[0] == "observation" and kinds[1] == "protocol_error"  # the second move raised
        fault = exchanges[1]["result"]
        assert fault["continued"] is True and fault["error"]["code"] == "EXECUTION_ERROR"
        assert "hiccupped" in fault["error"]["message"]
        assert all(k == "observation" for k in kinds[2:]) and candidate["termination"] == "done"
        assert candidate["capacity_retries"] == 0 and candidate["recoverable_protocol_errors"] == 1
        # the same episode went on: the environment's own state counts only the moves that succeeded
        state = candidate["final_state"]
        assert state["value"] == state["target"] == 4 and state["step_count"] == len(exchanges) - 1
        assert state["episode_id"].startswith("kiln-seed-")  # the id Kiln named in the reset
    trajectory = json.loads(config.output_path.read_text().splitlines()[0])["completions"][0]["trajectory"]
    feedback = [s for s in trajectory if s["kind"] == "observation" and s["content"].startswith('{"openenv_error"')]
    assert len(feedback) == 1 and json.loads(feedback[0]["content"])["recoverable"] is True
    assert verify(config.summary_output_path).report["rollouts"] == 4


def test_an_action_schema_changed_mid_run_fails_revalidation_and_publishes_nothing(python, tmp_path):
    port = free_port()
    servers = [RealServer(python, tmp_path / "server", port=port, max_delta=3).start()]

    def redeploy_after_the_last_episode(finished, total, where):
        if finished == total:  # every socket is closed; discovery runs again next
            servers[0].stop()
            servers.append(RealServer(python, tmp_path / "server", port=port, max_delta=2).start())

    try:
        config = config_for([f"http://127.0.0.1:{port}"], tmp_path, groups=2, group_size=2, max_steps=6,
                            reset_options={"target": 2})
        for path in (config.output_path, config.replay_output_path, config.summary_output_path):
            path.write_bytes(b"before")
        with pytest.raises(CollectionError) as info:
            asyncio.run(collect_and_publish(config, FakeCounterPolicy(), on_progress=redeploy_after_the_last_episode))
    finally:
        for server in servers:
            server.stop()
    assert len(servers) == 2  # the redeploy happened, after all four episodes
    error = info.value
    assert error.code == "environment_identity_changed" and error.stage == "identity_verification"
    assert "action_schema_sha256" in error.message and "nothing was published" in error.message
    for path in (config.output_path, config.replay_output_path, config.summary_output_path):
        assert path.read_bytes() == b"before"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == sorted(
        p.name for p in (config.output_path, config.replay_output_path, config.summary_output_path))


def test_a_stalled_server_is_a_retryable_timeout_not_a_protocol_error(python, tmp_path):
    # SIGSTOP of the environment mid-episode: our keepalive ping gets no pong and websockets closes
    # the socket itself (1011). That used to read "the server closed the socket (close code None)",
    # environment_protocol_error, not retryable.
    import os
    import signal

    from openenv.client.errors import OpenEnvTimeout
    from openenv.client.session import open_session

    async def stalled_step(server):
        session = await open_session(server.url, ping_interval=1.0, request_timeout=30)
        try:
            await session.reset({"seed": 1})
            os.kill(server.process.pid, signal.SIGSTOP)
            with pytest.raises(OpenEnvTimeout) as caught:
                await session.step({"delta": 1})
            return caught.value
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
            await session.close()

    with RealServer(python, tmp_path / "server") as server:
        error = asyncio.run(stalled_step(server))
    assert error.code == "openenv_timeout" and error.failure_code == "environment_unavailable" and error.retryable
    assert "stopped answering" in str(error.message)
