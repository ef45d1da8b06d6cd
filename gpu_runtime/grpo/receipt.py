"""`train_receipt.json` (spec §2.9) for GRPO runs: the run ledger and the receipt builder. Imports no Django.

`RunLedger` accumulates what the receipt reports across optimizer steps (loss history, gradient
norms, token counts, ECHO figures, the policy audit). It serialises to plain JSON
(`state_dict`/`from_state`) so a checkpoint restores it and a resumed run's receipt covers the
whole run. `build_receipt` assembles the envelope and blocks; the trainer writes it inside the
published adapter on success and beside the output (see `failure_receipt_path`) on failure.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from typing import Any

from core.canonical import json_digest
from gpu_runtime.grpo.advantages import is_degenerate_group, population_variance
from gpu_runtime.grpo.audit import PolicyAuditAccumulator

TOKEN_COUNT_KEYS = (
    "action_tokens",
    "env_tokens",
    "env_tokens_before_warning_filter",
    "env_tokens_after_warning_filter",
    "warning_tokens_filtered",
    "context_tokens",
)
VARIANCE_BINS = (  # label, exclusive lower bound (None: the exact value 0), inclusive upper bound
    ("zero", None, 0.0),
    ("(0, 1e-4]", 0.0, 1e-4),
    ("(1e-4, 0.01]", 1e-4, 0.01),
    ("(0.01, 0.1]", 0.01, 0.1),
    ("(0.1, inf)", 0.1, None),
)


@dataclass
class RunLedger:
    global_step: int = 0
    groups_done: int = 0  # cursor into the training order
    groups_trained: int = 0
    completions_trained: int = 0
    loss_history: list[dict] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    token_counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(TOKEN_COUNT_KEYS, 0))
    echo_contributed: bool = False
    initial_env_ce: float | None = None
    final_env_ce: float | None = None
    audit: dict = field(default_factory=lambda: PolicyAuditAccumulator().state_dict())

    def observe_group(self, group, step_records, *, elapsed_secs: float, total_steps: int) -> dict:
        """Fold one optimizer group's step records in; return its progress figures."""
        audit = PolicyAuditAccumulator.from_state(self.audit)
        for completion in group.completions:
            for key in TOKEN_COUNT_KEYS:
                self.token_counts[key] += completion.token_counts.get(key, 0)
            if completion.provenance is not None:
                audit.observe_recorded_completion(completion.provenance)
        losses, kls = [], []
        for record in step_records:
            stats = record.stats
            audit.observe_step(stats)
            self.global_step += 1
            self.grad_norms.append(record.grad_norm)
            if stats.get("echo_contributed"):
                self.echo_contributed = True
                if self.initial_env_ce is None:
                    self.initial_env_ce = stats["echo_env_ce"]
                self.final_env_ce = stats["echo_env_ce"]
            losses.append(stats["loss"])
            if stats.get("kl_mean_log_ratio") is not None:
                kls.append(stats["kl_mean_log_ratio"])
            self.loss_history.append(
                {
                    "step": self.global_step,
                    "group_index": group.index,
                    "epoch": 0,
                    "progress": self.global_step / max(total_steps, 1),
                    "loss": stats["loss"],
                    "policy_loss": stats["policy_loss"],
                    "kl_loss": stats["kl_loss"],
                    "echo_loss": stats["echo_loss"],
                    "kl_mean": stats.get("kl_mean_log_ratio"),
                    "kl_estimator_mean": stats.get("kl_mean_estimator"),
                    "ratio_mean": stats.get("ratio_mean"),
                    "grad_norm": record.grad_norm,
                    "action_tokens": stats["action_tokens"],
                    "elapsed_secs": round(elapsed_secs, 3),
                }
            )
        self.audit = audit.state_dict()
        self.groups_done += 1
        self.groups_trained += 1
        self.completions_trained += len(group.completions)
        rewards = group.rewards
        return {
            "loss": sum(losses) / len(losses),
            "reward_mean": sum(rewards) / len(rewards),
            "kl_mean": sum(kls) / len(kls) if kls else None,
            "grad_norm": step_records[-1].grad_norm,
        }

    def policy_audit(self) -> dict:
        return PolicyAuditAccumulator.from_state(self.audit).to_receipt()

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict) -> RunLedger:
        return cls(**state)


def reward_statistics(groups_rewards: list[list[float]], config) -> dict[str, Any]:
    flat = [r for rewards in groups_rewards for r in rewards]
    n = len(flat)
    mean = math.fsum(flat) / n if n else None
    stdev = math.sqrt(population_variance(flat)) if n else None
    histogram = []
    variances = [population_variance(rewards) for rewards in groups_rewards]
    for label, above, high in VARIANCE_BINS:
        if above is None:
            entry = {
                "label": label,
                "min_inclusive": 0.0,
                "max_inclusive": 0.0,
                "count": variances.count(0.0),
            }
        else:
            count = sum(1 for v in variances if v > above and (high is None or v <= high))
            entry = {"label": label, "count": count}
            if high is not None:
                entry["max_inclusive"] = high
        histogram.append(entry)
    threshold = config.reward_saturation_threshold
    return {
        "count": n,
        "mean": mean,
        "stdev": stdev,
        "min": min(flat) if flat else None,
        "max": max(flat) if flat else None,
        "group_count": len(groups_rewards),
        "all_pass_group_count": sum(1 for rs in groups_rewards if rs and min(rs) >= threshold),
        "all_fail_group_count": sum(1 for rs in groups_rewards if rs and max(rs) <= 0.0),
        "degenerate_group_count": sum(1 for rs in groups_rewards if is_degenerate_group(rs)),
        "low_variance_group_count": sum(1 for v in variances if v <= config.reward_low_variance_threshold),
        "group_variance_histogram": histogram,
    }


# reference-spec §2.9 data.reward_filter_sidecar: named in a receipt only beside which it was written
REWARD_FILTER_SIDECAR = "reward_filter_groups.json"


def data_block(filter_result, groups_rewards: list[list[float]], ledger: RunLedger) -> dict[str, Any]:
    completions_read = sum(len(r) for r in groups_rewards)
    block = {
        "examples_read": completions_read,
        "examples_filtered": completions_read - ledger.completions_trained,
        "examples_trained": ledger.completions_trained,
        "groups_read": len(groups_rewards),
        "groups_filtered": len(groups_rewards) - len(filter_result.kept_indices) if filter_result else 0,
        "groups_trained": ledger.groups_trained,
        "completions_read": completions_read,
        "completions_trained": ledger.completions_trained,
        "reward_groups_filtered": filter_result.reward_groups_filtered if filter_result else 0,
        "reward_groups_kept": filter_result.reward_groups_kept if filter_result else len(groups_rewards),
    }
    if filter_result is not None:
        block["reward_filter_action"] = filter_result.empty_filter_action
    return block


def package_version() -> str | None:
    try:
        return metadata.version("kiln")
    except metadata.PackageNotFoundError:
        return None


def build_receipt(
    *,
    adapter_name: str,
    status: str,
    failure: tuple[str, str] | None,
    config,
    ledger: RunLedger,
    groups_rewards: list[list[float]] | None,
    filter_result,
    model: dict,
    tokenizer: dict,
    adapters: dict,
    training_data: dict,
    timings: dict,
    runtime: dict,
    fallbacks: list,
    lora_delta_norms: list,
    smoke_test: dict | None,
    extra: dict | None = None,
    config_sources: dict | None = None,
    server_training_defaults: dict | None = None,
) -> dict[str, Any]:
    """The spec §2.9 receipt. `failure` is (failure_reason, failure_message) or None.

    `config_sources` ({field: "request"|"server_defaults"|"default"}) and the server's
    `[training.defaults]` table, when the run came through the server, say which parts of `config`
    the request chose; `config` itself is always the full effective configuration."""
    config_dict = config.to_dict()
    echo = config.loss.echo
    audit = ledger.policy_audit()
    echo_block: dict[str, Any] = {"enabled": ledger.echo_contributed}
    if echo is None:
        echo_block["dropped_reason"] = "disabled"
    else:
        echo_block.update(
            {
                "lambda": echo.lambda_,
                "env_mask_mode": echo.env_mask_mode,
                "warning_filter": echo.warning_filter,
            }
        )
        if ledger.echo_contributed:
            echo_block.update(initial_env_ce=ledger.initial_env_ce, final_env_ce=ledger.final_env_ce)
        else:
            echo_block["dropped_reason"] = "no_env_tokens" if echo.lambda_ > 0 else "lambda_zero"
    receipt: dict[str, Any] = {
        "schema_version": 1,
        "receipt_type": "kiln_train_receipt",
        "adapter_name": adapter_name,
        "produced_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "status": status,
        "failure_reason": failure[0] if failure else None,
        "failure_message": failure[1] if failure else None,
        "kiln": {"package_version": package_version()},
        "model": model,
        "tokenizer": tokenizer,
        "adapters": adapters,
        "training_data": training_data,
        "hyperparameters": {
            "mode": "grpo",
            "rank": config.lora_rank,
            "alpha": config.lora_alpha,
            "alpha_over_rank": config.alpha_over_rank,
            "learning_rate": config.resolved_learning_rate,
            "learning_rate_rule": config.learning_rate_rule,
            "optimizer": config.optimizer.to_dict(),
            "epochs": 1,
            "seed": None if config.seed is None else str(config.seed),
            "shuffle": False,
        },
        "grpo": {
            "kl_coeff": config.kl_coeff,
            "clip_epsilon": config.clip_epsilon,
            "clip_eps_high": config.clip_eps_high,
            "cispo_max_weight": config.cispo_max_weight,
            "dynamic_sampling": config.dynamic_sampling,
            "dynamic_groups_filtered": filter_result.dynamic_groups_filtered if filter_result else 0,
            "advantage_mode": config.advantage_mode,
            "loss_aggregation": config.loss_aggregation,
            "kl_estimator": config.kl_estimator,
            "is_level": config.is_level,
            "behavior_policy": config.behavior_policy,
            "kl_reference_policy": config.kl_reference_policy.to_dict(),
            "entropy_aware_kl_quantile": config.entropy_aware_kl_quantile,
            "shared_prefix_reference": config.shared_prefix_reference,
            "policy_audit": audit,
        },
        "echo": echo_block,
        "no_policy_loss": config.loss.no_policy_loss,
        "data": data_block(filter_result, groups_rewards or [], ledger),
        "rewards": reward_statistics(groups_rewards or [], config),
        "token_counts": dict(ledger.token_counts),
        "phase_timings": {k: round(v, 3) if isinstance(v, float) else v for k, v in timings.items()},
        "runtime": runtime,
        "fallbacks": list(fallbacks),
        "config_hashes": {"effective_config_sha256": json_digest(config_dict)},
        "loss_history": list(ledger.loss_history),
        "lora_delta_norms": lora_delta_norms,
        "lora_grad_norms": list(ledger.grad_norms),
        "progress": {"global_step": ledger.global_step, "groups_done": ledger.groups_done},
        "config": config_dict,
        "warnings": list(config.warnings),
    }
    if config_sources is not None:
        receipt["config_sources"] = dict(config_sources)
        receipt["server_training_defaults"] = dict(server_training_defaults or {})
    if smoke_test is not None:
        receipt["adapter_smoke_test"] = smoke_test
    if extra:
        receipt.update(extra)
    return receipt
