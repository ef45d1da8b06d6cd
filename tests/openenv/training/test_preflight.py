"""POST /v1/openenv/training/preflight: the sealed kiln.openenv-training-contract.v1, Kiln's four
overrides, the behavior policy identity, the capacity check, a stable digest, and each refusal with
its training code. No environment is contacted and nothing is reserved."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from core.canonical import json_digest
from core.jobs.models import Job, WorkerHeartbeat
from evaluations.suite_services import suite_store
from openenv.models import OpenEnvRun
from tests.openenv.training.conftest import error_of, publish_adapter

pytestmark = pytest.mark.django_db


def preflight(api, body):
    return api.post("/v1/openenv/training/preflight", data=json.dumps(body), content_type="application/json")


def test_the_receipt_seals_the_effective_config_with_the_four_overrides(api, served):
    config = {"lora_rank": 2, "lora_alpha": 4, "output_name": "other", "base_adapter": "elsewhere",
              "auto_load": False, "behavior_policy": "recorded", "not_a_grpo_key": 1}
    response = preflight(api, {"output_adapter": "counter-agent", "training_config": config})
    assert response.status_code == 200, response.content
    receipt = response.json()
    assert receipt["schema"] == "kiln.openenv-training-preflight.v1"
    effective = receipt["effective_config"]
    assert (effective["output_name"], effective["base_adapter"], effective["auto_load"],
            effective["behavior_policy"]) == ("counter-agent", None, True, "no_importance_correction")
    assert effective["lora_rank"] == 2 and effective["lora_alpha"] == 4.0 and "not_a_grpo_key" not in effective
    assert effective["loss"]["echo"] == {"lambda": 0.05, "env_mask_mode": "env_only", "warning_filter": True}
    assert set(receipt["kiln_overrides"]) == {"output_name", "base_adapter", "auto_load", "behavior_policy"}
    assert receipt["kiln_overrides"]["behavior_policy"] == {"requested": "recorded",
                                                            "effective": "no_importance_correction"}
    assert receipt["behavior_policy"] == {key: served[key] for key in (
        "served_model_id", "base_model_sha256", "inference_config_sha256", "implementation")}
    assert receipt["capacity_reserved"] is False and "post_eval" not in receipt
    assert set(receipt["capacity"]) == {"checked_unix_ms", "queued_jobs", "max_queued_jobs", "tracked_jobs",
                                        "max_tracked_jobs"}
    assert receipt["capacity"]["queued_jobs"] == 0 and receipt["capacity"]["max_tracked_jobs"] == 1024
    contract = receipt["training_contract"]
    assert contract == {"schema": "kiln.openenv-training-contract.v1", "effective_config": effective,
                        "behavior_policy": receipt["behavior_policy"]}
    assert receipt["training_contract_sha256"] == json_digest(contract)

    # The digest is a function of the contract alone: the same request seals the same digest again,
    # another config another one. Nothing was reserved or recorded.
    again = preflight(api, {"output_adapter": "counter-agent", "training_config": config}).json()
    assert again["training_contract_sha256"] == receipt["training_contract_sha256"]
    assert again["capacity"]["checked_unix_ms"] >= receipt["capacity"]["checked_unix_ms"]
    other = preflight(api, {"output_adapter": "counter-agent", "training_config": dict(config, lora_rank=4)}).json()
    assert other["training_contract_sha256"] != receipt["training_contract_sha256"]
    off = preflight(api, {"output_adapter": "counter-agent", "auto_load": False}).json()
    assert off["effective_config"]["auto_load"] is False and off["effective_config"]["lora_rank"] == 16
    assert not Job.objects.exists() and not OpenEnvRun.objects.exists()


def test_a_named_behavior_adapter_is_the_warm_start_and_part_of_the_identity(api, served, home):
    adapter = publish_adapter(home)
    receipt = preflight(api, {"adapter": "counter-agent-v1", "output_adapter": "counter-agent-v2"}).json()
    assert receipt["effective_config"]["base_adapter"] == "counter-agent-v1"
    assert receipt["behavior_policy"]["adapter"] == {"name": "counter-agent-v1",
                                                     "content_sha256": adapter.content_sha256}
    for base in ("base", "none", "null", None):
        assert preflight(api, {"adapter": base, "output_adapter": "x1"}).json()["effective_config"][
            "base_adapter"] is None


def test_unknown_fields_and_bad_values_are_refused_with_training_codes(api, served, home, settings):
    error = error_of(preflight(api, {"output_adapter": "x", "groups": 3}), 400, "training_invalid_request")
    assert error["message"].startswith("groups: unknown field")
    assert error_of(preflight(api, {}), 400, "training_invalid_request")["message"].startswith("output_adapter")
    error_of(preflight(api, {"output_adapter": "a/b"}), 400, "invalid_adapter_name")
    error_of(preflight(api, {"output_adapter": "x", "auto_load": "yes"}), 400, "training_invalid_request")
    bad = error_of(preflight(api, {"output_adapter": "x", "training_config": {"lora_rank": 0}}), 400,
                   "training_invalid_request")
    assert bad["message"].startswith("training_config.lora_rank")
    error_of(preflight(api, {"adapter": "missing", "output_adapter": "x"}), 404, "adapter_not_found")
    publish_adapter(home)
    error_of(preflight(api, {"output_adapter": "counter-agent-v1"}), 409, "adapter_revision_conflict")
    error_of(preflight(api, {"adapter": "counter-agent-v1", "output_adapter": "counter-agent-v1"}), 400,
             "training_invalid_request")
    error_of(preflight(api, {"output_adapter": "x", "post_eval": {"suite": "nope"}}), 404, "eval_suite_not_found")
    error_of(preflight(api, {"output_adapter": "x", "post_eval": {"data_scope": "held-out"}}), 400,
             "training_invalid_request")
    # post_eval is strict here too (the OpenEnv train run seals through this preflight)
    typo = error_of(preflight(api, {"output_adapter": "x", "post_eval": {"suite": "s", "min_acuracy": 0.9}}), 400,
                    "training_invalid_request")
    assert typo["message"].startswith("post_eval.min_acuracy: unknown field 'min_acuracy' (did you mean 'min_accuracy'?)")
    suite_store(body={"name": "held", "scorer": {"type": "exact"},
                      "examples": [{"id": "e1", "messages": [{"role": "user", "content": "hi"}], "target": "0"}]})
    generation = error_of(preflight(api, {"output_adapter": "x", "post_eval": {
        "suite": "held", "generation": {"temprature": 0.5}}}), 400, "training_invalid_request")
    assert generation["message"].startswith("post_eval.generation.temprature: is not a generation setting "
                                            "(did you mean 'temperature'?)")

    settings.KILN = replace(settings.KILN, max_queued_jobs=0)
    response = preflight(api, {"output_adapter": "x"})
    error_of(response, 503, "training_queue_full")
    assert response["Retry-After"] == "30"
    settings.KILN = replace(settings.KILN, max_queued_jobs=32)
    WorkerHeartbeat.objects.all().delete()
    error_of(preflight(api, {"output_adapter": "x"}), 503, "inference_unavailable")
    settings.KILN = replace(settings.KILN, model_path=None)
    error_of(preflight(api, {"output_adapter": "x"}), 503, "mock_mode")


def test_an_unsafe_lora_scale_says_what_alpha_would_do(api, served):
    # The API does not scale lora_alpha with lora_rank as the CLI's --lora-rank does: rank 4 keeps the
    # default alpha 32 (8x). The refusal says which alpha fits.
    error = error_of(preflight(api, {"output_adapter": "x", "training_config": {"lora_rank": 4}}), 400,
                     "unsafe_lora_scale")
    assert error["message"].startswith("training_config.lora_alpha: alpha/rank = 8.000")
    assert error["hint"] == "e.g. lora_alpha 8 for lora_rank 4 (the CLI's --lora-rank scales lora_alpha with it)"
    ok = preflight(api, {"output_adapter": "x", "training_config": {"lora_rank": 4, "lora_alpha": 8}})
    assert ok.status_code == 200, ok.content


def test_a_second_train_run_for_the_same_output_is_refused_before_any_episode(api, served, home):
    from tests.openenv.training.conftest import post_run, train_body

    url = "http://127.0.0.1:9"  # nobody listens: nothing here is executed
    first = post_run(api, train_body(url, idempotency_key="a"))
    assert first.status_code == 202, first.content
    second = post_run(api, train_body(url, idempotency_key="b", seed_start=500))
    error = error_of(second, 409, "adapter_revision_conflict")
    assert first.json()["run_id"] in error["message"] and error["hint"]
    assert OpenEnvRun.objects.count() == 1
    assert post_run(api, train_body(url, idempotency_key="a")).status_code == 200  # the exact retry still answers
    api.delete(f"/v1/openenv/runs/{first.json()['run_id']}")
    assert post_run(api, train_body(url, idempotency_key="c", seed_start=500)).status_code == 202


def test_a_behavior_adapter_of_another_lora_shape_is_refused_at_preflight(api, served, home):
    """It collected every episode and then failed `shape_mismatch` at training."""
    publish_adapter(home)  # rank 16, alpha 32
    response = preflight(api, {"adapter": "counter-agent-v1", "output_adapter": "counter-agent-v2",
                               "training_config": {"lora_rank": 8, "lora_alpha": 16}})
    error = error_of(response, 400, "training_invalid_request")
    assert error["message"].startswith("training_config.lora_rank: a warm start keeps the base adapter's LoRA shape")
    assert "--lora-rank" in error["hint"]
    assert preflight(api, {"adapter": "counter-agent-v1", "output_adapter": "counter-agent-v2"}).status_code == 200
