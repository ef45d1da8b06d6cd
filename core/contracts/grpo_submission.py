"""The training-relevant parts of a GRPO request besides its data: `config`, `post_eval`, dry run.

Pure Python: imports neither torch nor Django. Spec §1.1 puts `post_eval: PostEvalConfig|null`
beside `config` on the request (not inside GrpoConfig); it is validated for shape here and
stored as given for the evaluation stage (whether the suite is installed, and the held-out
overlap check, belong to the evaluation side). `dry_run` (our name; the spec only names the
receipt mode `jsonl_grpo_groups_dry_run`) validates and plans without training. The data source
fields (`groups` / `dataset_path` / `dataset`) are the training app's to parse.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, fields
from typing import Any

from core.contracts.grpo_config import GrpoConfig
from core.contracts.grpo_values import GrpoConfigError, check_bool, check_choice, check_mapping

DATA_SCOPES = ("held-out", "train-set-eval")
DRY_RUN_MODE = "jsonl_grpo_groups_dry_run"


@dataclass(frozen=True)
class PostEvalConfig:
    suite: str
    data_scope: str = "held-out"
    generation: dict[str, Any] | None = None  # an eval generation override, passed through
    min_accuracy: float | None = None  # the promotion gate's floor, in [0, 1]
    include_baseline: bool = False

    @classmethod
    def from_dict(cls, value: Any) -> PostEvalConfig:
        value = check_mapping("post_eval", value)
        _refuse_unknown_keys(value)
        return cls(
            suite=value.get("suite"),
            data_scope=value.get("data_scope", "held-out"),
            generation=value.get("generation"),
            min_accuracy=value.get("min_accuracy"),
            include_baseline=value.get("include_baseline", False),
        )

    def __post_init__(self) -> None:
        if not isinstance(self.suite, str) or not self.suite.strip():
            raise GrpoConfigError("post_eval.suite", "is required (the name of an installed eval suite)")
        check_choice("post_eval.data_scope", self.data_scope, DATA_SCOPES)
        if self.generation is not None:
            check_mapping("post_eval.generation", self.generation)
        if self.min_accuracy is not None:
            value = self.min_accuracy
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise GrpoConfigError("post_eval.min_accuracy", "must be a finite number or null")
            if not 0 <= value <= 1:
                raise GrpoConfigError("post_eval.min_accuracy", f"must be within [0, 1], got {value}")
            if self.data_scope == "train-set-eval":
                # A gate measured on the training data would promote on memorisation.
                raise GrpoConfigError(
                    "post_eval.min_accuracy", "is not allowed with data_scope train-set-eval"
                )
            object.__setattr__(self, "min_accuracy", float(value))
        check_bool("post_eval.include_baseline", self.include_baseline)

    def to_dict(self) -> dict[str, Any]:
        return {
            "suite": self.suite,
            "data_scope": self.data_scope,
            "generation": self.generation,
            "min_accuracy": self.min_accuracy,
            "include_baseline": self.include_baseline,
        }


def _refuse_unknown_keys(value: dict) -> None:
    """post_eval is strict, unlike GrpoConfig (spec §3 ignores unknown config keys): a misspelt
    `min_accuracy` ignored would train and promote with no floor at all."""
    accepted = [f.name for f in fields(PostEvalConfig)]
    unknown = sorted(set(value) - set(accepted), key=str)
    if not unknown:
        return
    key = str(unknown[0])
    close = difflib.get_close_matches(key, accepted, n=1)
    guess = f" (did you mean {close[0]!r}?)" if close else ""
    raise GrpoConfigError(f"post_eval.{key}", f"unknown field {key!r}{guess}; post_eval accepts only: "
                          + ", ".join(accepted), hint=f"use {close[0]}" if close else
                          "fix or remove the field; a post_eval field is never ignored")


@dataclass(frozen=True)
class GrpoSubmission:
    config: GrpoConfig
    post_eval: PostEvalConfig | None = None
    dry_run: bool = False

    @classmethod
    def from_request(cls, body: Any) -> GrpoSubmission:
        """Parse `config`, `post_eval` and `dry_run` from a request body (other keys are left to
        the caller; unknown keys inside `config` are ignored as GrpoConfig says)."""
        body = check_mapping("request", body)
        post_eval = body.get("post_eval")
        return cls(
            config=GrpoConfig.from_dict(body.get("config")),
            post_eval=None if post_eval is None else PostEvalConfig.from_dict(post_eval),
            dry_run=check_bool("dry_run", body.get("dry_run", False)),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "config": self.config.to_dict(),
            "post_eval": None if self.post_eval is None else self.post_eval.to_dict(),
            "dry_run": self.dry_run,
        }
