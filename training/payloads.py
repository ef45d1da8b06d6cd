"""The typed payload of a `training.grpo` job: what admission decided, as plain data on the queue.

Admission (training.services) builds it once from the validated request; the runner, the pages
and the selectors read it through `GrpoJobPayload.of(job)` instead of picking at dict keys. Pure
Python: no torch, no Django.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from core.contracts.grpo_config import GrpoConfig
from core.contracts.grpo_submission import PostEvalConfig


@dataclass(frozen=True)
class GrpoJobPayload:
    route: str
    adapter_name: str
    config: GrpoConfig  # the effective config, its seed resolved
    snapshot_path: str  # the pinned, read-only admitted corpus
    training_data: dict[str, Any]  # source, path, admitted_corpus_sha256, rows, rollouts
    post_eval: PostEvalConfig | None = None
    post_eval_suite_hash: str | None = None  # the suite checked at submission: the gate evaluates this one
    ignored_config_keys: tuple[str, ...] = field(default_factory=tuple)
    dry_run: bool = False
    # Where each effective config field came from: "request", "server_defaults" or "default"
    # (training.config_defaults), and the server's [training.defaults] table at submission.
    config_sources: dict[str, str] = field(default_factory=dict)
    server_training_defaults: dict[str, Any] = field(default_factory=dict)
    # With config.resume_checkpoint: sha256 of that checkpoint's manifest as admission checked it.
    resume_manifest_sha256: str | None = None

    @property
    def effective_seed(self) -> int:
        return self.config.seed

    @property
    def gate_pending(self) -> bool:
        """Whether a post_eval gate decides activation after training."""
        return self.post_eval is not None and self.post_eval.min_accuracy is not None

    @classmethod
    def of(cls, job) -> GrpoJobPayload:
        return cls.from_dict(job.payload)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GrpoJobPayload:
        config = GrpoConfig.from_dict(data["config"])
        if config.seed is None:
            raise ValueError("a queued GRPO payload carries its effective seed")
        return cls(
            route=data["route"], adapter_name=data["adapter_name"], config=config,
            snapshot_path=data["snapshot_path"], training_data=dict(data["training_data"]),
            post_eval=PostEvalConfig.from_dict(data["post_eval"]) if data.get("post_eval") else None,
            post_eval_suite_hash=data.get("post_eval_suite_hash"),
            ignored_config_keys=tuple(data.get("ignored_config_keys") or ()), dry_run=bool(data.get("dry_run")),
            config_sources=dict(data.get("config_sources") or {}),
            server_training_defaults=dict(data.get("server_training_defaults") or {}),
            resume_manifest_sha256=data.get("resume_manifest_sha256"),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "route": self.route,
            "adapter_name": self.adapter_name,
            "config": self.config.to_dict(),
            "ignored_config_keys": list(self.ignored_config_keys),
            "post_eval": self.post_eval.to_dict() if self.post_eval else None,
            "post_eval_suite_hash": self.post_eval_suite_hash,
            "dry_run": self.dry_run,
            "config_sources": dict(self.config_sources),
            "server_training_defaults": dict(self.server_training_defaults),
            "resume_manifest_sha256": self.resume_manifest_sha256,
            "effective_seed": str(self.effective_seed),  # the API's decimal string, for readers of the row
            "snapshot_path": self.snapshot_path,
            "training_data": self.training_data,
        }
