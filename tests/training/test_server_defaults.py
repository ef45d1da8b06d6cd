"""The server's GRPO training defaults (issue 17): `[training.defaults]` in kiln.toml or
KILN_TRAINING_DEFAULTS, checked at startup; every submission's effective config is GrpoConfig's
defaults <- the server's table <- the request's explicit fields, on the typed and the streamed
(dataset_path, `kiln train grpo --file`) routes alike; /v1/config shows the table, the job detail
shows the merged config, and the train receipt says where each field came from. Also the
learning-rate rule for a config without one (Muon and AdamW scaled by the LoRA scale)."""

from __future__ import annotations

import dataclasses
import json
from argparse import Namespace
from pathlib import Path

import pytest

from core.contracts.grpo_config import GrpoConfig
from core.jobs.models import Job
from kiln_project.config import ConfigError, load_config
from tests.training.conftest import GROUP
from training.config_defaults import apply_training_defaults

DEMO = {"optimizer": {"kind": "adam_w"}, "learning_rate": 3e-5, "kl_coeff": 0.05}


# ---- parsing ---------------------------------------------------------------------------------


def _load(tmp_path, toml: str, **env):
    (tmp_path / "kiln.toml").write_text(toml)
    return load_config({"KILN_HOME": str(tmp_path / "home"), "KILN_CONFIG": str(tmp_path / "kiln.toml"), **env})


def test_the_table_is_parsed_and_checked_as_a_grpo_config(tmp_path):
    config = _load(tmp_path, '[training]\ndataset_roots = []\n[training.defaults]\noptimizer = { kind = "adam_w" }\n'
                             'learning_rate = 3e-5\nkl_coeff = 0.05\n')
    assert config.training_defaults == DEMO
    assert config.public_dict()["training_defaults"] == DEMO
    assert _load(tmp_path, "").training_defaults == {}
    # the environment variable (a JSON object) replaces the table whole
    env = _load(tmp_path, "[training.defaults]\nkl_coeff = 0.05\n", KILN_TRAINING_DEFAULTS='{"lora_rank": 8, "lora_alpha": 16}')
    assert env.training_defaults == {"lora_rank": 8, "lora_alpha": 16}


@pytest.mark.parametrize(("toml", "env", "needle"), [
    ("[training.defaults]\nnot_a_knob = 1\n", None, "[training.defaults] not_a_knob: is not a GRPO config field"),
    ("[training.defaults]\nlora_rank = \"16\"\n", None, "[training.defaults] lora_rank: must be an integer"),
    ("[training.defaults]\nlearning_rate = -1.0\n", None, "[training.defaults] learning_rate: must be > 0"),
    ("[training.defaults]\noptimizer = { kind = \"adam_w\", momentum = 0.9 }\n", None,
     "[training.defaults] optimizer.momentum"),
    ("[training.defaults]\nkl_coeff = 0.1\nkl_reference_policy = \"none\"\n", None,
     "[training.defaults] kl_reference_policy"),
    ("[training.defaults]\noutput_name = \"math-r001\"\n", None, "[training.defaults] output_name: names one run"),
    ("[training.defaults]\nbase_adapter = \"a\"\n", None, "base_adapter: names one run"),
    ("[training.defaults]\nseed = 3\n", None, "seed: names one run"),
    ("[training]\ndefaults = 3\n", None, "[training.defaults]: must be a table"),
    ("", '{"resume_checkpoint": "x"}', "KILN_TRAINING_DEFAULTS resume_checkpoint: names one run"),
    ("", "[1]", "KILN_TRAINING_DEFAULTS: must be a table"),
    ("", "{not json", "KILN_TRAINING_DEFAULTS must be a JSON object"),
])
def test_a_bad_table_is_a_config_error_naming_the_key(tmp_path, toml, env, needle):
    extra = {} if env is None else {"KILN_TRAINING_DEFAULTS": env}
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, toml, **extra)
    assert needle in str(caught.value)


# ---- the merge -------------------------------------------------------------------------------


def test_request_over_server_defaults_over_built_in():
    merged, sources = apply_training_defaults({"kl_coeff": 0.2, "output_name": "r1"}, DEMO)
    config = GrpoConfig.from_dict(merged)
    assert config.kl_coeff == 0.2 and sources["kl_coeff"] == "request"  # the request wins
    assert config.optimizer.kind == "adam_w" and sources["optimizer"] == "server_defaults"
    assert config.resolved_learning_rate == 3e-5 and sources["learning_rate"] == "server_defaults"
    assert config.lora_rank == 16 and sources["lora_rank"] == "default"  # nobody set it
    assert sources["output_name"] == "request" and set(sources) == set(config.to_dict())
    # no config at all: the server's table; no table: the request as sent
    assert apply_training_defaults(None, DEMO)[0] == DEMO
    assert apply_training_defaults({"kl_coeff": 0.2}, {}) == ({"kl_coeff": 0.2}, {
        **dict.fromkeys(GrpoConfig().to_dict(), "default"), "kl_coeff": "request"})
    # a nested object the request gives replaces the server's whole
    merged, sources = apply_training_defaults({"optimizer": {"kind": "adam_w", "beta2": 0.98}}, DEMO)
    assert merged["optimizer"] == {"kind": "adam_w", "beta2": 0.98} and merged["learning_rate"] == 3e-5
    # ... and the server's learning rate, chosen for its optimizer, does not follow a request to another
    merged, sources = apply_training_defaults({"optimizer": {"kind": "muon"}}, DEMO)
    assert "learning_rate" not in merged and sources["learning_rate"] == "default"
    assert GrpoConfig.from_dict(merged).resolved_learning_rate == 1e-4
    # the legacy alias counts as the request's kl_reference_policy
    _, sources = apply_training_defaults({"reference_policy": "none", "kl_coeff": 0},
                                         {"kl_reference_policy": {"kind": "ema"}})
    assert sources["kl_reference_policy"] == "request"


# ---- the routes ------------------------------------------------------------------------------


@pytest.fixture
def served_defaults(settings):
    settings.KILN = dataclasses.replace(settings.KILN, training_defaults=dict(DEMO))
    return settings


def _post(api, body):
    return api.post("/v1/train/grpo", data=json.dumps(body), content_type="application/json")


@pytest.mark.django_db
def test_the_typed_route_applies_the_defaults_and_the_detail_shows_the_merge(api, served_defaults):
    response = _post(api, {"groups": [GROUP], "config": {"output_name": "typed-d1", "kl_coeff": 0.2}})
    assert response.status_code == 200, response.content
    job_id = response.json()["job_id"]
    payload = Job.objects.get(uuid=job_id).payload
    assert payload["config"]["optimizer"]["kind"] == "adam_w" and payload["config"]["learning_rate"] == 3e-5
    assert payload["config"]["kl_coeff"] == 0.2
    assert payload["config_sources"]["kl_coeff"] == "request"
    assert payload["config_sources"]["learning_rate"] == "server_defaults"
    assert payload["server_training_defaults"] == DEMO
    detail = api.get(f"/v1/train/jobs/{job_id}").json()
    assert detail["effective_config"] == payload["config"]
    assert detail["config_sources"]["optimizer"] == "server_defaults"
    assert detail["server_training_defaults"] == DEMO
    # an invalid combination of a request and the server's table says so
    bad = _post(api, {"groups": [GROUP], "config": {"optimizer": {"kind": "adam_w", "momentum": 0.9}}})
    assert bad.status_code == 400 and "optimizer.momentum" in bad.json()["error"]["message"]
    assert "[training.defaults]" in bad.json()["error"]["hint"]


@pytest.mark.django_db
def test_the_streamed_file_route_applies_them_too(api, served_defaults, tmp_path):
    from kiln_project.cli.train_cmd import build_request

    path = tmp_path / "groups.jsonl"
    path.write_text(json.dumps(GROUP) + "\n")
    # what `kiln train grpo --file groups.jsonl --adapter file-d1` sends: the streamed route
    args = Namespace(file=path, adapter="file-d1", lora_rank=None, checkpoint_interval=None,
                     resume_checkpoint=None, no_shared_prefix_reference=False)
    inline = build_request(args)
    body = {**{k: v for k, v in inline.items() if k != "groups"}, "dataset_path": str(path.resolve())}
    response = _post(api, body)
    assert response.status_code == 200, response.content
    payload = Job.objects.get(uuid=response.json()["job_id"]).payload
    assert payload["training_data"]["source"] == "dataset_path"
    assert payload["config"]["optimizer"]["kind"] == "adam_w" and payload["config"]["kl_coeff"] == 0.05
    assert payload["config_sources"]["behavior_policy"] == "request"  # the CLI sets it explicitly
    assert payload["config_sources"]["kl_coeff"] == "server_defaults"


@pytest.mark.django_db
def test_get_config_shows_the_table(api, served_defaults):
    body = api.get("/v1/config").json()
    assert body["training_defaults"] == DEMO
    assert body["config"]["training_defaults"] == DEMO


# ---- the receipt -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_train_receipt_records_the_sources(api, settings, tmp_path, tiny_model_dir):
    from core.jobs.runner import run_queued_jobs
    from core.models import Receipt

    table = {"optimizer": {"kind": "adam_w"}, "learning_rate": 3e-5, "lora_alpha": 4}
    settings.KILN = dataclasses.replace(settings.KILN, home=tmp_path / "home", model_path=Path(tiny_model_dir),
                                        training_defaults=table)
    groups = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
               "completions": [{"text": str(2 * i), "reward": 1.0}, {"text": str(2 * i + 1), "reward": 0.0}]}
              for i in range(2)]
    body = {"groups": groups, "config": {"output_name": "defaults-r001", "lora_rank": 2, "auto_load": False,
                                         "seed": 1}}
    response = _post(api, body)
    assert response.status_code == 200, response.content
    run_queued_jobs("gpu")
    job = Job.objects.get(uuid=response.json()["job_id"])
    assert job.state == "completed", (job.error_code, job.error_message)
    receipt = Receipt.objects.get(kind="train", subject="defaults-r001").body
    sources = receipt["config_sources"]
    assert sources["lora_rank"] == "request" and sources["output_name"] == "request"
    assert sources["learning_rate"] == sources["optimizer"] == sources["lora_alpha"] == "server_defaults"
    assert sources["kl_coeff"] == "default"
    assert receipt["server_training_defaults"] == table
    assert receipt["config"]["lora_alpha"] == 4.0 and receipt["config"]["optimizer"]["kind"] == "adam_w"
    assert receipt["hyperparameters"]["learning_rate"] == 3e-5
    assert receipt["hyperparameters"]["learning_rate_rule"] == "explicit"
    on_disk = json.loads((Path(job.result["adapter_path"]) / "train_receipt.json").read_text())
    assert on_disk["config_sources"] == sources


# ---- the learning-rate rule ------------------------------------------------------------------


@pytest.mark.parametrize(("config", "expected"), [
    ({}, 1e-4),  # rank 16, alpha 32: the reference scale 2
    ({"lora_alpha": 16}, 2e-4),  # scale 1: twice the rate, the same weight update per step
    ({"lora_rank": 4, "lora_alpha": 8}, 1e-4),  # scale 2 at another rank: the same rate
    ({"lora_rank": 8, "lora_alpha": 4}, 4e-4),
    ({"optimizer": {"kind": "adam_w"}}, 1e-5),
    ({"optimizer": {"kind": "adam_w"}, "lora_alpha": 16}, 2e-5),
    ({"optimizer": {"kind": "sgd"}, "lora_alpha": 16}, 1e-5),  # SGD's step carries the scale itself
    ({"learning_rate": 2e-3}, 2e-3),  # explicit: exactly that
    ({"learning_rate": 2e-3, "lora_alpha": 8}, 2e-3),
])
def test_the_default_learning_rate_follows_the_lora_scale(config, expected):
    resolved = GrpoConfig.from_dict(config)
    assert resolved.resolved_learning_rate == pytest.approx(expected, rel=1e-12)
    assert (resolved.learning_rate_rule == "explicit") == ("learning_rate" in config)
    # the product the study holds fixed: scale x rate (Muon and AdamW defaults)
    if "learning_rate" not in config and resolved.optimizer.kind != "sgd":
        assert resolved.alpha_over_rank * resolved.resolved_learning_rate == pytest.approx(
            2 * {"muon": 1e-4, "adam_w": 1e-5}[resolved.optimizer.kind])
