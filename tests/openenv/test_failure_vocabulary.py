"""Run failures (kiln.openenv-run-failure.v1, reference-spec §4.12) stay in the replay reference's closed
15-code vocabulary, always carry an actionable hint, and classify the transport the way the reference's
table does: a socket that dropped (no close frame, a reset) is `environment_unavailable` (retryable),
like the same server down at discovery; a peer that closed on purpose or broke the protocol is
`environment_protocol_error`; a 401/403 on the WebSocket upgrade is the credential failure a 401 on
HTTP is."""

from __future__ import annotations

import asyncio
import inspect
import re
from pathlib import Path

import pytest

from openenv.client import errors
from openenv.client.credentials import credential_from_env
from openenv.client.discovery import inspect as inspect_environment
from openenv.client.frames import ErrorFrame, protocol_error
from openenv.client.session import open_episode, open_session
from openenv.collector.errors import (
    DEFAULT_HINTS,
    FAILURE_CODES,
    FAILURE_STAGES,
    CollectionError,
    checked_failure,
    failure_record,
)
from tests.openenv.fake_server import CounterEnv, FakeServer, dumps

REFERENCE_CODES = {
    "run_admission_failed", "run_interrupted", "persisted_contract_invalid", "environment_unavailable",
    "environment_capacity_exhausted", "environment_protocol_error", "environment_identity_changed",
    "collection_failed", "artifact_publication_failed", "training_submission_failed", "training_failed",
    "training_evidence_invalid", "post_evaluation_failed", "environment_evaluation_failed", "internal_error",
}
RESET = {"seed": 7, "target": 4, "max_steps": 5}
PACKAGE = Path(__file__).resolve().parents[2] / "openenv"


def test_the_vocabulary_is_the_reference_one():
    assert FAILURE_CODES == REFERENCE_CODES and len(FAILURE_CODES) == 15
    assert len(FAILURE_STAGES) == 11 and set(DEFAULT_HINTS) == REFERENCE_CODES
    assert all(hint.strip() for hint in DEFAULT_HINTS.values())


# Every literal failure code the package writes: failure_code=..., services.failure("..."), _fail(run, "..."),
# BehaviorDrift(code=...), and the client's FAILURE_* constants.
LITERAL = re.compile(r'(?:failure_code\s*=\s*|(?<![\w.])failure\(\s*|services\.failure\(\s*|_fail\(run,\s*|'
                     r'BehaviorDrift\([^)]*?code\s*=\s*|FAILURE_[A-Z]+\s*=\s*)"([a-z_]+)"')


def test_every_code_the_package_writes_is_in_the_vocabulary():
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        for code in LITERAL.findall(path.read_text()):
            found.setdefault(code, []).append(path.name)
    outside = {code: where for code, where in found.items() if code not in FAILURE_CODES}
    assert outside == {}
    # the scan sees the sites that once wrote codes outside it
    assert {"collection_failed", "training_submission_failed", "run_admission_failed",
            "environment_evaluation_failed", "internal_error", "artifact_publication_failed"} <= set(found)


def test_every_client_error_maps_into_the_vocabulary_with_a_hint():
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if issubclass(c, errors.OpenEnvError)]
    assert len(classes) > 30
    for cls in classes:
        assert cls.failure_code is None or cls.failure_code in FAILURE_CODES, cls
        assert cls.default_hint.strip(), cls


def test_a_code_outside_the_vocabulary_becomes_the_stage_code_and_keeps_the_cause():
    record = failure_record("nan_loss", "training", "the loss was NaN at step 3")
    assert (record["code"], record["stage"], record["message"]) == \
        ("training_failed", "training", "nan_loss: the loss was NaN at step 3")
    assert record["hint"] == DEFAULT_HINTS["training_failed"]
    assert failure_record("orchestration_failed", "orchestration", "boom")["code"] == "internal_error"
    assert failure_record("artifact_budget_exceeded", "collection", "x")["code"] == "collection_failed"
    assert failure_record("training_queue_full", "training_submission", "x")["code"] == "training_submission_failed"
    assert failure_record("model_inference_failed", "environment_evaluation", "x")["code"] == \
        "environment_evaluation_failed"
    odd = failure_record("environment_unavailable", "somewhere", "x")
    assert (odd["stage"], odd["message"]) == ("orchestration", "[somewhere] x")
    # a stored record passes through unchanged when valid
    good = failure_record("environment_protocol_error", "collection", "m", hint="h", protocol_code="SESSION_ERROR",
                          http_status=None)
    assert checked_failure(good) == good


def test_every_failure_has_a_hint_and_a_retryable_one_names_a_new_idempotency_key():
    for code in REFERENCE_CODES:
        record = failure_record(code, "collection", "m", hint="")
        assert record["hint"] == DEFAULT_HINTS[code]
        retry = failure_record(code, "collection", "m", retryable=True, hint="start the server")
        assert retry["hint"].startswith("start the server; then submit it as a new run with a new idempotency_key")
    kept = failure_record("run_interrupted", "restoration", "m", retryable=True,
                          hint="submit the run again (with a new idempotency_key)")
    assert kept["hint"] == "submit the run again (with a new idempotency_key)"


@pytest.mark.parametrize("code", ["FACTORY_ERROR", "EXECUTION_ERROR", "SESSION_ERROR", "VALIDATION_ERROR"])
def test_a_protocol_error_carries_a_hint(code):
    error = protocol_error(ErrorFrame(code=code, message="no"))
    assert error.hint == errors.PROTOCOL_HINTS[code] and error.hint
    failure = CollectionError.from_client(error, stage="collection").as_failure()
    assert (failure["code"], failure["protocol_code"], failure["hint"]) == \
        ("environment_protocol_error", code, errors.PROTOCOL_HINTS[code])


@pytest.mark.parametrize("close_code, failure_code, retryable", [
    (None, "environment_unavailable", True), (1006, "environment_unavailable", True),
    (1001, "environment_unavailable", True), (1012, "environment_unavailable", True),
    (1000, "environment_protocol_error", False), (1002, "environment_protocol_error", False),
    (1008, "environment_protocol_error", False)])
def test_a_closed_socket_is_classified_by_its_close_code(close_code, failure_code, retryable):
    error = errors.OpenEnvSocketClosed("closed", close_code=close_code)
    assert (error.failure_code, error.retryable, error.close_code) == (failure_code, retryable, close_code)
    expected = error.unavailable_hint if retryable else error.protocol_hint
    assert error.hint == expected and expected
    failure = CollectionError.from_client(error, stage="collection").as_failure()
    assert (failure["code"], failure["retryable"]) == (failure_code, retryable)


def _dies_on_step(how):
    async def handler(server, ws):
        env = CounterEnv()
        while (frame := await server.recv(ws)) is not None:
            if frame.get("type") == "reset":
                await ws.send(dumps(env.reset(frame["data"])))
            elif frame.get("type") == "step":
                await how(ws)
                break
        try:
            await asyncio.wait_for(ws.wait_closed(), 5)
        except TimeoutError:
            pass
    return handler


async def _abort(ws):
    ws.transport.abort()


async def _close_1000(ws):
    await ws.close(1000)


async def _step(url):
    start = await open_episode(url, RESET, request_timeout=2)
    try:
        with pytest.raises(errors.OpenEnvSocketClosed) as info:
            await start.session.step({"delta": 1})
        return info.value
    finally:
        await start.session.close()


def test_an_environment_that_dies_mid_episode_is_unavailable_like_one_down_at_discovery():
    with FakeServer(ws_handler=_dies_on_step(_abort)) as server:
        died = asyncio.run(_step(server.url))
    mid = CollectionError.from_client(died, stage="collection").as_failure()
    assert (died.close_code, mid["code"], mid["stage"], mid["retryable"]) == \
        (None, "environment_unavailable", "collection", True)
    assert "went away mid-episode" in mid["hint"] and "new idempotency_key" in mid["hint"]

    with FakeServer() as server:
        url = server.url
    with pytest.raises(errors.OpenEnvUnavailable) as info:  # the same server, down at discovery
        asyncio.run(inspect_environment(url))
    down = CollectionError.from_client(info.value, stage="discovery").as_failure()
    assert (down["code"], down["retryable"]) == (mid["code"], mid["retryable"])


def test_a_peer_that_closes_a_pending_request_on_purpose_is_a_protocol_error():
    with FakeServer(ws_handler=_dies_on_step(_close_1000)) as server:
        closed = asyncio.run(_step(server.url))
    failure = CollectionError.from_client(closed, stage="collection").as_failure()
    assert (closed.close_code, failure["code"], failure["retryable"]) == (1000, "environment_protocol_error", False)
    assert failure["hint"] == errors.OpenEnvSocketClosed.protocol_hint


@pytest.mark.parametrize("status", [401, 403])
@pytest.mark.parametrize("with_token", [False, True])
def test_a_refused_upgrade_is_the_credential_failure(status, with_token):
    with FakeServer(upgrade_status=status) as server:
        credential = credential_from_env(server.url, "T", environ={"T": "tok-1"}) if with_token else None
        with pytest.raises(errors.OpenEnvUnauthorized) as info:
            asyncio.run(open_session(server.url, credential=credential))
    error = info.value
    why = "refused the bearer token sent" if with_token else "requires credentials and none were given"
    assert error.http_status == status and why in error.message and "WebSocket upgrade" in error.message
    failure = CollectionError.from_client(error, stage="collection").as_failure()
    assert (failure["code"], failure["retryable"], failure["http_status"]) == \
        ("persisted_contract_invalid", False, status)
    assert failure["hint"] == errors.OpenEnvUnauthorized.default_hint and "--credential-env" in failure["hint"]
