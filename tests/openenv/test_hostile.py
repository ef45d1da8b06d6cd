"""A hostile OpenEnv server: every way a lock-step session is poisoned (reference-spec §4.3).

Each case misbehaves on one request (the reset, or the first step after a good reset). Each must
raise its typed error, yield no observation for that request, leave the session poisoned (later
calls raise the same error, the socket is closed) and never resend the action.
"""

import asyncio

import pytest

from openenv.client import errors
from openenv.client.credentials import credential_from_env
from openenv.client.session import MAX_SERVER_FRAME_BYTES, open_episode, open_session
from tests.openenv.fake_server import CounterEnv, FakeServer, dumps

TOKEN = "hostile-test-token-42"
RESET = {"seed": 7, "target": 4, "max_steps": 5}


async def no_reply(ws, env, frame):
    pass


async def close_normally(ws, env, frame):
    await ws.close(1000)


async def abort_tcp(ws, env, frame):
    ws.transport.abort()


async def binary(ws, env, frame):
    await ws.send(b'{"type":"observation"}')


async def oversized(ws, env, frame):
    pad = "x" * (MAX_SERVER_FRAME_BYTES + 1)
    await ws.send(dumps({"type": "observation", "data": {"observation": {"pad": pad}, "reward": None, "done": False}}))


def text(payload):
    async def send(ws, env, frame):
        await ws.send(payload)
    return send


async def twice(ws, env, frame):
    reply = env.reset(frame["data"]) if frame["type"] == "reset" else env.step(frame["data"])
    await ws.send(dumps(reply))
    await ws.send(dumps(reply))


async def wrong_type(ws, env, frame):
    await ws.send(dumps(env.state()))


async def reflect_token(ws, env, frame):
    reply = env.reset(frame["data"]) if frame["type"] == "reset" else env.step(frame["data"])
    reply["data"]["observation"]["message"] = f"your header was {ws.request.headers['Authorization']}"
    await ws.send(dumps(reply))


OBS = '{"type":"observation","data":{"observation":{},"reward":null,"done":false%s}}'
CASES = {
    "timeout": (no_reply, errors.OpenEnvTimeout),
    "close": (close_normally, errors.OpenEnvSocketClosed),
    "tcp-abort": (abort_tcp, errors.OpenEnvSocketClosed),
    "binary": (binary, errors.OpenEnvBinaryFrame),
    "oversized": (oversized, errors.OpenEnvFrameTooLarge),
    "malformed-json": (text("{not json"), errors.OpenEnvMalformedJson),
    "unknown-type": (text('{"type":"jump","data":{}}'), errors.OpenEnvUnknownFrameType),
    "not-an-object": (text("[1,2]"), errors.OpenEnvInvalidMessage),
    "no-data": (text('{"type":"observation"}'), errors.OpenEnvInvalidMessage),
    "extra-envelope-key": (text('{"type":"state","data":{},"id":1}'), errors.OpenEnvInvalidMessage),
    "extra-observation-field": (text(OBS % ',"info":1'), errors.OpenEnvInvalidMessage),
    "string-reward": (text('{"type":"observation","data":{"observation":{},"reward":"1","done":false}}'),
                      errors.OpenEnvInvalidMessage),
    "nan-reward": (text('{"type":"observation","data":{"observation":{},"reward":NaN,"done":false}}'),
                   errors.OpenEnvMalformedJson),
    "unknown-error-code": (text('{"type":"error","data":{"code":"TEAPOT","message":"no"}}'),
                           errors.OpenEnvInvalidMessage),
    "wrong-reply-type": (wrong_type, errors.OpenEnvUnexpectedResponse),
    "mcp-reply": (text('{"type":"mcp","data":{"jsonrpc":"2.0","id":1,"result":{}}}'),
                  errors.OpenEnvUnexpectedResponse),
    "reflected-token": (reflect_token, errors.OpenEnvCredentialReflected),
}


def hostile(misbehave, on):
    async def handler(server, ws):
        env = CounterEnv()
        while (frame := await server.recv(ws)) is not None:
            if frame.get("type") == on:
                await misbehave(ws, env, frame)
                break
            if frame.get("type") == "reset":
                await ws.send(dumps(env.reset(frame["data"])))
            elif frame.get("type") == "close":
                return
        try:
            await asyncio.wait_for(ws.wait_closed(), 10)
        except TimeoutError:
            server.left_open = True
    return handler


async def _episode(url, on, credential):
    start = None
    if on == "reset":
        with pytest.raises(errors.OpenEnvSessionPoisoned) as info:
            start = await open_episode(url, RESET, credential=credential, request_timeout=0.5)
        return info.value, start, None
    start = await open_episode(url, RESET, credential=credential, request_timeout=0.5)
    session = start.session
    observation = None
    with pytest.raises(errors.OpenEnvSessionPoisoned) as info:
        observation = await session.step({"delta": 3})
    assert session.poisoned is info.value and not session.usable
    with pytest.raises(type(info.value)):
        await session.state()  # poisoned for good
    with pytest.raises(type(info.value)):
        await session.keep_alive_while(asyncio.sleep(0), interval_s=0.01)
    await session.close()
    return info.value, start, observation


@pytest.mark.parametrize("on", ["reset", "step"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_poisoning(case, on):
    misbehave, expected = CASES[case]
    with FakeServer(ws_handler=hostile(misbehave, on)) as server:
        credential = credential_from_env(server.url, "T", environ={"T": TOKEN})
        error, start, observation = asyncio.run(_episode(server.url, on, credential))
        sent = [f for f in server.settle().received if f.get("type") == on]
        assert len(sent) == 1  # never resent
        assert not getattr(server, "left_open", False)  # the client closed the poisoned socket
    assert type(error) is expected, (type(error), error)
    assert error.code.startswith("openenv_") and error.code != "openenv_session_poisoned"
    assert observation is None
    if on == "reset":
        assert start is None
    assert TOKEN not in str(error) and TOKEN not in repr(error.as_dict())
    # what the user can do about it, not only that the socket is gone
    if case == "timeout":
        assert "no reply within 0.5 s" in str(error) and "blocked or slow" in error.hint
    if case == "oversized":
        assert "smaller" in error.hint and "input_text" in error.hint


def test_an_episode_too_long_for_the_context_says_what_an_environment_user_can_change():
    from openenv.collector.errors import policy_refusal_hint

    hint = policy_refusal_hint("context_length_exceeded", "shorten the messages or lower max_tokens")
    assert "input_text" in hint and "--max-steps" in hint and "max_tokens" not in hint
    assert policy_refusal_hint("adapter_not_found", "list adapters") == "list adapters"


def test_an_unsolicited_frame_before_any_request_poisons_the_reset():
    async def handler(server, ws):
        await ws.send(dumps(CounterEnv().state()))
        await server.recv(ws)
        await ws.wait_closed()

    async def go(url):
        session = await open_session(url)
        await asyncio.sleep(0.2)
        with pytest.raises(errors.OpenEnvUnsolicitedFrame):
            await session.reset(RESET)
        assert isinstance(session.poisoned, errors.OpenEnvUnsolicitedFrame)

    with FakeServer(ws_handler=handler) as server:
        asyncio.run(go(server.url))
        assert server.settle().received == []  # the reset was never sent on the poisoned socket


@pytest.mark.parametrize("on", ["reset", "step"])
def test_a_second_reply_is_unsolicited(on):
    async def go(url):
        if on == "reset":
            session = await open_session(url)
            first = await session.reset(RESET)
        else:
            start = await open_episode(url, RESET)
            session = start.session
            first = await session.step({"delta": 3})
        assert first.observation["value"] in (0, 3)  # the real reply is delivered
        with pytest.raises(errors.OpenEnvUnsolicitedFrame):
            # while the model thinks, the extra frame arrives: the wait ends with the session's error
            await session.keep_alive_while(asyncio.sleep(5), interval_s=10)
        with pytest.raises(errors.OpenEnvUnsolicitedFrame):
            await session.step({"delta": 1})
        await session.close()

    with FakeServer(ws_handler=hostile(twice, on)) as server:
        asyncio.run(go(server.url))
        assert [f["type"] for f in server.settle().received].count("step") == (1 if on == "step" else 0)


def test_an_unsolicited_frame_while_the_model_thinks_cancels_the_generation():
    cancelled = []

    async def handler(server, ws):
        env = CounterEnv()
        frame = await server.recv(ws)
        await ws.send(dumps(env.reset(frame["data"])))
        await asyncio.sleep(0.2)
        await ws.send(dumps(env.step({"delta": 1})))  # an observation nobody asked for
        await ws.wait_closed()

    async def think():
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def go(url):
        start = await open_episode(url, RESET)
        with pytest.raises(errors.OpenEnvUnsolicitedFrame):
            await start.session.keep_alive_while(think(), interval_s=10)
        await start.session.close()

    with FakeServer(ws_handler=handler) as server:
        asyncio.run(go(server.url))
    assert cancelled == [True]


def test_a_capacity_refusal_surfaces_as_capacity_not_as_an_unsolicited_frame():
    async def go(url):
        holder = await open_session(url)
        await holder.reset({"seed": 1})
        refused = await open_session(url)
        await asyncio.sleep(0.2)  # the refusal frame and the close arrive before any request
        with pytest.raises(errors.OpenEnvCapacityReached) as info:
            await refused.reset(RESET)
        await holder.close()
        return info.value

    with FakeServer(max_sessions=1) as server:
        error = asyncio.run(go(server.url))
    assert error.frame.active_sessions == 1 and error.frame.max_sessions == 1
    assert error.failure_code == "environment_capacity_exhausted"


def test_a_broken_observation_names_what_it_lacks_and_says_what_to_fix():
    """QA: `{"observation": "oops", "reward": "lots"}` failed with the session's generic hint, which said only
    that the episode could not continue."""
    from openenv.client.frames import parse_observation

    with pytest.raises(errors.OpenEnvInvalidMessage) as info:
        parse_observation({"observation": "oops", "reward": "lots"})
    assert info.value.message.endswith("it lacks done")
    assert info.value.hint.startswith("the environment sent an observation that breaks the OpenEnv wire format")
    from openenv.client.frames import parse_error

    with pytest.raises(errors.OpenEnvInvalidMessage) as other:  # any other frame: the generic wire-format hint
        parse_error([1])
    assert "an observation" not in other.value.hint and "breaks the OpenEnv wire format" in other.value.hint
