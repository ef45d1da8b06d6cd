"""post_eval at submission (issue 12): the suite must be installed, and a held-out suite must not
overlap the training data (exact or normalized prompt, the system message removed, a dataset's
own rows, shared group ids). Nothing is queued when refused."""

from __future__ import annotations

import json

import pytest

from core.jobs.models import Job
from evaluations.suite_services import suite_store
from tests.evaluations import dataset_support
from tests.evaluations.dataset_support import error, group, jsonl, ok, send, upload

pytestmark = pytest.mark.django_db
api, home = dataset_support.api, dataset_support.home


def _suite(name: str, examples: list[dict]) -> None:
    suite_store(body={"name": name, "scorer": {"type": "exact"}, "examples": examples})


def _train(client, body):
    return client.post("/v1/train/grpo", data=json.dumps(body), content_type="application/json")


def _example(i: int, content: str, **extra) -> dict:
    return {"id": f"e{i}", "messages": [{"role": "user", "content": content}], "target": "0", **extra}


def test_an_uninstalled_suite_is_refused(api, home):
    body = {"groups": [group(1)], "config": {"output_name": "x-r001"}, "post_eval": {"suite": "nope"}}
    assert "no installed eval suite named 'nope'" in error(_train(api, body), 404, "eval_suite_not_found")
    assert not Job.objects.exists()


def test_post_eval_inside_config_is_refused_not_ignored(api, home):
    _suite("placed", [_example(1, "What is 100 + 100?")])
    body = {"groups": [group(1), group(2)],
            "config": {"output_name": "p-r001", "post_eval": {"suite": "placed", "min_accuracy": 0.5}}}
    response = _train(api, body)
    assert "is a field of the request, not of its config" in error(response, 400, "training_invalid_request")
    assert "top level" in response.json()["error"]["hint"]
    assert not Job.objects.exists()


def test_a_misspelt_post_eval_key_is_refused_not_ignored(api, home):
    """`min_acuracy` used to be dropped silently: the run trained with no floor and auto-loaded."""
    _suite("math-holdout", [_example(1, "What is 100 + 100?")])
    body = {"groups": [group(1), group(2)], "config": {"output_name": "m-r001"},
            "post_eval": {"suite": "math-holdout", "min_acuracy": 0.99}}
    response = _train(api, body)
    message = error(response, 400, "training_invalid_request")
    assert message.startswith("post_eval.min_acuracy: unknown field 'min_acuracy' (did you mean 'min_accuracy'?)")
    assert "post_eval accepts only: suite, data_scope, generation, min_accuracy, include_baseline" in message
    assert response.json()["error"]["hint"] == "use min_accuracy"
    assert not Job.objects.exists()


@pytest.mark.parametrize(("generation", "field", "said"), [
    ({"temprature": 0.5}, "post_eval.generation.temprature", "did you mean 'temperature'?"),
    ({"top_p": 1.5}, "post_eval.generation.top_p", "top_p"),
    ({"thinking_budget_tokens": 64}, "post_eval.generation.thinking_budget_tokens", "needs thinking on"),
    ({"seed": "x"}, "post_eval.generation.seed", "decimal u64"),
])
def test_generation_settings_the_eval_would_refuse_are_refused_before_training(api, home, generation, field, said):
    """A misspelt `temprature` used to be accepted: the run trained, then the gate ended `error`."""
    _suite("math-holdout", [_example(1, "What is 100 + 100?")])
    body = {"groups": [group(1), group(2)], "config": {"output_name": "m-r001"},
            "post_eval": {"suite": "math-holdout", "min_accuracy": 0.5, "generation": generation}}
    response = _train(api, body)
    message = error(response, 400, "training_invalid_request")
    assert message.startswith(f"{field}: ") and said in message
    assert "kiln eval run" in response.json()["error"]["hint"]
    assert not Job.objects.exists()


def test_valid_generation_settings_are_admitted(api, home):
    _suite("math-holdout", [_example(1, "What is 100 + 100?")])
    body = {"groups": [group(1), group(2)], "config": {"output_name": "m-r001"},
            "post_eval": {"suite": "math-holdout", "generation": {"temperature": 0.5, "max_tokens": 16, "seed": 7}}}
    ok(_train(api, body))
    assert Job.objects.count() == 1


def test_post_eval_under_the_maintenance_profile_is_refused_before_it_trains(api, home, settings):
    """Maintenance refuses evaluation: a gate could only end in error, so the run is not queued; the
    same run without post_eval trains (maintenance admits training)."""
    from dataclasses import replace

    _suite("later", [_example(1, "What is 100 + 100?")])
    settings.KILN = replace(settings.KILN, serving_profile="maintenance")
    body = {"groups": [group(1), group(2)], "config": {"output_name": "m-r001"},
            "post_eval": {"suite": "later", "min_accuracy": 0.5}}
    response = _train(api, body)
    assert "maintenance serving profile refuses" in error(response, 503, "inference_disabled_by_profile")
    assert "without post_eval" in response.json()["error"]["hint"]
    assert not Job.objects.exists()
    ok(_train(api, {**body, "post_eval": None}))
    assert Job.objects.count() == 1


@pytest.mark.parametrize("content, kind", [
    ("What is 3 + 3?", "exact_prompt"),
    ("  what IS 3  +   3? ", "normalized_prompt"),
])
def test_an_overlapping_prompt_is_refused_and_named(api, home, content, kind):
    _suite("leaky", [_example(1, "What is 100 + 100?"), _example(2, content)])
    body = {"groups": [group(1), group(2), group(3)], "config": {"output_name": "leak-r001"},
            "post_eval": {"suite": "leaky", "min_accuracy": 0.5}}
    message = error(_train(api, body), 400, "eval_train_overlap")
    assert "groups[2] ~ example 'e2'" in message and kind in message
    assert not Job.objects.exists()


@pytest.mark.parametrize("overlapping, tail", [(7, " and 2 more"), (25, " and at least 15 more")])
def test_the_overlap_count_says_when_the_search_stopped(api, home, overlapping, tail):
    _suite("many", [_example(i, f"What is {i} + {i}?") for i in range(1, overlapping + 1)])
    body = {"groups": [group(i) for i in range(1, overlapping + 1)], "config": {"output_name": "many-r001"},
            "post_eval": {"suite": "many"}}
    message = error(_train(api, body), 400, "eval_train_overlap")
    assert message.count(" ~ example ") == 5 and message.endswith(tail), message


def test_the_system_message_does_not_hide_an_overlap(api, home):
    _suite("sys", [{"id": "s1", "messages": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "What is 4 + 4?"}], "target": "8"}])
    body = {"groups": [group(4)], "config": {"output_name": "sys-r001"}, "post_eval": {"suite": "sys"}}
    assert "example 's1'" in error(_train(api, body), 400, "eval_train_overlap")


def test_a_shared_group_id_is_an_overlap(api, home):
    _suite("grouped", [_example(1, "A paraphrase nobody trains on",
                                metadata={"kiln_dataset_provenance": {"group_id": "g-7"}})])
    body = {"groups": [group(5, group_id="g-7")], "config": {"output_name": "g-r001"},
            "post_eval": {"suite": "grouped"}}
    assert "group_id" in error(_train(api, body), 400, "eval_train_overlap")


def test_a_dataset_holdout_suite_admits_its_train_partition_and_refuses_the_holdout(api, home):
    rows = [group(i, group_id=f"g{i}", reference=str(2 * i)) for i in range(30)]
    ok(upload(api, "math", jsonl(rows)))
    ok(send(api, "post", "/v1/eval/datasets/math/synthesize", {"suite_name": "math-holdout"}))
    fine = ok(_train(api, {"dataset": "math", "config": {"output_name": "m-r001"},
                           "post_eval": {"suite": "math-holdout", "min_accuracy": 0.5}}))
    job = Job.objects.get(uuid=fine["job_id"])
    assert job.payload["post_eval_suite_hash"].startswith("sha256:")
    leak = _train(api, {"dataset": "math", "dataset_split": "holdout", "config": {"output_name": "m-r002"},
                        "post_eval": {"suite": "math-holdout", "min_accuracy": 0.5}})
    error(leak, 400, "eval_train_overlap")
    # train-set-eval is a diagnostic on the training data itself: overlap is its point.
    diag = _train(api, {"dataset": "math", "dataset_split": "holdout", "config": {"output_name": "m-r003"},
                        "post_eval": {"suite": "math-holdout", "data_scope": "train-set-eval"}})
    assert diag.status_code == 200, diag.content
    assert Job.objects.count() == 2


def test_a_gate_too_small_to_decide_is_queued_with_a_warning(api, home):
    """A held-out suite under the gate's 20 paired examples can only end inconclusive: the submitter is
    told at submission (queued and dry run), not after training."""
    _suite("tiny-holdout", [_example(1, "What is 100 + 100?")])
    body = {"groups": [group(1), group(2)], "config": {"output_name": "g-r001"},
            "post_eval": {"suite": "tiny-holdout", "min_accuracy": 0.5}}
    plan = _train(api, {**body, "dry_run": True}).json()
    queued = _train(api, body).json()
    for answer in (plan, queued):
        assert [w for w in answer["warnings"] if "tiny-holdout" in w] == [
            "post_eval.suite 'tiny-holdout' has 1 example; the held-out gate needs at least 20 paired examples to "
            "decide, so it will end inconclusive and the adapter will be kept, not promoted"]
    _suite("big-holdout", [_example(i, f"What is {i} + {i}?") for i in range(100, 120)])
    queued = _train(api, {**body, "config": {"output_name": "g-r002"}, "post_eval": {"suite": "big-holdout"}}).json()
    assert queued["warnings"] == []


def test_a_suite_a_queued_gate_needs_is_neither_deleted_nor_replaced(api, home):
    """Deleted (or replaced with other examples) while a training with post_eval on it waited, its gate
    could only end `error` after the whole training."""
    examples = [_example(i, f"What is {i} + {i}?") for i in range(100, 120)]
    _suite("held", examples)
    queued = _train(api, {"groups": [group(1), group(2)], "config": {"output_name": "h-r001"},
                          "post_eval": {"suite": "held"}}).json()
    refused = api.delete("/v1/eval/suites/held")
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "eval_suite_in_use"
    assert queued["job_id"] in refused.json()["error"]["message"]
    replaced = api.post("/v1/eval/suites", data=json.dumps({"name": "held", "scorer": {"type": "exact"},
                                                            "examples": examples[:5]}),
                        content_type="application/json")
    assert replaced.status_code in (400, 409)  # exists without force
    from core.errors import KilnError
    from evaluations.suite_services import suite_store

    with pytest.raises(KilnError) as forced:
        suite_store(body={"name": "held", "scorer": {"type": "exact"}, "examples": examples[:5]}, force=True)
    assert forced.value.code == "eval_suite_in_use"
    suite_store(body={"name": "held", "scorer": {"type": "exact"}, "examples": examples}, force=True)  # same: fine
    Job.objects.filter(uuid=queued["job_id"]).update(state="cancelled")
    assert api.delete("/v1/eval/suites/held").status_code == 200
