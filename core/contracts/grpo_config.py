"""`GrpoConfig`: every field of spec §3 with its default, validation, and the receipt form.

Pure Python: imports neither torch nor Django, so any process can validate a submission.
`GrpoConfig.from_dict` accepts and ignores unknown keys (recording them in `ignored_keys`) and
raises `GrpoConfigError(field, message)` for every invalid value or combination. Direct
construction validates too (`__post_init__`). `to_dict()` is the full effective config with every
default filled in; `from_dict(to_dict())` gives an equal config.
"""

from __future__ import annotations

import dataclasses
import difflib
import secrets
from dataclasses import dataclass, field
from typing import Any

from core.contracts.grpo_values import (
    GRPO_DEFAULT_LEARNING_RATE,
    LEARNING_RATE_BAND,
    MAX_CHECKPOINT_INTERVAL,
    MAX_CHECKPOINT_KEEP_LAST,
    MAX_GRAD_CHECKPOINT_SEGMENTS,
    MAX_LORA_ALPHA,
    MAX_LORA_RANK,
    MAX_REWARD_FILTER_MIN_GROUPS,
    EchoConfig,
    GrpoConfigError,
    KlReferencePolicy,
    LossConfig,
    OptimizerConfig,
    check_bool,
    check_choice,
    check_int,
    check_name,
    check_number,
    check_optional_number,
    check_range,
    default_learning_rate,
)

__all__ = [
    "EchoConfig",
    "GrpoConfig",
    "GrpoConfigError",
    "KlReferencePolicy",
    "LossConfig",
    "OptimizerConfig",
    "comparable_config",
    "ignored_key_warnings",
    "resolve_effective_seed",
]

BEHAVIOR_POLICIES = ("no_importance_correction", "recorded")
IS_LEVELS = ("token", "sequence", "cispo")
ADVANTAGE_MODES = ("dr_grpo", "vanilla")
LOSS_AGGREGATIONS = ("token_level", "per_sample")
KL_ESTIMATORS = ("k1", "k3", "none")
REWARD_FILTER_ON_EMPTY = ("fail", "train-all", "skip")

# alpha/rank above this is refused unless allow_high_lora_scale (the reference's safety limit).
MAX_LORA_ALPHA_OVER_RANK = 2.0
MAX_SEED = 2**64 - 1
# Past 1 a LoRA step overshoots so far that its weights go inf/NaN (the run fails nan_loss after a
# full queue wait). The largest rate the docs and tests use is 0.2, 2000x the Muon default.
MAX_LEARNING_RATE = 1.0

_NESTED = {"optimizer", "kl_reference_policy", "loss"}


@dataclass(frozen=True)
class GrpoConfig:
    # Field order follows the spec §3 table; to_dict keeps it.
    learning_rate: float | None = None  # None: resolved per optimizer (resolved_learning_rate)
    optimizer: OptimizerConfig = OptimizerConfig()
    behavior_policy: str = "no_importance_correction"
    is_level: str = "token"
    clip_epsilon: float = 0.2
    clip_eps_high: float | None = None
    cispo_max_weight: float = 5.0
    advantage_mode: str = "dr_grpo"
    loss_aggregation: str = "token_level"
    kl_coeff: float = 0.1
    kl_estimator: str = "k1"
    kl_reference_policy: KlReferencePolicy = KlReferencePolicy()
    entropy_aware_kl_quantile: float | None = None
    shared_prefix_reference: bool = True
    dynamic_sampling: bool = True
    reward_filter_var_min: float | None = None
    reward_filter_var_max: float | None = None
    reward_filter_min_groups: int = 1
    reward_filter_on_empty: str = "fail"
    reward_saturation_threshold: float = 0.95
    reward_low_variance_threshold: float = 1e-4
    lora_rank: int = 16
    lora_alpha: float = 32.0
    allow_high_lora_scale: bool = False
    base_adapter: str | None = None
    allow_adapter_shape_conversion: bool = False
    output_name: str | None = None
    auto_load: bool = True
    checkpoint_interval: int | None = None
    checkpoint_keep_last: int = 3  # retention: older checkpoints of the run go (never a resume's source)
    resume_checkpoint: str | None = None
    seed: int | None = None  # from_dict also takes a decimal string; to_dict writes one
    grad_checkpoint_segments: int | None = None
    detect_anomaly: bool = False
    adapter_smoke_test: bool = False
    adapter_smoke_prompts: tuple[str, ...] | None = None
    loss: LossConfig = LossConfig()
    # Top-level (and `loss.`) keys from_dict saw but does not know; not part of the config.
    ignored_keys: tuple[str, ...] = field(default=(), compare=False, repr=False)

    # ---- parsing -----------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: Any) -> GrpoConfig:
        """Parse a JSON object (None or {} gives the defaults). Unknown keys are ignored."""
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise GrpoConfigError("config", f"must be an object, got {type(data).__name__}")
        data = dict(data)
        if "reference_policy" in data:  # legacy alias
            if "kl_reference_policy" in data:
                raise GrpoConfigError("kl_reference_policy", "given together with its alias reference_policy")
            data["kl_reference_policy"] = data.pop("reference_policy")
        names = {f.name for f in dataclasses.fields(cls)} - {"ignored_keys"}
        ignored = sorted(key for key in data if key not in names)
        kwargs: dict[str, Any] = {}
        for key in names & set(data):
            value = data[key]
            if key in _NESTED and value is None:
                raise GrpoConfigError(key, "must be an object, not null")
            kwargs[key] = value
        if "optimizer" in kwargs:
            kwargs["optimizer"] = OptimizerConfig.from_dict(kwargs["optimizer"])
        if "kl_reference_policy" in kwargs:
            kwargs["kl_reference_policy"] = KlReferencePolicy.from_dict(kwargs["kl_reference_policy"])
        if "loss" in kwargs:
            kwargs["loss"] = LossConfig.from_dict(kwargs["loss"], ignored)
        if isinstance(kwargs.get("adapter_smoke_prompts"), list):
            kwargs["adapter_smoke_prompts"] = tuple(kwargs["adapter_smoke_prompts"])
        return cls(**kwargs, ignored_keys=tuple(ignored))

    # ---- validation --------------------------------------------------------------------------

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        for name in ("optimizer", "kl_reference_policy", "loss"):
            expected = {
                "optimizer": OptimizerConfig,
                "kl_reference_policy": KlReferencePolicy,
                "loss": LossConfig,
            }
            if not isinstance(getattr(self, name), expected[name]):
                raise GrpoConfigError(name, f"must be a {expected[name].__name__}")

        if self.learning_rate is not None:  # None: the optimizer's default (resolved_learning_rate)
            set_("learning_rate", check_number("learning_rate", self.learning_rate))
            if self.learning_rate <= 0:
                raise GrpoConfigError("learning_rate", f"must be > 0, got {self.learning_rate}")
            if self.learning_rate > MAX_LEARNING_RATE:
                raise GrpoConfigError(
                    "learning_rate", f"must be within (0, {MAX_LEARNING_RATE:g}], got {self.learning_rate:g}",
                    hint="the optimizers' defaults are 1e-4 (muon) and 1e-5 (adam_w, sgd) at lora_alpha/lora_rank "
                         "2: leave learning_rate out, or null, to use them",
                )
        check_choice("behavior_policy", self.behavior_policy, BEHAVIOR_POLICIES)
        check_choice("is_level", self.is_level, IS_LEVELS)
        set_(
            "clip_epsilon",
            check_range(
                "clip_epsilon", check_number("clip_epsilon", self.clip_epsilon), 0.0, 1.0, hi_open=True
            ),
        )
        set_("clip_eps_high", check_optional_number("clip_eps_high", self.clip_eps_high))
        if self.clip_eps_high is not None and self.clip_eps_high < 0:
            raise GrpoConfigError("clip_eps_high", f"must be >= 0, got {self.clip_eps_high}")
        set_("cispo_max_weight", check_number("cispo_max_weight", self.cispo_max_weight))
        if self.cispo_max_weight <= 0:
            raise GrpoConfigError("cispo_max_weight", f"must be > 0, got {self.cispo_max_weight}")
        check_choice("advantage_mode", self.advantage_mode, ADVANTAGE_MODES)
        check_choice("loss_aggregation", self.loss_aggregation, LOSS_AGGREGATIONS)
        set_("kl_coeff", check_number("kl_coeff", self.kl_coeff))
        if self.kl_coeff < 0:
            raise GrpoConfigError("kl_coeff", f"must be >= 0, got {self.kl_coeff}")
        check_choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        # The behavior policy is never substituted for a missing KL reference.
        if self.kl_penalty_enabled and self.kl_reference_policy.kind == "none":
            raise GrpoConfigError(
                "kl_reference_policy",
                "kind none is allowed only when KL is disabled (kl_estimator none or kl_coeff 0)",
            )
        set_(
            "entropy_aware_kl_quantile",
            check_optional_number("entropy_aware_kl_quantile", self.entropy_aware_kl_quantile),
        )
        if self.entropy_aware_kl_quantile is not None:
            check_range("entropy_aware_kl_quantile", self.entropy_aware_kl_quantile, 0.0, 1.0)
            if not self.kl_penalty_enabled:
                raise GrpoConfigError(
                    "entropy_aware_kl_quantile",
                    "requires KL to be enabled (kl_coeff > 0, kl_estimator k1 or k3)",
                )
        for name in (
            "shared_prefix_reference",
            "dynamic_sampling",
            "allow_high_lora_scale",
            "allow_adapter_shape_conversion",
            "auto_load",
            "detect_anomaly",
            "adapter_smoke_test",
        ):
            check_bool(name, getattr(self, name))

        for name in ("reward_filter_var_min", "reward_filter_var_max"):
            set_(name, check_optional_number(name, getattr(self, name)))
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise GrpoConfigError(name, f"must be >= 0 (it bounds a variance), got {getattr(self, name)}")
        if (
            None not in (self.reward_filter_var_min, self.reward_filter_var_max)
            and self.reward_filter_var_min > self.reward_filter_var_max
        ):
            raise GrpoConfigError("reward_filter_var_min", "must be <= reward_filter_var_max")
        check_int("reward_filter_min_groups", self.reward_filter_min_groups, minimum=1,
                  maximum=MAX_REWARD_FILTER_MIN_GROUPS)
        check_choice("reward_filter_on_empty", self.reward_filter_on_empty, REWARD_FILTER_ON_EMPTY)
        set_(
            "reward_saturation_threshold",
            check_number("reward_saturation_threshold", self.reward_saturation_threshold),
        )
        set_(
            "reward_low_variance_threshold",
            check_number("reward_low_variance_threshold", self.reward_low_variance_threshold),
        )
        if self.reward_low_variance_threshold < 0:
            raise GrpoConfigError("reward_low_variance_threshold", "must be >= 0")

        check_int("lora_rank", self.lora_rank, minimum=1, maximum=MAX_LORA_RANK)
        set_("lora_alpha", check_number("lora_alpha", self.lora_alpha))
        if not 0 < self.lora_alpha <= MAX_LORA_ALPHA:
            raise GrpoConfigError("lora_alpha", f"must be within (0, {MAX_LORA_ALPHA:g}], got {self.lora_alpha}")
        if self.alpha_over_rank > MAX_LORA_ALPHA_OVER_RANK and not self.allow_high_lora_scale:
            raise GrpoConfigError(
                "lora_alpha",
                f"alpha/rank = {self.alpha_over_rank:.3f} exceeds the safety limit {MAX_LORA_ALPHA_OVER_RANK}; "
                "lower lora_alpha, raise lora_rank, or set allow_high_lora_scale",
                code="unsafe_lora_scale",
                hint=f"e.g. lora_alpha {2 * self.lora_rank:g} for lora_rank {self.lora_rank} (the CLI's --lora-rank "
                     f"scales lora_alpha with it)",
            )
        check_name("base_adapter", self.base_adapter)
        check_name("output_name", self.output_name)
        if self.checkpoint_interval is not None:
            check_int("checkpoint_interval", self.checkpoint_interval, minimum=1, maximum=MAX_CHECKPOINT_INTERVAL)
        check_int("checkpoint_keep_last", self.checkpoint_keep_last, minimum=1, maximum=MAX_CHECKPOINT_KEEP_LAST)
        self._check_resume_checkpoint()
        if self.seed is not None:
            # u64 seeds travel as decimal strings (JSON/RFC 8785 numbers stop at 2**53); an
            # integer is accepted too. Either way the config holds an int.
            if isinstance(self.seed, str) and self.seed.isascii() and self.seed.isdigit():
                set_("seed", int(self.seed))
            check_int("seed", self.seed, minimum=0, maximum=MAX_SEED)
        if self.grad_checkpoint_segments is not None:
            check_int("grad_checkpoint_segments", self.grad_checkpoint_segments, minimum=1,
                      maximum=MAX_GRAD_CHECKPOINT_SEGMENTS)
        if self.adapter_smoke_prompts is not None:
            if not isinstance(self.adapter_smoke_prompts, tuple | list) or not all(
                isinstance(p, str) for p in self.adapter_smoke_prompts
            ):
                raise GrpoConfigError("adapter_smoke_prompts", "must be a list of strings or null")
            set_("adapter_smoke_prompts", tuple(self.adapter_smoke_prompts))

    def _check_resume_checkpoint(self) -> None:
        # A basename under the adapter registry, or an absolute path (the trainer checks that an
        # absolute path sits directly beneath the registry; this module does not know where it is).
        value = self.resume_checkpoint
        if value is None:
            return
        if not isinstance(value, str) or not value.strip():
            raise GrpoConfigError("resume_checkpoint", "must be a non-blank string or null")
        if value.startswith("/"):
            if "/../" in value + "/" or "/./" in value + "/" or "\x00" in value:
                raise GrpoConfigError("resume_checkpoint", "absolute path must be normalised")
        else:
            check_name("resume_checkpoint", value)

    # ---- derived values ----------------------------------------------------------------------

    @property
    def kl_penalty_enabled(self) -> bool:
        """KL needs reference log-probs only when it can contribute to the loss."""
        return self.kl_coeff != 0 and self.kl_estimator != "none"

    @property
    def kl_term_active(self) -> bool:
        """Whether the KL term reaches the loss (no_policy_loss drops it with the surrogate), i.e.
        whether the trainer must run the reference forward."""
        return self.kl_penalty_enabled and not self.loss.no_policy_loss

    @property
    def clip_bounds(self) -> tuple[float, float]:
        """(eps_low, eps_high): the PPO/GSPO range is [1 - eps_low, 1 + eps_high]."""
        high = self.clip_epsilon if self.clip_eps_high is None else self.clip_eps_high
        return self.clip_epsilon, high

    @property
    def alpha_over_rank(self) -> float:
        return float(self.lora_alpha) / self.lora_rank

    @property
    def resolved_learning_rate(self) -> float:
        """The explicit learning_rate, exactly; else the optimizer's default for this LoRA scale
        (grpo_values.default_learning_rate: Muon 1e-4 and AdamW 1e-5 at alpha/rank 2, divided by
        (alpha/rank) / 2; SGD 1e-5)."""
        if self.learning_rate is not None:
            return self.learning_rate
        return self.default_learning_rate

    @property
    def default_learning_rate(self) -> float:
        return default_learning_rate(self.optimizer.kind, self.alpha_over_rank)

    @property
    def learning_rate_rule(self) -> str:
        """How resolved_learning_rate was reached, for the receipt."""
        if self.learning_rate is not None:
            return "explicit"
        if self.optimizer.kind == "sgd":
            return "sgd default 1e-5"
        base = GRPO_DEFAULT_LEARNING_RATE[self.optimizer.kind]
        return f"{self.optimizer.kind} default {base:g} x 2 / (lora_alpha / lora_rank)"

    @property
    def warnings(self) -> tuple[str, ...]:
        """Non-fatal findings: the learning-rate band warning (explicit value > 50x off)."""
        if self.learning_rate is None:
            return ()
        default = self.default_learning_rate
        ratio = self.learning_rate / default
        if ratio > LEARNING_RATE_BAND or ratio < 1 / LEARNING_RATE_BAND:
            return (
                f"learning_rate {self.learning_rate:g} is {max(ratio, 1 / ratio):.0f}x "
                f"{'above' if ratio > 1 else 'below'} the {self.optimizer.kind} default {default:g}",
            )
        return ()

    def with_seed(self, seed: int) -> GrpoConfig:
        return dataclasses.replace(self, seed=seed)

    # ---- receipt form ------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The full effective config, JSON-ready (all defaults filled, spec field order)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "ignored_keys":
                continue
            value = getattr(self, f.name)
            if hasattr(value, "to_dict"):
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            elif f.name == "seed" and value is not None:
                value = str(value)  # decimal u64 string, like the API's effective_seed
            out[f.name] = value
        return out


def resolve_effective_seed(config: GrpoConfig) -> int:
    """The seed a run uses: the configured one, else a fresh random u64 to record and return
    (the API reports it as the decimal string `effective_seed`)."""
    return config.seed if config.seed is not None else secrets.randbits(64)


# A resume must be the same run (spec §3.2): it compares effective configs without the fields that
# only say how to run, not what to train. The GPU worker checks it (gpu_runtime.grpo.checkpoint) and
# admission refuses the same request before it queues (training.services).
CONFIG_KEYS_IGNORED_ON_RESUME = ("resume_checkpoint", "checkpoint_interval", "checkpoint_keep_last", "auto_load")


def comparable_config(config_dict: dict) -> dict:
    return {k: v for k, v in config_dict.items() if k not in CONFIG_KEYS_IGNORED_ON_RESUME}


def ignored_key_warnings(keys) -> list[str]:
    """A warning per key `from_dict` ignored (its `ignored_keys`), with the closest field's name:
    unknown keys are accepted (spec §3), but a misspelt one (behavior_polcy) silently leaves its
    field at the default, so the submitter is told."""
    fields = {"": [f.name for f in dataclasses.fields(GrpoConfig) if f.name != "ignored_keys"],
              "loss.": [f.name for f in dataclasses.fields(LossConfig)]}
    out = []
    for key in keys:
        prefix = "loss." if key.startswith("loss.") else ""
        close = difflib.get_close_matches(key.removeprefix(prefix), fields[prefix], n=1)
        what = "a field of config.loss" if prefix else "a GRPO config field"
        guess = f" (did you mean {prefix}{close[0]}?)" if close else ""
        out.append(f"config.{key} is not {what} and was ignored{guess}")
    return out
