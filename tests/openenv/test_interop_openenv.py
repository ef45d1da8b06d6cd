"""Interop with a real OpenEnv server from PyPI (openenv==0.10.0), run as a separate process.

The environment (examples/openenv-counter/counter_env.py) is a multi-step counter with step
rewards and an `input_text` observation; a move of 0 raises inside the environment (a recoverable
EXECUTION_ERROR). A second server has a capacity of one session; two more show that a changed
action schema changes the identity. See tests/openenv/real_server.py for how the server's own
virtual environment is made (and when these tests skip).
"""

from __future__ import annotations

import asyncio
import json

import pytest

from openenv.client import errors
from openenv.client.actions import episode_return, parse_and_validate_action
from openenv.client.discovery import identity_differences, inspect
from openenv.client.session import ErrorFrame, Observation, open_episode, open_session
from openenv.client.tasks import task_catalog
from tests.openenv.real_server import RealServer, free_port, openenv_python

pytestmark = [pytest.mark.integration, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def python():
    return openenv_python()


@pytest.fixture(scope="module")
def counter(python, tmp_path_factory):
    server = RealServer(python, tmp_path_factory.mktemp("openenv-counter"), max_sessions=4)
    with server:
        yield server
    print(server.log_tail())


@pytest.fixture(scope="module")
def single_slot(python, tmp_path_factory):
    server = RealServer(python, tmp_path_factory.mktemp("openenv-single"), max_sessions=1)
    with server:
        yield server


def run(coro):
    return asyncio.run(coro)


def test_inspection_of_a_real_server(counter):
    first = run(inspect(counter.url))
    second = run(inspect(counter.url))
    identity = first.identity
    assert identity["metadata"]["name"] == "kiln_counter" and identity["metadata"]["version"] == "0.1.0"
    assert identity["environments"] == ["kiln_counter"]
    assert identity["openapi_version"] == "1.0.0"
    assert identity["websocket_url"] == counter.url.replace("http://", "ws://") + "/ws"
    assert identity_differences(first, second) == []  # the identity is stable
    # 0.10 serves the reset_observation extension: it counts in discovery, not in the typed schema
    assert "reset_observation" in first.documents.schema_document
    assert set(first.schema) == {"action", "observation", "state"}
    schema = first.action_schema
    assert parse_and_validate_action('```json\n{"delta": 2}\n```', schema) == {"delta": 2}
    for text, keyword in (('{"delta": 9}', "maximum"), ('{"delta": 1, "x": 1}', "additionalProperties"),
                          ("{}", "required")):
        with pytest.raises(errors.ActionError) as info:
            parse_and_validate_action(text, schema)
        assert info.value.code == "ACTION_SCHEMA_VALIDATION_FAILED"
        assert info.value.errors[0]["keyword"] == keyword


def test_a_multi_step_episode_with_step_rewards(counter):
    async def episode():
        start = await open_episode(counter.url, {"seed": 17, "target": 4})
        session = start.session
        results = [await session.step({"delta": 3}), await session.step({"delta": 1})]
        state = await session.state()
        await session.close()
        return start, results, state

    start, results, state = run(episode())
    assert start.capacity_retries == 0
    reset = start.observation
    assert reset.reward is None and reset.done is False
    assert reset.observation["input_text"] == "The counter is 0. Reach 4 with moves of at most 3."
    assert [r.reward for r in results] == [3.0, 1.0]
    assert [r.done for r in results] == [False, True]
    assert episode_return(r.reward for r in results) == 4.0
    assert state == {"episode_id": "seed-17", "step_count": 2, "value": 4, "target": 4, "total_reward": 4.0}
    json.dumps([r.to_json() for r in results])


def test_recoverable_errors_are_feedback_on_the_same_socket(counter):
    async def episode():
        start = await open_episode(counter.url, {"seed": 3, "target": -2})
        session = start.session
        raised = await session.step({"delta": 0})        # the environment raises
        invalid = await session.step({"delta": 9})       # the server's own validation
        moves = [await session.step({"delta": -2})]
        await session.close()
        return raised, invalid, moves

    raised, invalid, moves = run(episode())
    assert isinstance(raised, ErrorFrame) and raised.code == "EXECUTION_ERROR"
    assert raised.message == "a move of 0 changes nothing" and raised.recoverable
    assert isinstance(invalid, ErrorFrame) and invalid.code == "VALIDATION_ERROR"
    assert invalid.errors[0]["loc"] == ["delta"]
    assert isinstance(moves[0], Observation) and moves[0].done and moves[0].reward == 2.0


def test_keep_alive_while_the_model_thinks(counter):
    async def episode():
        start = await open_episode(counter.url, {"seed": 1, "target": 1})
        session = start.session
        answer = await session.keep_alive_while(asyncio.sleep(0.8, result='{"delta": 1}'), interval_s=0.2)
        result = await session.step(json.loads(answer))
        await session.close()
        return session, result

    session, result = run(episode())
    assert session.keepalive_exchanges >= 2
    assert result.done and result.reward == 1.0


def test_the_task_api_is_unsupported_and_says_so(counter):
    catalog = run(task_catalog(counter.url, split="train"))
    assert catalog["task_api"] == "unsupported" and catalog["environment_name"] == "kiln_counter"


def test_a_capacity_of_one_session_is_retried_and_the_episode_completes(single_slot):
    async def go():
        holder = await open_session(single_slot.url)
        await holder.reset({"seed": 1})

        async def release():
            await asyncio.sleep(0.8)
            await holder.close()

        releasing = asyncio.create_task(release())
        start = await open_episode(single_slot.url, {"seed": 5, "target": 2}, capacity_wait_seconds=30)
        await releasing
        result = await start.session.step({"delta": 2})
        await start.session.close()
        return start, result

    start, result = run(go())
    assert start.capacity_retries >= 1
    assert start.observation.observation["target"] == 2
    assert result.done and result.reward == 2.0


def test_capacity_that_never_frees_is_exhausted(single_slot):
    async def go():
        holder = await open_session(single_slot.url)
        await holder.reset({"seed": 1})
        try:
            with pytest.raises(errors.OpenEnvCapacityExhausted) as info:
                await open_episode(single_slot.url, {"seed": 2}, capacity_wait_seconds=1)
            return info.value
        finally:
            await holder.close()

    error = run(go())
    assert error.retries >= 2 and error.failure_code == "environment_capacity_exhausted"


def test_a_changed_action_schema_changes_the_identity(python, tmp_path):
    port = free_port()
    with RealServer(python, tmp_path, port=port, max_delta=3) as server:
        before = run(inspect(server.url))
    with RealServer(python, tmp_path, port=port, max_delta=2) as server:
        after = run(inspect(server.url))
    assert set(identity_differences(before, after)) == {
        "action_schema_sha256", "discovery_sha256", "schema_sha256", "schema.action"}


def test_kiln_openenv_inspect_against_the_real_server(counter, capsys):
    from kiln_project.cli.main import main

    assert main(["openenv", "inspect", "--environment", counter.url, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["environments"][0]["identity"]["metadata"]["name"] == "kiln_counter"
