"""GrpoConfig: spec §3 defaults, validation naming the field, unknown keys, receipt round trip."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.canonical import canonical_json
from core.contracts.grpo_config import GrpoConfig, GrpoConfigError, resolve_effective_seed


def test_defaults_match_spec():
    c = GrpoConfig.from_dict({})
    d = c.to_dict()
    assert d["learning_rate"] is None and c.resolved_learning_rate == 1e-4  # Muon default at alpha/rank 2 (issue 17)
    assert d["optimizer"] == {
        "kind": "muon",
        "momentum": 0.95,
        "nesterov": True,
        "ns_iters": 5,
        "weight_decay": 0.0,
    }
    assert d["behavior_policy"] == "no_importance_correction"
    assert d["is_level"] == "token"
    assert (d["clip_epsilon"], d["clip_eps_high"], d["cispo_max_weight"]) == (0.2, None, 5.0)
    assert d["advantage_mode"] == "dr_grpo" and d["loss_aggregation"] == "token_level"
    assert (d["kl_coeff"], d["kl_estimator"]) == (0.1, "k1")
    assert d["kl_reference_policy"] == {"kind": "base_per_step"}
    assert d["entropy_aware_kl_quantile"] is None
    assert d["shared_prefix_reference"] is True and d["dynamic_sampling"] is True
    assert (d["reward_filter_var_min"], d["reward_filter_var_max"]) == (None, None)
    assert (d["reward_filter_min_groups"], d["reward_filter_on_empty"]) == (1, "fail")
    assert (d["reward_saturation_threshold"], d["reward_low_variance_threshold"]) == (0.95, 1e-4)
    assert (d["lora_rank"], d["lora_alpha"]) == (16, 32.0)
    assert d["base_adapter"] is None and d["output_name"] is None and d["auto_load"] is True
    assert d["checkpoint_interval"] is None and d["resume_checkpoint"] is None and d["seed"] is None
    assert d["detect_anomaly"] is False and d["adapter_smoke_test"] is False
    assert d["loss"] == {
        "echo": {"lambda": 0.05, "env_mask_mode": "env_only", "warning_filter": True},
        "no_policy_loss": False,
        "opd": None,
    }
    assert GrpoConfig.from_dict(None) == GrpoConfig() == c


def test_unknown_keys_are_ignored_and_recorded():
    c = GrpoConfig.from_dict({"epochs": 3, "kl_coeff": 0.2, "loss": {"future_term": 1}})
    assert c.kl_coeff == 0.2
    assert c.ignored_keys == ("epochs", "loss.future_term")
    assert "epochs" not in c.to_dict()


def test_optimizer_variants_and_learning_rate_resolution():
    adam = GrpoConfig.from_dict({"optimizer": {"kind": "adam_w", "beta2": 0.98}})
    assert adam.to_dict()["optimizer"] == {
        "kind": "adam_w",
        "beta1": 0.9,
        "beta2": 0.98,
        "eps": 1e-8,
        "weight_decay": 0.0,
    }
    assert adam.resolved_learning_rate == 1e-5
    assert GrpoConfig.from_dict({"optimizer": {"kind": "sgd"}}).resolved_learning_rate == 1e-5
    assert GrpoConfig.from_dict({"learning_rate": 3e-4}).resolved_learning_rate == 3e-4
    assert GrpoConfig.from_dict({"learning_rate": 3e-3}).warnings == ()
    (warning,) = GrpoConfig.from_dict({"learning_rate": 0.2}).warnings  # 2000x the Muon default
    assert "2000x above" in warning


def test_kl_reference_policy_forms():
    ema = GrpoConfig.from_dict({"kl_reference_policy": {"kind": "ema"}})
    assert ema.to_dict()["kl_reference_policy"] == {"kind": "ema", "decay": 0.0, "refresh_every": 32}
    alias = GrpoConfig.from_dict({"reference_policy": {"kind": "ema", "decay": 0.9, "refresh_every": 8}})
    assert alias.kl_reference_policy.decay == 0.9 and alias.kl_reference_policy.refresh_every == 8
    off = GrpoConfig.from_dict({"kl_reference_policy": "none", "kl_estimator": "none"})
    assert off.to_dict()["kl_reference_policy"] == {"kind": "none"} and not off.kl_penalty_enabled
    assert (
        GrpoConfig.from_dict(
            {"kl_reference_policy": {"kind": "none"}, "kl_coeff": 0}
        ).kl_reference_policy.kind
        == "none"
    )


def test_clip_bounds_and_derived_flags():
    assert GrpoConfig().clip_bounds == (0.2, 0.2)
    assert GrpoConfig.from_dict({"clip_eps_high": 0.28}).clip_bounds == (0.2, 0.28)
    assert GrpoConfig.from_dict({"loss": {"echo": None}}).loss.echo_enabled is False
    assert GrpoConfig.from_dict({"loss": {"echo": {"lambda": 0.0}}}).loss.echo_enabled is False
    nopol = GrpoConfig.from_dict({"loss": {"no_policy_loss": True}})
    assert nopol.loss.no_policy_loss and nopol.loss.echo_lambda == 0.05


INVALID = [
    ({"behavior_policy": "teacher"}, "behavior_policy"),
    ({"is_level": "gspo"}, "is_level"),
    ({"advantage_mode": "grpo"}, "advantage_mode"),
    ({"loss_aggregation": "sum"}, "loss_aggregation"),
    ({"kl_estimator": "k2"}, "kl_estimator"),
    ({"reward_filter_on_empty": "ignore"}, "reward_filter_on_empty"),
    ({"clip_epsilon": -0.1}, "clip_epsilon"),
    ({"clip_epsilon": 1.0}, "clip_epsilon"),
    ({"clip_epsilon": math.inf}, "clip_epsilon"),
    ({"clip_epsilon": "0.2"}, "clip_epsilon"),
    ({"clip_eps_high": -0.01}, "clip_eps_high"),
    ({"clip_eps_high": math.nan}, "clip_eps_high"),
    ({"cispo_max_weight": 0}, "cispo_max_weight"),
    ({"cispo_max_weight": -1}, "cispo_max_weight"),
    ({"kl_coeff": -0.1}, "kl_coeff"),
    ({"kl_coeff": math.nan}, "kl_coeff"),
    ({"kl_coeff": True}, "kl_coeff"),
    ({"kl_reference_policy": "none"}, "kl_reference_policy"),
    ({"kl_reference_policy": {"kind": "none"}, "kl_estimator": "k3"}, "kl_reference_policy"),
    ({"kl_reference_policy": {"kind": "frozen"}}, "kl_reference_policy.kind"),
    ({"kl_reference_policy": {"kind": "ema", "decay": 1.5}}, "kl_reference_policy.decay"),
    ({"kl_reference_policy": {"kind": "ema", "refresh_every": 0}}, "kl_reference_policy.refresh_every"),
    ({"kl_reference_policy": {}, "reference_policy": {}}, "kl_reference_policy"),
    ({"kl_reference_policy": None}, "kl_reference_policy"),
    ({"entropy_aware_kl_quantile": 1.5}, "entropy_aware_kl_quantile"),
    ({"entropy_aware_kl_quantile": 0.8, "kl_estimator": "none"}, "entropy_aware_kl_quantile"),
    ({"entropy_aware_kl_quantile": 0.8, "kl_coeff": 0}, "entropy_aware_kl_quantile"),
    ({"dynamic_sampling": "yes"}, "dynamic_sampling"),
    ({"shared_prefix_reference": 1}, "shared_prefix_reference"),
    ({"reward_filter_var_min": -1}, "reward_filter_var_min"),
    ({"reward_filter_var_max": math.inf}, "reward_filter_var_max"),
    ({"reward_filter_var_min": 0.5, "reward_filter_var_max": 0.1}, "reward_filter_var_min"),
    ({"reward_filter_min_groups": 0}, "reward_filter_min_groups"),
    ({"reward_saturation_threshold": math.nan}, "reward_saturation_threshold"),
    ({"lora_rank": 0}, "lora_rank"),
    ({"lora_rank": 16.0}, "lora_rank"),
    ({"lora_alpha": 0}, "lora_alpha"),
    ({"lora_alpha": 64}, "lora_alpha"),  # alpha/rank 4 > 2 without allow_high_lora_scale
    ({"learning_rate": 0}, "learning_rate"),
    ({"learning_rate": -1e-5}, "learning_rate"),
    ({"learning_rate": math.inf}, "learning_rate"),
    ({"optimizer": {"kind": "adam"}}, "optimizer.kind"),
    ({"optimizer": {"kind": "sgd", "momentum": 0.9}}, "optimizer.momentum"),
    ({"optimizer": {"kind": "muon", "ns_iters": 0}}, "optimizer.ns_iters"),
    ({"optimizer": {"kind": "muon", "ns_iters": 21}}, "optimizer.ns_iters"),
    ({"optimizer": {"kind": "muon", "momentum": 1.0}}, "optimizer.momentum"),
    ({"optimizer": {"kind": "adam_w", "beta1": 1.0}}, "optimizer.beta1"),
    ({"optimizer": {"kind": "adam_w", "eps": 0}}, "optimizer.eps"),
    ({"optimizer": {"kind": "adam_w", "weight_decay": -0.1}}, "optimizer.weight_decay"),
    ({"optimizer": "muon"}, "optimizer"),
    ({"checkpoint_interval": 0}, "checkpoint_interval"),
    ({"checkpoint_interval": 2.5}, "checkpoint_interval"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**64}, "seed"),
    ({"seed": "-1"}, "seed"),
    ({"seed": "4.2"}, "seed"),
    ({"seed": 4.0}, "seed"),
    ({"output_name": "  "}, "output_name"),
    ({"output_name": "a/b"}, "output_name"),
    ({"base_adapter": ".."}, "base_adapter"),
    ({"resume_checkpoint": "../x.kiln-checkpoint"}, "resume_checkpoint"),
    ({"resume_checkpoint": "/a/../b"}, "resume_checkpoint"),
    ({"grad_checkpoint_segments": 0}, "grad_checkpoint_segments"),
    ({"adapter_smoke_prompts": [1, 2]}, "adapter_smoke_prompts"),
    ({"loss": {"opd": {"lambda": 1.0}}}, "loss.opd"),
    ({"loss": {"echo": None, "no_policy_loss": True}}, "loss.no_policy_loss"),
    ({"loss": {"echo": {"lambda": 0}, "no_policy_loss": True}}, "loss.no_policy_loss"),
    ({"loss": {"echo": {"lambda": -0.05}}}, "loss.echo.lambda"),
    ({"loss": {"echo": {"env_mask_mode": "all"}}}, "loss.echo.env_mask_mode"),
    ({"loss": {"echo": {"warning_filter": "on"}}}, "loss.echo.warning_filter"),
    ({"loss": None}, "loss"),
]


@pytest.mark.parametrize(("data", "field"), INVALID, ids=[f"{f}-{i}" for i, (_, f) in enumerate(INVALID)])
def test_invalid_values_name_their_field(data, field):
    with pytest.raises(GrpoConfigError) as caught:
        GrpoConfig.from_dict(data)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_error_codes_for_policy_failures():
    with pytest.raises(GrpoConfigError) as caught:
        GrpoConfig.from_dict({"lora_rank": 8})  # the UI's rank 8 with the default alpha 32
    assert caught.value.code == "unsafe_lora_scale"
    assert GrpoConfig.from_dict({"lora_rank": 8, "allow_high_lora_scale": True}).alpha_over_rank == 4.0
    with pytest.raises(GrpoConfigError) as caught:
        GrpoConfig.from_dict({"loss": {"echo": None, "no_policy_loss": True}})
    assert caught.value.code == "unsupported_loss_config"


def test_non_object_config_is_rejected():
    with pytest.raises(GrpoConfigError) as caught:
        GrpoConfig.from_dict([1])
    assert caught.value.field == "config"


def test_direct_construction_validates_too():
    with pytest.raises(GrpoConfigError) as caught:
        GrpoConfig(clip_epsilon=2.0)
    assert caught.value.field == "clip_epsilon"


def test_resume_checkpoint_accepts_basename_or_absolute_path():
    name = "math-r001-checkpoint-step-00000025.kiln-checkpoint"
    assert GrpoConfig.from_dict({"resume_checkpoint": name}).resume_checkpoint == name
    assert GrpoConfig.from_dict({"resume_checkpoint": f"/srv/adapters/{name}"}).resume_checkpoint.endswith(
        name
    )


def test_effective_seed():
    assert resolve_effective_seed(GrpoConfig(seed=42)) == 42
    seed = resolve_effective_seed(GrpoConfig())
    assert 0 <= seed < 2**64
    assert GrpoConfig().with_seed(seed).to_dict()["seed"] == str(seed)  # decimal u64 string
    assert GrpoConfig.from_dict({"seed": "18446744073709551615"}).seed == 2**64 - 1
    assert GrpoConfig.from_dict({"seed": 7}) == GrpoConfig.from_dict({"seed": "7"})


def test_to_dict_is_canonical_json_ready():
    c = GrpoConfig.from_dict({"kl_reference_policy": {"kind": "ema", "decay": 0.5}, "seed": 2**64 - 1})
    assert json.loads(json.dumps(c.to_dict())) == c.to_dict()
    assert canonical_json(c.to_dict())


finite = st.floats(min_value=0, max_value=10, allow_nan=False)
config_dicts = st.fixed_dictionaries(
    {},
    optional={
        "clip_epsilon": st.floats(min_value=0, max_value=0.99),
        "clip_eps_high": st.none() | finite,
        "cispo_max_weight": st.floats(min_value=0.01, max_value=100),
        "kl_coeff": finite,
        "kl_estimator": st.sampled_from(["k1", "k3", "none"]),
        "is_level": st.sampled_from(["token", "sequence", "cispo"]),
        "behavior_policy": st.sampled_from(["recorded", "no_importance_correction"]),
        "advantage_mode": st.sampled_from(["dr_grpo", "vanilla"]),
        "loss_aggregation": st.sampled_from(["token_level", "per_sample"]),
        "optimizer": st.sampled_from(
            [{"kind": "sgd"}, {"kind": "adam_w", "eps": 1e-6}, {"kind": "muon", "ns_iters": 3}]
        ),
        "kl_reference_policy": st.sampled_from(
            [{"kind": "base_per_step"}, {"kind": "ema", "decay": 0.25, "refresh_every": 4}]
        ),
        "seed": st.none() | st.integers(min_value=0, max_value=2**64 - 1),
        "lora_rank": st.integers(min_value=16, max_value=64),
        "loss": st.sampled_from(
            [{}, {"echo": None}, {"echo": {"lambda": 0.01, "env_mask_mode": "full_obs"}}]
        ),
        "unknown_key": st.integers(),
    },
)


@settings(max_examples=60, deadline=None)
@given(config_dicts)
def test_round_trip_through_to_dict(data):
    config = GrpoConfig.from_dict(data)
    again = GrpoConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert again.to_dict() == config.to_dict()


def test_pure_modules_do_not_import_torch():
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, core.contracts.grpo_config, gpu_runtime.grpo.advantages, gpu_runtime.grpo.masks,"
        " gpu_runtime.grpo.audit, core.contracts.grpo_submission;"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'django', 'transformers'));"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
