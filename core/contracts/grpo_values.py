"""Typed value checks and the nested GrpoConfig parts (optimizer, KL reference, loss/ECHO).

Pure Python: imports neither torch nor Django. `GrpoConfigError` names the offending field with
its dotted path (e.g. `optimizer.beta1`, `loss.echo.lambda`) so API errors can point at it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class GrpoConfigError(ValueError):
    """An invalid GrpoConfig value or combination. `field` is the dotted path of the culprit."""

    def __init__(self, field: str, message: str, *, code: str = "training_invalid_request", hint: str = ""):
        self.field = field
        self.message = message
        self.code = code
        self.hint = hint
        super().__init__(f"{field}: {message}")


# ---- scalar checks (JSON semantics: bool is never a number, a float is never an integer) ----


# Upper bounds checked at submission, so no request is queued that a worker cannot run (a rank of
# 2**40 would try to allocate terabytes). Shown as `maximum` in the OpenAPI document.
MAX_LORA_RANK = 1024
MAX_LORA_ALPHA = 65536.0
MAX_CHECKPOINT_INTERVAL = 1_000_000  # optimizer steps
MAX_CHECKPOINT_KEEP_LAST = 1000
MAX_REFRESH_EVERY = 1_000_000  # optimizer steps
MAX_REWARD_FILTER_MIN_GROUPS = 100_000  # the most groups a corpus may hold
MAX_GRAD_CHECKPOINT_SEGMENTS = 1024


JSON_KINDS = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"), (list, "an array"),
              (dict, "an object"), (type(None), "null"))


def shown(value: Any) -> str:
    """A refused value as its sender wrote it, with its JSON kind: `'abc' (a string)`, not Python's `str`
    (QA: a form user who typed abc read "got str")."""
    kind = next((name for cls, name in JSON_KINDS if isinstance(value, cls)), type(value).__name__)
    if value is None or isinstance(value, list | dict):
        return kind
    text = ("true" if value else "false") if isinstance(value, bool) else repr(value)
    return f"{text[:40]}... ({kind})" if len(text) > 40 else f"{text} ({kind})"


def check_number(field: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GrpoConfigError(field, f"must be a number, got {shown(value)}")
    try:
        value = float(value)
    except OverflowError:  # an integer too large for a float, e.g. 10**400
        raise GrpoConfigError(field, "must be finite, got an integer beyond the float range") from None
    if not math.isfinite(value):
        raise GrpoConfigError(field, f"must be finite, got {value}")
    return value


def check_optional_number(field: str, value: Any) -> float | None:
    return None if value is None else check_number(field, value)


def check_int(field: str, value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise GrpoConfigError(field, f"must be an integer, got {shown(value)}")
    if minimum is not None and value < minimum:
        raise GrpoConfigError(field, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise GrpoConfigError(field, f"must be <= {maximum}, got {value}")
    return value


def check_bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise GrpoConfigError(field, f"must be true or false, got {shown(value)}")
    return value


def check_choice(field: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise GrpoConfigError(field, f"must be one of {', '.join(choices)}; got {value!r}")
    return value


def check_name(field: str, value: Any) -> str | None:
    """An optional adapter/checkpoint name: a non-blank string that is not a path."""
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise GrpoConfigError(field, "must be a non-blank string or null")
    if "/" in value or "\\" in value or "\x00" in value or value in (".", ".."):
        raise GrpoConfigError(field, f"must be a plain name, not a path; got {value!r}")
    return value


def check_range(field: str, value: float, lo: float, hi: float, *, hi_open: bool = False) -> float:
    if value < lo or value > hi or (hi_open and value == hi):
        bracket = ")" if hi_open else "]"
        raise GrpoConfigError(field, f"must be within [{lo}, {hi}{bracket}, got {value}")
    return value


def check_mapping(field: str, value: Any) -> dict:
    if not isinstance(value, dict):
        raise GrpoConfigError(field, f"must be an object, got {type(value).__name__}")
    return value


# ---- optimizer -------------------------------------------------------------------------------

OPTIMIZER_KINDS = ("muon", "adam_w", "sgd")
# Per-kind keys and defaults (spec §3). Unknown optimizer keys are rejected, unlike top-level keys.
_OPTIMIZER_DEFAULTS: dict[str, dict[str, Any]] = {
    "muon": {"momentum": 0.95, "nesterov": True, "ns_iters": 5, "weight_decay": 0.0},
    "adam_w": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.0},
    "sgd": {},
}


@dataclass(frozen=True)
class OptimizerConfig:
    """`{kind:"muon"|"adam_w"|"sgd", ...}`. Keys a kind uses default per spec §3 when None;
    keys it does not use are forced to None, so equal configs compare equal."""

    kind: str = "muon"
    momentum: float | None = None
    nesterov: bool | None = None
    ns_iters: int | None = None
    weight_decay: float | None = None
    beta1: float | None = None
    beta2: float | None = None
    eps: float | None = None

    @classmethod
    def from_dict(cls, value: Any) -> OptimizerConfig:
        value = check_mapping("optimizer", value)
        kind = check_choice("optimizer.kind", value.get("kind"), OPTIMIZER_KINDS)
        unknown = sorted(set(value) - set(_OPTIMIZER_DEFAULTS[kind]) - {"kind"})
        if unknown:
            raise GrpoConfigError(f"optimizer.{unknown[0]}", f"is not a {kind} optimizer key")
        for key, item in value.items():
            if key != "kind" and item is None:
                raise GrpoConfigError(f"optimizer.{key}", "must not be null")
        return cls(kind=kind, **{k: v for k, v in value.items() if k != "kind"})

    def __post_init__(self) -> None:
        check_choice("optimizer.kind", self.kind, OPTIMIZER_KINDS)
        defaults = _OPTIMIZER_DEFAULTS[self.kind]
        for key in ("momentum", "nesterov", "ns_iters", "weight_decay", "beta1", "beta2", "eps"):
            if key not in defaults:
                object.__setattr__(self, key, None)
            elif getattr(self, key) is None:
                object.__setattr__(self, key, defaults[key])
        if self.kind == "muon":
            check_range(
                "optimizer.momentum",
                check_number("optimizer.momentum", self.momentum),
                0.0,
                1.0,
                hi_open=True,
            )
            check_bool("optimizer.nesterov", self.nesterov)
            check_int("optimizer.ns_iters", self.ns_iters, minimum=1, maximum=20)
        if self.kind == "adam_w":
            for name in ("beta1", "beta2"):
                check_range(
                    f"optimizer.{name}",
                    check_number(f"optimizer.{name}", getattr(self, name)),
                    0.0,
                    1.0,
                    hi_open=True,
                )
            if check_number("optimizer.eps", self.eps) <= 0:
                raise GrpoConfigError("optimizer.eps", f"must be > 0, got {self.eps}")
        if self.kind in ("muon", "adam_w") and check_number("optimizer.weight_decay", self.weight_decay) < 0:
            raise GrpoConfigError("optimizer.weight_decay", f"must be >= 0, got {self.weight_decay}")
        for key in ("momentum", "weight_decay", "beta1", "beta2", "eps"):
            if getattr(self, key) is not None:
                object.__setattr__(self, key, float(getattr(self, key)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        out.update({key: getattr(self, key) for key in _OPTIMIZER_DEFAULTS[self.kind]})
        return out


# Per-optimizer GRPO learning-rate defaults at the reference LoRA scale alpha/rank = 2 (the default
# rank 16, alpha 32), and the 50x band warning. Muon's was 2e-3 (spec §3); issue 17's study
# (benchmarks/defaults_study.py, docs/tiny-model.md) measured it collapsing the demo model in one
# round, and 1e-4 safe. Muon and AdamW take steps whose size does not depend on the gradient's
# scale, so the weight delta a step adds, (alpha/rank) * dB @ A, grows linearly with the LoRA scale
# (measured: rank 4/alpha 8 moves W exactly as far per step as rank 16/alpha 32): their default is
# divided by the scale relative to 2 (`default_learning_rate`). An explicit learning_rate is used as given.
GRPO_DEFAULT_LEARNING_RATE = {"muon": 1e-4, "adam_w": 1e-5, "sgd": 1e-5}
REFERENCE_LORA_SCALE = 2.0
SCALE_INVARIANT_OPTIMIZERS = ("muon", "adam_w")
LEARNING_RATE_BAND = 50.0


def default_learning_rate(kind: str, alpha_over_rank: float) -> float:
    """The learning rate a config without one gets: the optimizer's reference default, scaled by
    REFERENCE_LORA_SCALE / (alpha/rank) for Muon and AdamW (their weight update per step is
    proportional to the LoRA scale); SGD's step already carries the scale through its gradient."""
    base = GRPO_DEFAULT_LEARNING_RATE[kind]
    if kind in SCALE_INVARIANT_OPTIMIZERS:
        return base * REFERENCE_LORA_SCALE / alpha_over_rank
    return base


# ---- KL reference policy ---------------------------------------------------------------------

KL_REFERENCE_KINDS = ("base_per_step", "ema", "none")


@dataclass(frozen=True)
class KlReferencePolicy:
    """The frozen policy for the KL term only; it is never used as the behavior policy."""

    kind: str = "base_per_step"
    decay: float = 0.0  # ema only: weight kept from the previous snapshot
    refresh_every: int = 32  # ema only: snapshot the LoRA policy every N optimizer steps

    @classmethod
    def from_dict(cls, value: Any, field: str = "kl_reference_policy") -> KlReferencePolicy:
        # A bare kind string ("none") is accepted as shorthand for {"kind": "none"}.
        if isinstance(value, str):
            value = {"kind": value}
        value = check_mapping(field, value)
        kind = check_choice(f"{field}.kind", value.get("kind"), KL_REFERENCE_KINDS)
        if kind != "ema":
            return cls(kind=kind)
        return cls(kind=kind, decay=value.get("decay", 0.0), refresh_every=value.get("refresh_every", 32))

    def __post_init__(self) -> None:
        field = "kl_reference_policy"
        check_choice(f"{field}.kind", self.kind, KL_REFERENCE_KINDS)
        check_range(f"{field}.decay", check_number(f"{field}.decay", self.decay), 0.0, 1.0)
        check_int(f"{field}.refresh_every", self.refresh_every, minimum=1, maximum=MAX_REFRESH_EVERY)
        object.__setattr__(self, "decay", float(self.decay))

    def to_dict(self) -> dict[str, Any]:
        if self.kind == "ema":
            return {"kind": "ema", "decay": self.decay, "refresh_every": self.refresh_every}
        return {"kind": self.kind}


# ---- loss composition: ECHO and no_policy_loss ----------------------------------------------

ENV_MASK_MODES = ("env_only", "full_obs")


@dataclass(frozen=True)
class EchoConfig:
    """ECHO: `lambda` x env-token cross-entropy / |O|. `full_obs` keeps warning prefixes (debug)."""

    lambda_: float = 0.05
    env_mask_mode: str = "env_only"
    warning_filter: bool = True

    @classmethod
    def from_dict(cls, value: Any) -> EchoConfig:
        value = check_mapping("loss.echo", value)
        return cls(
            lambda_=value.get("lambda", 0.05),
            env_mask_mode=value.get("env_mask_mode", "env_only"),
            warning_filter=value.get("warning_filter", True),
        )

    def __post_init__(self) -> None:
        # A negative lambda would be gradient ascent on the observation cross-entropy.
        if check_number("loss.echo.lambda", self.lambda_) < 0:
            raise GrpoConfigError("loss.echo.lambda", f"must be >= 0, got {self.lambda_}")
        object.__setattr__(self, "lambda_", float(self.lambda_))
        check_choice("loss.echo.env_mask_mode", self.env_mask_mode, ENV_MASK_MODES)
        check_bool("loss.echo.warning_filter", self.warning_filter)

    @property
    def trims_warning_prefix(self) -> bool:
        """The env mask starts after the warning prefix only in env_only mode with the filter on."""
        return self.warning_filter and self.env_mask_mode == "env_only"

    def to_dict(self) -> dict[str, Any]:
        return {
            "lambda": self.lambda_,
            "env_mask_mode": self.env_mask_mode,
            "warning_filter": self.warning_filter,
        }


_LOSS_KEYS = ("echo", "no_policy_loss", "opd")


@dataclass(frozen=True)
class LossConfig:
    """`loss.echo` (null disables it), `loss.no_policy_loss`; `loss.opd` must stay null here."""

    echo: EchoConfig | None = EchoConfig()
    no_policy_loss: bool = False

    @classmethod
    def from_dict(cls, value: Any, ignored: list[str]) -> LossConfig:
        value = check_mapping("loss", value)
        ignored.extend(f"loss.{key}" for key in sorted(set(value) - set(_LOSS_KEYS)))
        if value.get("opd") is not None:
            raise GrpoConfigError("loss.opd", "is not accepted on the GRPO route; use the OPD route")
        echo = value.get("echo", {})
        return cls(
            echo=None if echo is None else EchoConfig.from_dict(echo),
            no_policy_loss=value.get("no_policy_loss", False),
        )

    def __post_init__(self) -> None:
        if self.echo is not None and not isinstance(self.echo, EchoConfig):
            raise GrpoConfigError("loss.echo", "must be an EchoConfig or null")
        check_bool("loss.no_policy_loss", self.no_policy_loss)
        if self.no_policy_loss and not self.echo_enabled:
            raise GrpoConfigError(
                "loss.no_policy_loss",
                "removes the policy term, so ECHO (loss.echo with lambda > 0) must be enabled",
                code="unsupported_loss_config",
            )

    @property
    def echo_enabled(self) -> bool:
        return self.echo is not None and self.echo.lambda_ > 0

    @property
    def echo_lambda(self) -> float:
        return self.echo.lambda_ if self.echo is not None else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "echo": None if self.echo is None else self.echo.to_dict(),
            "no_policy_loss": self.no_policy_loss,
            "opd": None,
        }
