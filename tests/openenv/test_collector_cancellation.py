"""A collection cancelled mid-episode closes every socket at once (reference-spec §4.4: the first failure
cancels the work in flight; no connection may outlive the collection).

The regression: a candidate cancelled while its `Session.close()` waited for the closing handshake
left its socket half-closed; once the caller's event loop ended nobody answered the server, which
then waited its 10 s close timeout. The server here stalls one handshake on purpose (it stops
reading the first socket that sends `close` for a moment), so a cancellation lands mid-close
while the other candidates close at once and the caller's loop ends.
"""

import asyncio
import time

import pytest

from openenv.collector import CollectionError, collect, episode
from tests.openenv.collector_fakes import FakeCounterPolicy, config_for
from tests.openenv.fake_server import CounterEnv, FakeServer, dumps, error

pytestmark = pytest.mark.timeout(60)

STALL_S = 0.5
PROMPT_CLOSE_S = 2.0


def stalling_handler(stalled: list):
    """The counter protocol, but the first socket to send `close` is not read for STALL_S."""

    async def handler(server, ws):
        env = CounterEnv()
        while True:
            frame = await server.recv(ws)
            if frame is None:
                return
            kind = frame.get("type")
            if kind == "close":
                if not stalled:  # stop reading this socket: the client's closing handshake hangs
                    stalled.append(time.monotonic())
                    ws.transport.pause_reading()
                    await asyncio.sleep(STALL_S)
                    ws.transport.resume_reading()
                await ws.close(1000)
                return
            if kind == "reset":
                reply = env.reset(frame.get("data") or {})
            elif kind == "step":
                reply = env.step(frame.get("data") or {})
            elif kind == "state":
                reply = env.state()
            else:
                reply = error(f"Unknown message type: {kind}", "UNKNOWN_TYPE")
            await ws.send(dumps(reply))

    return handler


class GatedPolicy(FakeCounterPolicy):
    """Candidate 0 answers at once (its episode ends after one step and it closes); the others think until
    cancelled, so they are mid-episode when the collection is cancelled."""

    def __init__(self):
        super().__init__()
        self.thinking = 0

    async def __call__(self, request):
        if request.candidate_index == 0:
            return await super().__call__(request)
        self.thinking += 1
        await asyncio.Event().wait()


def _wait_all_closed(server, started: float) -> float:
    server.settle(timeout=PROMPT_CLOSE_S + STALL_S + 1)
    return time.monotonic() - started


@pytest.mark.parametrize("how", ["cancel", "failure"])
def test_cancelling_a_collection_mid_episode_closes_every_socket_promptly(tmp_path, monkeypatch, how):
    stalled: list = []
    kept: list = []  # every session stays referenced, so garbage collection cannot close a leaked socket for us
    real_open_episode = episode.open_episode

    async def keeping_open_episode(*args, **kwargs):
        start = await real_open_episode(*args, **kwargs)
        kept.append(start.session)
        return start

    monkeypatch.setattr(episode, "open_episode", keeping_open_episode)
    with FakeServer(ws_handler=stalling_handler(stalled)) as server:
        config = config_for([server.url], tmp_path, groups=1, group_size=3, concurrency=3, max_steps=1,
                            reset_options={"target": 3})
        policy = GatedPolicy()

        marks: list = []

        async def scenario():
            if how == "failure":  # a sibling's failure (here: a policy error) cancels the others
                async def failing(request):
                    if request.candidate_index == 1:
                        while not stalled:
                            await asyncio.sleep(0.01)
                        await asyncio.sleep(0.1)
                        marks.append(time.monotonic())
                        raise CollectionError("openenv_policy_failed", "the model went away")
                    return await policy(request)
                task = asyncio.ensure_future(collect(config, failing))
            else:
                task = asyncio.ensure_future(collect(config, policy))
                while not stalled or policy.thinking < 2:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)  # candidate 0 is now waiting for its closing handshake
                marks.append(time.monotonic())
                task.cancel()
            expected = CollectionError if how == "failure" else asyncio.CancelledError
            with pytest.raises(expected) as info:
                await task
            if how == "failure":
                assert info.value.code == "openenv_policy_failed"

        asyncio.run(scenario())  # the loop is gone: only sockets really closed are closed now
        elapsed = _wait_all_closed(server, marks[0])
        assert server.sessions == 3 and server.active == 0 and len(kept) == 3
    assert elapsed < PROMPT_CLOSE_S
    assert stalled  # the cancellation did land while a closing handshake hung
