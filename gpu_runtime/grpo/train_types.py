"""The plain dataclasses `train_grpo` takes and returns (the lead's wiring surface). Imports no Django (nor torch).

`TrainRequest` says what to train (model directory, groups, GrpoConfig), where to publish it,
where checkpoints live and which one to resume, and the source identity resume checks compare.
`TrainResult` says what happened: the adapter (None when cancelled), the receipt and its path,
the checkpoints written, whether the run stopped at a group boundary, and the step reached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from core.contracts.grpo_config import GrpoConfig

if TYPE_CHECKING:
    from gpu_runtime.shared_base import SharedBase

DEFAULT_TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
DEFAULT_SMOKE_PROMPTS = ("What is 2 + 3? Reply with just the number.", "Hello!")


@dataclass
class TrainRequest:
    model_dir: Path
    groups: list[dict]
    config: GrpoConfig
    output_dir: Path  # the adapter directory to publish (must not exist)
    adapter_name: str
    base_adapter_dir: Path | None = None  # warm start (weights only)
    base_adapter_name: str | None = None
    checkpoint_root: Path | None = None  # the adapter registry; None: no checkpoints
    checkpoint_interval: int | None = None  # None: config.checkpoint_interval
    resume_checkpoint_dir: Path | None = None  # None: config.resume_checkpoint under checkpoint_root
    source_sha256: str | None = None  # digest of the training data bytes; None: §2.7 digest of `groups`
    source_kind: str = "inline"  # the route: inline | dataset_path | named_dataset | corrections
    source_path: str | None = None
    # Lineage the receipt's training_data repeats (a named dataset: dataset, split and its digests).
    source_lineage: dict | None = None
    device: str = "cpu"  # cpu | cuda | auto
    template_kwargs: dict | None = None  # chat-template kwargs for groups without provenance
    lora_target_modules: tuple[str, ...] = DEFAULT_TARGET_MODULES
    failure_receipt_path: Path | None = None  # None: <output_dir>.train_receipt.failed.json
    replay_recorded_behavior: bool = True  # recorded: recompute behavior log-probs at setup
    model_identity: dict | None = None  # a known model_loading.identity_of() result: skip re-hashing weights
    # The resident model's base weights (`LoadedModel.shared_base`): the trainer builds its model on
    # them instead of reading a second copy from disk, when the directory, device and dtype match.
    shared_base: SharedBase | None = None
    # Where each config field came from ("request" | "server_defaults" | "default") and the server's
    # [training.defaults] table; the receipt records both (None: not a server submission).
    config_sources: dict | None = None
    server_training_defaults: dict | None = None


@dataclass
class TrainResult:
    adapter_path: Path | None  # None when stopped (cancelled)
    receipt: dict
    receipt_path: Path
    checkpoints: list[Path]
    stopped: bool
    final_step: int
    total_steps: int
    effective_seed: int
    checkpoint_errors: list[str] = field(default_factory=list)
