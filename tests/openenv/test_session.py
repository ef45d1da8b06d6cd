"""Lock-step sessions against a well-behaved fake server speaking the captured openenv 0.10 frames."""

import asyncio

import pytest

from openenv.client import errors
from openenv.client.actions import parse_and_validate_action
from openenv.client.credentials import credential_from_env
from openenv.client.discovery import inspect
from openenv.client.session import ErrorFrame, Observation, open_episode, open_session
from tests.openenv.fake_server import CounterEnv, FakeServer, dumps

RESET = {"seed": 7, "episode_id": "ep-1", "target": 4, "max_steps": 5}


def run(coro):
    return asyncio.run(coro)


def test_reset_step_state_done_close_frames_exactly():
    async def episode(url):
        start = await open_episode(url, RESET)
        session = start.session
        assert start.capacity_retries == 0
        results = [start.observation]
        for delta in (3, -1):
            results.append(await session.step({"delta": delta}))
        state = await session.state()
        results.append(await session.step({"delta": 2}))
        final = await session.state()
        await session.close()
        return results, state, final, session

    with FakeServer() as server:
        results, state, final, session = run(episode(server.url))
        assert server.settle().received == [
            {"type": "reset", "data": RESET},
            {"type": "step", "data": {"delta": 3}}, {"type": "step", "data": {"delta": -1}},
            {"type": "state"}, {"type": "step", "data": {"delta": 2}}, {"type": "state"},
            {"type": "close"},
        ]
        assert server.sessions == 1
    assert all(isinstance(r, Observation) for r in results)
    assert [r.reward for r in results] == [None, 2.9, -1.1, 11.9]
    assert [r.done for r in results] == [False, False, False, True]
    assert results[0].to_json() == {
        "observation": {"metadata": {"episode_id": "ep-1", "step": 0}, "value": 0, "target": 4, "steps_left": 5,
                        "message": "reset: move the counter to the target"},
        "reward": None, "done": False, "metadata": {"episode_id": "ep-1", "step": 0}}
    assert state == {"episode_id": "ep-1", "step_count": 2, "value": 2, "target": 4, "max_steps": 5,
                     "total_reward": 1.8}
    assert final["value"] == 4 and final["step_count"] == 3
    assert session.exchanges == 6 and not session.usable and session.poisoned is None


def test_a_closed_session_refuses_requests():
    async def go(url):
        session = await open_session(url)
        await session.reset({"seed": 1})
        await session.close()
        await session.close()  # idempotent
        with pytest.raises(errors.OpenEnvSessionClosed):
            await session.step({"delta": 1})

    with FakeServer() as server:
        run(go(server.url))
        assert [f["type"] for f in server.settle().received] == ["reset", "close"]


def test_observation_without_metadata_keeps_its_absence():
    async def handler(server, ws):
        await server.recv(ws)
        await ws.send('{"type":"observation","data":{"observation":{"value":3},"reward":2.9,"done":false}}')
        await ws.wait_closed()

    async def go(url):
        start = await open_episode(url, {})
        await start.session.close()
        return start.observation

    with FakeServer(ws_handler=handler) as server:
        observation = run(go(server.url))
    assert observation.to_json() == {"observation": {"value": 3}, "reward": 2.9, "done": False}


def test_recoverable_errors_are_same_socket_feedback():
    async def go(url):
        start = await open_episode(url, RESET)
        session = start.session
        invalid = await session.step({"delta": 9})
        extra = await session.step({"delta": 1, "bogus": True})
        ok = await session.step({"delta": 3})
        await session.close()
        return invalid, extra, ok

    with FakeServer() as server:
        invalid, extra, ok = run(go(server.url))
        assert server.sessions == 1
        assert [f.get("data") for f in server.settle().received if f["type"] == "step"] == [
            {"delta": 9}, {"delta": 1, "bogus": True}, {"delta": 3}]  # each sent once, none resent
    assert isinstance(invalid, ErrorFrame) and invalid.code == "VALIDATION_ERROR" and invalid.recoverable
    assert invalid.errors[0]["loc"] == ["delta"]
    assert invalid.to_json()["code"] == "VALIDATION_ERROR"
    assert isinstance(extra, ErrorFrame) and extra.errors[0]["type"] == "extra_forbidden"
    assert isinstance(ok, Observation) and ok.observation["value"] == 3


def test_execution_error_after_done_is_feedback_too():
    async def go(url):
        session = await open_session(url)
        before = await session.step({"delta": 1})  # nothing enforces reset first; the counter refuses
        await session.reset(RESET)
        for delta in (3, 1):
            await session.step({"delta": delta})
        after = await session.step({"delta": 1})
        await session.close()
        return before, after

    with FakeServer() as server:
        before, after = run(go(server.url))
    assert (before.code, before.message) == ("EXECUTION_ERROR", "call reset before step")
    assert (after.code, after.message) == ("EXECUTION_ERROR", "episode is over; send reset")


def test_a_recoverable_error_on_reset_or_state_raises_but_keeps_the_socket():
    async def handler(server, ws):
        env = CounterEnv()
        while (frame := await server.recv(ws)) is not None:
            if frame["type"] == "reset" and frame["data"].get("index") == 5:
                await ws.send(dumps({"type": "error", "data": {"message": "list index out of range",
                                                               "code": "EXECUTION_ERROR"}}))
            elif frame["type"] == "reset":
                await ws.send(dumps(env.reset(frame["data"])))
            elif frame["type"] == "close":
                return

    async def go(url):
        session = await open_session(url)
        with pytest.raises(errors.OpenEnvProtocolError) as info:
            await session.reset({"split": "test", "index": 5})
        assert info.value.protocol_code == "EXECUTION_ERROR" and not info.value.terminal
        assert session.usable
        observation = await session.reset({"seed": 3})
        await session.close()
        return observation

    with FakeServer(ws_handler=handler) as server:
        assert run(go(server.url)).done is False


def test_a_terminal_error_ends_the_session():
    async def handler(server, ws):
        env = CounterEnv()
        frame = await server.recv(ws)
        await ws.send(dumps(env.reset(frame["data"])))
        await server.recv(ws)
        await ws.send(dumps({"type": "error", "data": {"message": "'list' object has no attribute 'get'",
                                                       "code": "SESSION_ERROR"}}))
        await ws.close(1000)

    async def go(url):
        start = await open_episode(url, RESET)
        with pytest.raises(errors.OpenEnvProtocolError) as info:
            await start.session.step({"delta": 1})
        assert info.value.terminal and info.value.protocol_code == "SESSION_ERROR"
        assert info.value.code == "openenv_protocol_error"
        assert not start.session.usable and start.session.poisoned is None
        with pytest.raises(errors.OpenEnvError):
            await start.session.state()

    with FakeServer(ws_handler=handler) as server:
        run(go(server.url))


def test_reset_with_done_true_is_an_error():
    async def handler(server, ws):
        await server.recv(ws)
        await ws.send('{"type":"observation","data":{"observation":{},"reward":null,"done":true}}')
        await ws.wait_closed()

    with FakeServer(ws_handler=handler) as server, pytest.raises(errors.OpenEnvResetDone):
        run(open_episode(server.url, {}))


def test_capacity_retries_on_fresh_sessions_until_a_slot_frees():
    async def go(url):
        holder = await open_session(url)
        await holder.reset({"seed": 1})

        async def release():
            await asyncio.sleep(0.6)
            await holder.close()

        releasing = asyncio.create_task(release())
        start = await open_episode(url, RESET, capacity_wait_seconds=10)
        await releasing
        observation = await start.session.step({"delta": 3})
        await start.session.close()
        return start, observation

    with FakeServer(max_sessions=1) as server:
        start, observation = run(go(server.url))
        assert server.refused == start.capacity_retries >= 1
        resets = [f for f in server.settle().received if f["type"] == "reset"]
        assert resets[-1] == {"type": "reset", "data": RESET}
    assert start.observation.observation["target"] == 4  # retries never become observations
    assert observation.reward == 2.9


def test_capacity_back_off_is_bounded_and_gives_up_after_the_wait():
    now = [0.0]
    sleeps = []

    async def fake_sleep(seconds):
        sleeps.append(seconds)
        now[0] += seconds

    async def go(url):
        holder = await open_session(url)
        try:
            await holder.reset({"seed": 1})
            with pytest.raises(errors.OpenEnvCapacityExhausted) as info:
                await open_episode(url, RESET, capacity_wait_seconds=5, sleep=fake_sleep, clock=lambda: now[0])
            return info.value
        finally:
            await holder.close()

    with FakeServer(max_sessions=1) as server:
        error = run(go(server.url))
        assert server.refused == error.retries
    assert sleeps == [0.25, 0.5, 0.75, 1.0, 1.25, 1.25]  # 250 ms x retries, capped by the time left
    assert error.retries == 6 and error.failure_code == "environment_capacity_exhausted" and error.retryable
    assert error.protocol_code == "CAPACITY_REACHED"
    assert max(min(0.25 * n, 2.0) for n in range(1, 20)) == 2.0


def test_keep_alive_pumps_state_and_answers_pings_while_the_model_thinks():
    async def handler(server, ws):
        env = CounterEnv()
        pinger = None
        while (frame := await server.recv(ws)) is not None:
            if frame["type"] == "reset":
                await ws.send(dumps(env.reset(frame["data"])))

                async def ping():
                    await asyncio.sleep(0.1)
                    waiter = await ws.ping(b"kiln?")
                    await asyncio.wait_for(waiter, 5)
                    server.pongs += 1
                    await ws.pong(b"unsolicited pong")  # absorbed by the client

                pinger = asyncio.create_task(ping())
            elif frame["type"] == "state":
                await ws.send(dumps(env.state()))
            elif frame["type"] == "step":
                await ws.send(dumps(env.step(frame["data"])))
            elif frame["type"] == "close":
                await pinger
                return

    async def think():
        await asyncio.sleep(0.9)
        return '{"delta": 3}'

    async def go(url):
        start = await open_episode(url, RESET)
        session = start.session
        content = await session.keep_alive_while(think(), interval_s=0.2)
        observation = await session.step({"delta": 3} if content else {})
        await session.close()
        return session, observation

    with FakeServer(ws_handler=handler) as server:
        session, observation = run(go(server.url))
        assert server.pongs == 1
        states = [f for f in server.settle().received if f["type"] == "state"]
        assert len(states) == session.keepalive_exchanges >= 2
    assert observation.reward == 2.9


def test_an_action_that_misses_the_schema_never_reaches_the_server():
    async def go(url):
        inspection = await inspect(url)
        start = await open_episode(url, RESET)
        with pytest.raises(errors.ActionError) as info:
            parse_and_validate_action('{"delta": 7}', inspection.action_schema)
        assert info.value.code == "ACTION_SCHEMA_VALIDATION_FAILED"
        await start.session.close()

    with FakeServer() as server:
        run(go(server.url))
        assert [f["type"] for f in server.settle().received] == ["reset", "close"]


def test_the_credential_goes_on_health_and_the_upgrade():
    async def go(url, credential):
        start = await open_episode(url, RESET, credential=credential)
        await start.session.step({"delta": 3})
        await start.session.close()

    with FakeServer() as server:
        credential = credential_from_env(server.url, "KILN_T", environ={"KILN_T": "tok-123"})
        run(go(server.url, credential))
        assert server.request_headers == [("/health", "Bearer tok-123"), ("/ws", "Bearer tok-123")]


def test_health_is_checked_before_every_upgrade():
    with FakeServer(health_status=503) as server:
        with pytest.raises(errors.OpenEnvUnavailable):
            run(open_episode(server.url, RESET))
        assert [p for p, _ in server.request_headers] == ["/health"]


@pytest.mark.parametrize("status, expected", [(403, errors.OpenEnvUnauthorized), (404, errors.OpenEnvUpgradeFailed),
                                              (302, errors.OpenEnvRedirectRefused), (503, errors.OpenEnvUnavailable)])
def test_an_upgrade_refused_by_the_server_is_typed(status, expected):
    with FakeServer(upgrade_status=status) as server:
        with pytest.raises(expected) as info:
            run(open_session(server.url))
        assert info.value.http_status == status


def test_a_factory_error_at_connect_surfaces_from_the_reset():
    async def handler(server, ws):
        await ws.send(dumps({"type": "error", "data": {
            "message": "Environment factory 'Broken' failed to create instance.", "code": "FACTORY_ERROR",
            "factory_name": "Broken"}}))
        await ws.close(1000)

    async def go(url):
        session = await open_session(url)
        await asyncio.sleep(0.1)
        with pytest.raises(errors.OpenEnvProtocolError) as info:
            await session.reset(RESET)
        return info.value

    with FakeServer(ws_handler=handler) as server:
        error = run(go(server.url))
    assert error.protocol_code == "FACTORY_ERROR" and error.terminal and error.frame.factory_name == "Broken"
    assert not isinstance(error, errors.OpenEnvCapacityReached)


def test_an_oversized_action_is_not_sent_and_the_session_survives():
    async def go(url):
        start = await open_episode(url, RESET)
        with pytest.raises(errors.OpenEnvOutgoingTooLarge):
            await start.session.step({"delta": 1, "pad": "x" * (16 * 1024 * 1024)})
        assert start.session.usable
        result = await start.session.step({"delta": 3})
        await start.session.close()
        return result

    with FakeServer() as server:
        assert run(go(server.url)).reward == 2.9
        assert [f["type"] for f in server.settle().received] == ["reset", "step", "close"]
