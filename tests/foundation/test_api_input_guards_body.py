"""Every /v1/ JSON body is one object whose text is valid Unicode: a lone surrogate in any string or
key, at any depth, is refused with the route's own validation code and the field's JSON path (it
was a 500 from a database query on some fields); a non-object body is refused instead of being read
as an empty one (an activation took `[1,2]` and queued a promotion). Nothing is stored."""

from __future__ import annotations

import json

import pytest

from adapters.models import Promotion, PromotionState
from adapters.promotions import promotion_request
from core.accounts.services import user_create
from core.jobs.models import Job
from tests.promotions.support import client_for, home, policy, published  # noqa: F401

pytestmark = pytest.mark.django_db

LONE = "\ud800"
SURROGATE = "holds a lone surrogate; send valid Unicode text"
CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def alice(home, canary_worker):  # noqa: F811
    user = user_create(username="alice", password="long-enough-pw", can_approve=True)
    published(home, "cand")
    return {"user": user, "api": client_for("alice")}


def post(api, path, body):
    return api.post(path, data=body if isinstance(body, str | bytes) else json.dumps(body),
                    content_type="application/json")


def refused(response, status, code) -> str:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code and error["hint"], error
    return error["message"]


@pytest.mark.parametrize("path, body, field, status, code", [
    ("/v1/chat/completions", {**CHAT, "model": LONE}, "model", 422, "validation_error"),
    ("/v1/chat/completions", {**CHAT, "adapter": LONE}, "adapter", 422, "validation_error"),
    ("/v1/eval/run", {"suite_name": LONE}, "suite_name", 400, "eval_invalid_request"),
    ("/v1/eval/run", {"suite_name": "s", "adapter": LONE}, "adapter", 400, "eval_invalid_request"),
    ("/v1/openenv/training/preflight", {"adapter": LONE}, "adapter", 400, "training_invalid_request"),
    ("/v1/promotions", {"candidate": LONE}, "candidate", 422, "validation_error"),
    ("/v1/promotions", {"candidate": "cand", "reason": LONE}, "reason", 422, "validation_error"),
    ("/v1/adapters/load", {"name": "cand", "reason": LONE}, "reason", 422, "validation_error"),
    ("/v1/adapters/cand/activate", {"reason": LONE}, "reason", 422, "validation_error"),
])
def test_a_lone_surrogate_is_refused_with_the_routes_code_and_nothing_is_stored(alice, path, body, field, status,
                                                                                code):
    assert refused(post(alice["api"], path, body), status, code) == f"{field}: {SURROGATE}"
    assert not Job.objects.exists() and not Promotion.objects.exists()


@pytest.mark.parametrize("body, message", [
    ({"messages": [{"role": "user", "content": "ok"},
                   {"role": "user", "content": [{"type": "text", "text": "\udfff"}]}]},
     f"messages[1].content[0].text: {SURROGATE}"),
    ({**CHAT, "metadata": {"tags": {LONE: 1}}}, f"metadata.tags: a key {SURROGATE}"),
    ({**CHAT, LONE: 1}, f"request: a key {SURROGATE}"),
    ({**CHAT, "k" * 1000: [LONE]}, f"{'k' * 80}…[0]: {SURROGATE}"),  # a client's key is quoted bounded
])
def test_the_message_names_the_json_path_of_the_string_or_key(alice, body, message):
    assert refused(post(alice["api"], "/v1/chat/completions", body), 422, "validation_error") == message


def test_raw_surrogate_bytes_are_refused_like_the_escape(alice):
    # Python's JSON parser decodes UTF-8 with surrogatepass: these three bytes are a lone U+D800 too.
    body = b'{"candidate": "cand", "reason": "\xed\xa0\x80"}'
    assert refused(post(alice["api"], "/v1/promotions", body), 422, "validation_error") == f"reason: {SURROGATE}"
    assert not Promotion.objects.exists()


def test_a_surrogate_pair_is_valid_text(alice):
    response = post(alice["api"], "/v1/promotions", {"candidate": "cand", "reason": "ship it \U0001f600"})
    assert response.status_code == 200, response.content  # json.dumps sends it as "\ud83d\ude00"
    assert Promotion.objects.get().request_reason == "ship it \U0001f600"


NOT_OBJECTS = [("[1, 2]", "an array"), ('"x"', "a string"), ("null", "null"), ("7", "a number"),
               ("true", "a boolean")]


@pytest.mark.parametrize("body, kind", NOT_OBJECTS)
def test_activate_refuses_a_body_that_is_not_an_object(alice, body, kind):
    message = refused(post(alice["api"], "/v1/adapters/cand/activate", body), 422, "validation_error")
    assert message == f"request: the body must be a JSON object, not {kind}"
    assert not Promotion.objects.exists() and not Job.objects.exists()


def test_activate_without_a_body_says_one_is_required(alice):
    message = refused(post(alice["api"], "/v1/adapters/cand/activate", ""), 422, "validation_error")
    assert message == "request: a JSON object body is required"
    assert not Promotion.objects.exists()


@pytest.mark.parametrize("decision", ["approve", "reject"])
@pytest.mark.parametrize("body, kind", NOT_OBJECTS)
def test_decisions_refuse_a_body_that_is_not_an_object(alice, settings, decision, body, kind):
    policy(settings, require_approval=True)
    requester = user_create(username="requester", password="long-enough-pw")
    pending = promotion_request(candidate="cand", user=requester, reason="try it")
    assert pending.state == PromotionState.PENDING
    message = refused(post(alice["api"], f"/v1/promotions/{pending.id}/{decision}", body), 422, "validation_error")
    assert message == f"request: the body must be a JSON object, not {kind}"
    assert Promotion.objects.get(id=pending.id).state == PromotionState.PENDING


def test_a_training_route_refuses_a_non_object_with_its_own_code(alice):
    message = refused(post(alice["api"], "/v1/train/grpo", '"groups"'), 400, "training_invalid_request")
    assert message == "request: the body must be a JSON object, not a string"


def test_a_body_nested_past_the_bound_is_refused_before_any_route_reads_it(alice):
    """QA: a json_schema scorer nested 200 deep was a 500 (jsonschema's check_schema ran out of
    recursion). Every route refuses bodies deeper than MAX_BODY_DEPTH with its own validation code."""
    from evaluations.models import EvalSuite
    from kiln_project.api import MAX_BODY_DEPTH

    def nested(levels):
        schema = {}
        for _ in range(levels):
            schema = {"items": schema}
        return schema

    def suite(levels):
        return {"name": f"deep{levels}", "scorer": {"type": "json_schema", "schema": nested(levels)},
                "examples": [{"id": "1", "messages": [{"role": "user", "content": "x"}]}]}

    # body -> scorer -> schema is 3 levels, then the schema's own.
    message = refused(post(alice["api"], "/v1/eval/suites", suite(200)), 400, "eval_invalid_request")
    assert f"nests deeper than {MAX_BODY_DEPTH} levels" in message and message.startswith("scorer.schema.items")
    assert not EvalSuite.objects.exists()
    ok = post(alice["api"], "/v1/eval/suites", suite(MAX_BODY_DEPTH - 3))
    assert ok.status_code == 200, ok.content
    deep_reset = {"kind": "rollout", "environments": ["http://127.0.0.1:9/"], "reset_options": nested(100)}
    message = refused(post(alice["api"], "/v1/openenv/runs", deep_reset), 400, "openenv_invalid_request")
    assert "nests deeper than" in message
