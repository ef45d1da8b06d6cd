"""Small pieces of a GRPO run outside the maths: the GPU writer lock timer, device choice, identities. Imports no Django.

- `WriterLock.hold()` enters the caller's `gpu_writer()` context (if any) and records
  gpu_writer_wait_ms / gpu_writer_held_ms / gpu_writer_acquisitions in the phase timings.
- `resolve_device` picks cpu / cuda by capability (torch.cuda.is_available), never by device
  name, and records a fallback when CUDA was asked for but is missing.
- `load_tokenizer_and_identity` loads the tokenizer (no weights) and hashes the model directory
  the same way the sampler does (`model_loading.identity_of`), so recorded provenance compares.
- `dataset_sha256` is the spec §2.7 digest of inline groups (compact JSON + newline per group).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, contextmanager
from pathlib import Path

import torch

from gpu_runtime.grpo.errors import TrainingError
from gpu_runtime.identity import file_sha256, weight_shards


class WriterLock:
    def __init__(self, factory: Callable[[], AbstractContextManager] | None, timings: dict):
        self.factory = factory
        self.timings = timings
        for key in ("gpu_writer_wait_ms", "gpu_writer_held_ms"):
            timings.setdefault(key, 0.0)
        timings.setdefault("gpu_writer_acquisitions", 0)

    @contextmanager
    def hold(self):
        with ExitStack() as stack:
            asked = time.perf_counter()
            if self.factory is not None:
                stack.enter_context(self.factory())
            got = time.perf_counter()
            self.timings["gpu_writer_wait_ms"] += (got - asked) * 1000.0
            self.timings["gpu_writer_acquisitions"] += 1
            try:
                yield
            finally:
                self.timings["gpu_writer_held_ms"] += (time.perf_counter() - got) * 1000.0


def resolve_device(requested: str, fallbacks: list) -> tuple[torch.device, torch.dtype]:
    """(device, activation dtype): CPU runs float32; CUDA runs bfloat16 where supported."""
    requested = (requested or "cpu").lower()
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda"):
        if not torch.cuda.is_available():
            fallbacks.append(
                {
                    "capability": "cuda",
                    "fallback": "cpu",
                    "reason": "CUDA was requested but torch.cuda.is_available() is false",
                }
            )
            return torch.device("cpu"), torch.float32
        device = torch.device(requested)
        if torch.cuda.is_bf16_supported():
            return device, torch.bfloat16
        fallbacks.append(
            {"capability": "bf16", "fallback": "float32", "reason": "the CUDA device lacks bfloat16"}
        )
        return device, torch.float32
    if requested != "cpu":
        raise TrainingError("training_invalid_request", f"unknown device {requested!r} (cpu, cuda or auto)")
    return torch.device("cpu"), torch.float32


def load_tokenizer_and_identity(
    model_dir: Path, device: torch.device, dtype: torch.dtype, *, known_identity: dict | None = None
):
    """(tokenizer, identity). `known_identity` (e.g. the GPU worker's `LoadedModel.identity` for the
    same directory) skips re-hashing the weights; it must carry the same keys as `identity_of`."""
    from transformers import AutoTokenizer

    from gpu_runtime.model_loading import identity_of

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise TrainingError("model_path_invalid", f"{model_dir} is not a Hugging Face model directory")
    shards = weight_shards(model_dir)
    if not shards:
        raise TrainingError("model_weights_missing", f"{model_dir} holds no weight files")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise TrainingError(
            "tokenizer_load_failed", f"tokenizer in {model_dir} failed to load: {exc}"
        ) from exc
    if not isinstance(getattr(tokenizer, "chat_template", None), str):
        raise TrainingError("chat_template_missing", f"the tokenizer in {model_dir} has no chat template")
    if known_identity is not None:
        missing = {"base_model_sha256", "weights_manifest", "tokenizer", "inference_config_sha256"} - set(
            known_identity
        )
        if missing:
            raise TrainingError("training_invalid_request", f"model_identity lacks {sorted(missing)}")
        return tokenizer, dict(known_identity)
    return tokenizer, identity_of(model_dir, tokenizer, shards=shards, device=device, dtype=dtype)


def dataset_sha256(groups: list[dict]) -> str:
    digest = hashlib.sha256()
    for group in groups:
        digest.update(json.dumps(group, separators=(",", ":"), ensure_ascii=False).encode("utf-8") + b"\n")
    return "sha256:" + digest.hexdigest()


def model_block(model_dir: Path, identity: dict | None) -> dict:
    model_dir = Path(model_dir)
    block = {"path": str(model_dir)}
    if (model_dir / "config.json").is_file():
        block["config_hash"] = file_sha256(model_dir / "config.json")
    if identity:
        block["base_model_sha256"] = identity["base_model_sha256"]
        block["base_weight_shard_manifest"] = identity["weights_manifest"]
    return block


def tokenizer_block(model_dir: Path, identity: dict | None) -> dict:
    if not identity:
        return {}
    tok = identity["tokenizer"]
    block = {
        "config_hash": tok["config_sha256"],
        "vocab_hash": tok["vocab_sha256"],
        "chat_template_hash": tok["chat_template_sha256"],
        "training_chat_template_hash": tok["chat_template_sha256"],
    }
    config_file = Path(model_dir) / "tokenizer_config.json"
    if config_file.is_file():
        block["tokenizer_config_hash"] = file_sha256(config_file)
    return block
