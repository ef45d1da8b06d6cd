"""Hostile and malformed input answers 400 with a stable code, never 500, and stores nothing.
Server-side paths are confined to the dataset roots and every refusal says the same thing."""

import json
import os

import pytest
from django.conf import settings

from core.jobs.models import Job
from tests.training.conftest import GROUP

pytestmark = pytest.mark.django_db




def post(api, route, body):
    return api.post(route, data=body if isinstance(body, str) else json.dumps(body),
                    content_type="application/json")


def error(response, status, code):
    assert response.status_code == status, response.content
    body = response.json()["error"]
    assert body["code"] == code, body
    return body


def test_json_nested_100000_levels_deep_is_a_400(api):
    deep = "[" * 100_000 + "]" * 100_000
    error(post(api, "/v1/train/grpo", '{"groups": ' + deep + "}"), 400, "training_invalid_request")
    error(post(api, "/v1/chat/completions", '{"messages": ' + deep + "}"), 400, "invalid_json")
    assert not Job.objects.exists()


def test_a_reward_beyond_the_float_range_is_a_400(api):
    body = ('{"groups": [{"messages": [{"role": "user", "content": "x"}], "completions": '
            '[{"text": "5", "reward": 1' + "0" * 400 + '}, {"text": "6", "reward": 0}]}]}')
    message = error(post(api, "/v1/train/grpo", body), 400, "training_invalid_request")["message"]
    assert message.startswith("groups[0].completions[0].reward: must be finite")
    # finite but past 2**53: the group statistics would overflow in the trainer (OverflowError)
    for reward in (1e200, -1e17, 2**60):
        big = {"groups": [{"messages": [{"role": "user", "content": "x"}],
                           "completions": [{"text": "5", "reward": reward}, {"text": "6", "reward": 0}]}]}
        message = error(post(api, "/v1/train/grpo", json.dumps(big)), 400, "training_invalid_request")["message"]
        assert message == "groups[0].completions[0].reward: must be finite and at most 2**53 (about 9.0e15) in size"
    huge_rate = {"groups": [GROUP], "config": {"learning_rate": 10**400}}
    assert "config.learning_rate" in error(post(api, "/v1/train/grpo", json.dumps(huge_rate)), 400,
                                           "training_invalid_request")["message"]


def test_lone_surrogates_are_refused_as_validation_errors(api):
    bad = '{"groups": [{"messages": [{"role": "user", "content": "\\ud800"}], "completions": [{"text": "5", "reward": 1}, {"text": "6", "reward": 0}]}]}'
    assert "lone surrogate" in error(post(api, "/v1/train/grpo", bad), 400, "training_invalid_request")["message"]
    text = '{"groups": [{"messages": [{"role": "user", "content": "x"}], "completions": [{"text": "\\udfff", "reward": 1}, {"text": "6", "reward": 0}]}]}'
    assert "completions[0].text" in error(post(api, "/v1/train/grpo", text), 400, "training_invalid_request")["message"]
    chat = error(post(api, "/v1/chat/completions", '{"messages": [{"role": "user", "content": "\\ud800"}]}'),
                 422, "validation_error")
    assert "lone surrogate" in chat["message"] and "tokenizer" not in chat["message"].lower()
    assert not Job.objects.exists()


@pytest.mark.parametrize("config, field", [
    ({"lora_rank": 2**40, "lora_alpha": 2**41, "allow_high_lora_scale": True}, "config.lora_rank"),
    ({"lora_alpha": 10.0**9, "allow_high_lora_scale": True}, "config.lora_alpha"),
    ({"checkpoint_interval": 10**40}, "config.checkpoint_interval"),
    ({"kl_reference_policy": {"kind": "ema", "refresh_every": 10**30}}, "config.kl_reference_policy.refresh_every"),
    ({"grad_checkpoint_segments": 10**9}, "config.grad_checkpoint_segments"),
    ({"reward_filter_min_groups": 10**12}, "config.reward_filter_min_groups"),
])
def test_numeric_fields_have_upper_bounds_checked_at_submission(api, config, field):
    message = error(post(api, "/v1/train/grpo", {"groups": [GROUP], "config": config}), 400,
                    "training_invalid_request")["message"]
    assert message.startswith(field), message
    assert not Job.objects.exists()


def test_dataset_path_is_confined_and_every_refusal_reads_the_same(api, tmp_path):
    inside = tmp_path / "groups.jsonl"  # the test settings make the temp folder a dataset root
    inside.write_text(json.dumps(GROUP) + "\n")
    accepted = post(api, "/v1/train/grpo", {"dataset_path": str(inside), "config": {"output_name": "ok-r001"}})
    assert accepted.status_code == 200, accepted.content
    home = settings.KILN.home
    (home / "kiln-private.sqlite3").write_bytes(b"SQLite format 3\x00secret")
    link = tmp_path / "link.jsonl"
    link.symlink_to("/etc/passwd")
    refusals = {}
    for name, path in {
        "shadow": "/etc/shadow", "environ": "/proc/self/environ", "missing": str(tmp_path / "nope.jsonl"),
        "folder": str(tmp_path), "long": "/" + "a" * 5000, "link-out": str(link),
        "kiln-home-private": str(home / "kiln-private.sqlite3"), "secret": str(home / "secret_key"),
    }.items():
        refusals[name] = error(post(api, "/v1/train/grpo", {"dataset_path": path}), 400, "training_invalid_request")
    messages = {body["message"] for body in refusals.values()}
    assert len(messages) == 1, refusals  # nothing tells one case from another
    [message] = messages
    assert message.startswith("dataset_path: not a readable file under the allowed roots")
    assert "dataset_roots" in refusals["shadow"]["hint"]
    assert "SQLite" not in json.dumps(refusals) and "secret" not in message
    assert Job.objects.count() == 1


def test_a_corpus_that_is_not_utf8_names_the_line_but_never_a_byte(api, tmp_path):
    path = tmp_path / "binary.jsonl"
    path.write_bytes(json.dumps(GROUP).encode() + b"\n\xff\xfe\x89PNG\n")
    message = error(post(api, "/v1/train/grpo", {"dataset_path": str(path)}), 400, "training_invalid_request")["message"]
    assert "line 2" in message and "0xff" not in message.lower() and "\\xff" not in message
    assert os.path.exists(path)


def test_a_multipart_body_without_its_boundary_is_a_400(api):
    """Found by schemathesis: `Content-Type: multipart/form-data` with no boundary raised in the parser."""
    for route in ("/v1/eval/datasets/upload", "/v1/train/grpo"):
        response = api.post(route, data=b"--x\r\n", content_type="multipart/form-data")
        assert response.status_code == 400, (route, response.content)
        assert response.json()["error"]["code"] in ("invalid_multipart", "training_invalid_request")
    assert not Job.objects.exists()
