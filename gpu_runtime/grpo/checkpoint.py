"""Exact-resume GRPO checkpoints (spec §2.10): publish atomically, load strictly, check resumability. Imports no Django.

A checkpoint is an immutable directory `<adapter>-checkpoint-step-<8-digit step>.kiln-checkpoint/`
under the checkpoint root (the adapter registry) holding:

    checkpoint_manifest.json     kiln.training-checkpoint.v1 (digests of every other file)
    adapter_parameters.safetensors   the trainable LoRA tensors (fp32)
    optimizer_state.pt           the torch optimizer state_dict (loaded with weights_only=True)
    reference_state.safetensors  the EMA KL-reference snapshot (ema only)
    rng_torch.pt / rng_state.json    torch CPU (+ CUDA) and python / numpy generator states
    loss_history.json            per-step loss records

Publication: hidden staging sibling -> `.incomplete` sentinel -> files + fsync -> manifest +
fsync -> drop the sentinel -> rename -> fsync the parent. The loader rejects symlinks, hard
links, missing / extra files, size or hash drift, unknown manifest fields and escaping paths.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import sys
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from core.artifacts import (
    CHECKPOINT_MANIFEST,
    CHECKPOINT_SUFFIX,
    StagedDirectory,
    checkpoint_folder,
    hidden_sibling,
    json_bytes,
)
from core.contracts.grpo_config import comparable_config
from core.errors import space_exhausted_error
from gpu_runtime.grpo.errors import CheckpointError
from gpu_runtime.identity import file_sha256

SCHEMA = "kiln.training-checkpoint.v1"
PLANNING_SCHEMA = "kiln.training-checkpoint-planning.v3"
SUFFIX = CHECKPOINT_SUFFIX
MANIFEST = CHECKPOINT_MANIFEST
SENTINEL = ".incomplete"
ADAPTER_FILE = "adapter_parameters.safetensors"
OPTIMIZER_FILE = "optimizer_state.pt"
REFERENCE_FILE = "reference_state.safetensors"
RNG_TORCH_FILE = "rng_torch.pt"
RNG_STATE_FILE = "rng_state.json"
LOSS_FILE = "loss_history.json"
MANIFEST_KEYS = {
    "schema_version",
    "manifest_type",
    "checkpoint_kind",
    "checkpoint_id",
    "training_kind",
    "adapter_name",
    "created_at",
    "effective_config",
    "precision_policy",
    "progress",
    "data",
    "rng_states",
    "optimizer",
    "scheduler",
    "state_files",
    "auxiliary_state",
    "files",
}
_NAME = re.compile(r"^(?P<adapter>.+)-checkpoint-step-(?P<step>\d{8})\.kiln-checkpoint$")


def checkpoint_name(adapter_name: str, step: int) -> str:
    return f"{adapter_name}-checkpoint-step-{step:08d}{SUFFIX}"


def list_checkpoints(root: Path, adapter_name: str) -> list[tuple[int, Path]]:
    """(step, path) of the adapter's published checkpoints, oldest first (staging dirs excluded)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        match = _NAME.match(path.name)
        if match and match["adapter"] == adapter_name and path.is_dir() and not path.is_symlink():
            found.append((int(match["step"]), path))
    return sorted(found)


def prune_checkpoints(root: Path, adapter_name: str, *, keep_last: int, protect: Path | None = None) -> list[Path]:
    """Retention: remove all but the newest `keep_last` published checkpoints of the adapter, never
    `protect` (the checkpoint a resume started from). Each goes by a rename to a hidden sibling
    first, so no reader ever meets half a checkpoint. Returns what was removed."""
    found = [path for _, path in list_checkpoints(root, adapter_name)]
    keep = set(found[-keep_last:]) | ({Path(protect).resolve()} if protect else set())
    removed = []
    for path in found:
        if path in keep or path.resolve() in keep:
            continue
        retired = hidden_sibling(path, "retired")
        os.rename(path, retired)
        shutil.rmtree(retired, ignore_errors=True)
        removed.append(path)
    return removed


def latest_checkpoint(root: Path, adapter_name: str) -> Path | None:
    found = list_checkpoints(root, adapter_name)
    return found[-1][1] if found else None


def resolve_checkpoint(root: Path, value: str) -> Path:
    """`resume_checkpoint` as given in a config: a basename under `root`, or an absolute path
    directly beneath it. Raises checkpoint_not_found."""
    path = checkpoint_folder(Path(root), value)
    if path is None:
        raise CheckpointError("checkpoint_not_found", f"checkpoint {value!r} does not exist (a checkpoint "
                              f"folder name, or a path directly beneath the adapter registry {root})")
    return path


# ---- state ----------------------------------------------------------------------------------


@dataclass
class CheckpointState:
    adapter: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    reference: dict[str, torch.Tensor] | None
    rng: dict[str, Any]  # capture_rng() output
    loss_history: list[dict]


def capture_rng() -> dict[str, Any]:
    """Every generator the run may draw from: torch CPU (+ CUDA), python `random`, numpy."""
    state: dict[str, Any] = {"torch_cpu": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["torch_cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch_cpu"])
    random.setstate(state["python"])
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["torch_cuda"])
    numpy = sys.modules.get("numpy")
    if "numpy" in state and numpy is not None:
        numpy.random.set_state(state["numpy"])


def _rng_json(state: dict[str, Any]) -> dict[str, Any]:
    version, internal, gauss = state["python"]
    out: dict[str, Any] = {"python": [version, list(internal), gauss]}
    if "numpy" in state:
        name, keys, pos, has_gauss, cached = state["numpy"]
        out["numpy"] = [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]
    return out


def _rng_from_json(data: dict[str, Any], torch_states: dict[str, Any]) -> dict[str, Any]:
    version, internal, gauss = data["python"]
    state: dict[str, Any] = {"python": (version, tuple(internal), gauss), **torch_states}
    if "numpy" in data:
        import numpy

        name, keys, pos, has_gauss, cached = data["numpy"]
        state["numpy"] = (name, numpy.array(keys, dtype=numpy.uint32), pos, has_gauss, cached)
    return state


# ---- publish --------------------------------------------------------------------------------


def write_checkpoint(
    root: Path, *, adapter_name: str, step: int, state: CheckpointState, manifest: dict
) -> Path:
    """Publish `state` as an immutable checkpoint directory; `manifest` holds every manifest field
    except checkpoint_id, created_at, state_files, rng_states' files and `files` (filled here)."""
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / checkpoint_name(adapter_name, step)
    if final.exists():
        raise CheckpointError("checkpoint_exists", f"{final.name} already exists; checkpoints are immutable")
    staged = StagedDirectory(final)  # a hidden sibling; immutable: publication refuses an existing one
    staging = staged.staging
    try:
        (staging / SENTINEL).write_bytes(b"")
        roles = {
            ADAPTER_FILE: "adapter_parameters",
            OPTIMIZER_FILE: "optimizer_state",
            RNG_TORCH_FILE: "rng_state",
            RNG_STATE_FILE: "rng_state",
            LOSS_FILE: "loss_history",
        }
        save_file(state.adapter, str(staging / ADAPTER_FILE))
        torch.save(state.optimizer, staging / OPTIMIZER_FILE)
        torch.save({k: v for k, v in state.rng.items() if k.startswith("torch_")}, staging / RNG_TORCH_FILE)
        (staging / RNG_STATE_FILE).write_text(json.dumps(_rng_json(state.rng)))
        (staging / LOSS_FILE).write_text(json.dumps(state.loss_history, allow_nan=False))
        if state.reference is not None:
            save_file(state.reference, str(staging / REFERENCE_FILE))
            roles[REFERENCE_FILE] = "reference_state"
        files = {}
        for name, role in sorted(roles.items()):
            files[name] = {
                "role": role,
                "size_bytes": (staging / name).stat().st_size,
                "sha256": file_sha256(staging / name).removeprefix("sha256:"),
            }
        state_files = {
            "adapter_parameters": ADAPTER_FILE,
            "optimizer_state": OPTIMIZER_FILE,
            "loss_history": LOSS_FILE,
        }
        if state.reference is not None:
            state_files["reference_state"] = REFERENCE_FILE
        seed = manifest.get("effective_config", {}).get("seed")
        rng_states = {
            name: {
                "algorithm": "mt19937",
                "seed": seed,
                "position": None,
                "state_file": RNG_TORCH_FILE if name.startswith("torch_") else RNG_STATE_FILE,
            }
            for name in state.rng
        }
        full = {
            "schema_version": 1,
            "manifest_type": SCHEMA,
            "checkpoint_kind": "resumable",
            "checkpoint_id": f"{adapter_name}-step-{step:08d}-{uuid.uuid4().hex[:12]}",
            "training_kind": "grpo",
            "adapter_name": adapter_name,
            "created_at": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
            **manifest,
            "rng_states": rng_states,
            "state_files": state_files,
            "files": files,
        }
        unknown = set(full) - MANIFEST_KEYS
        missing = MANIFEST_KEYS - set(full)
        if unknown or missing:
            raise ValueError(
                f"checkpoint manifest fields: unknown {sorted(unknown)}, missing {sorted(missing)}"
            )
        (staging / MANIFEST).write_bytes(json_bytes(full))
        (staging / SENTINEL).unlink()
        return staged.publish()  # fsyncs every file and the folder, renames, fsyncs the parent
    except BaseException as exc:
        # torch.save's short write on a full disk carries no errno: judge by the free space left,
        # while the staged files still hold theirs, so the run ends with the disk-full code.
        full = space_exhausted_error(exc, root)
        staged.discard()
        if full is not None:
            raise full from exc
        raise


# ---- load -----------------------------------------------------------------------------------


def load_checkpoint(path: Path) -> tuple[dict, CheckpointState]:
    """Load and verify a checkpoint directory; raise CheckpointError(checkpoint_invalid) on any defect."""
    from safetensors.torch import load_file

    path = Path(path)

    def bad(message: str):
        raise CheckpointError("checkpoint_invalid", f"{path.name}: {message}")

    if path.is_symlink() or not path.is_dir():
        bad("not a checkpoint directory")
    manifest_path = path / MANIFEST
    if manifest_path.is_symlink() or not manifest_path.is_file():
        bad(f"{MANIFEST} is missing")
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError as exc:
        bad(f"{MANIFEST} is not JSON: {exc}")
    if not isinstance(manifest, dict) or set(manifest) != MANIFEST_KEYS:
        keys = set(manifest) if isinstance(manifest, dict) else set()
        bad(
            f"manifest fields differ: unknown {sorted(keys - MANIFEST_KEYS)}, missing {sorted(MANIFEST_KEYS - keys)}"
        )
    if (
        manifest["schema_version"],
        manifest["manifest_type"],
        manifest["checkpoint_kind"],
        manifest["training_kind"],
    ) != (1, SCHEMA, "resumable", "grpo"):
        bad("not a resumable kiln.training-checkpoint.v1 GRPO checkpoint")
    files = manifest["files"]
    if not isinstance(files, dict):
        bad("files must be an object")
    present = set()
    for item in path.rglob("*"):
        rel = item.relative_to(path).as_posix()
        if item.is_symlink():
            bad(f"{rel} is a symlink")
        if item.is_dir():
            bad(f"unexpected directory {rel}")
        present.add(rel)
    expected = set(files) | {MANIFEST}
    if present != expected:
        bad(
            f"files differ from the manifest: extra {sorted(present - expected)}, missing {sorted(expected - present)}"
        )
    for rel, entry in files.items():
        if rel.startswith("/") or ".." in Path(rel).parts or "/" in rel:
            bad(f"file path {rel!r} escapes the checkpoint")
        if not isinstance(entry, dict) or set(entry) != {"role", "size_bytes", "sha256"}:
            bad(f"files[{rel!r}] must have role, size_bytes, sha256")
        stat = (path / rel).stat()
        if stat.st_nlink != 1:
            bad(f"{rel} is hard-linked")
        if stat.st_size != entry["size_bytes"]:
            bad(f"{rel} size {stat.st_size} != {entry['size_bytes']}")
        if file_sha256(path / rel).removeprefix("sha256:") != entry["sha256"]:
            bad(f"{rel} sha256 drifted")
    step = manifest["progress"]["global_step"]
    if manifest["optimizer"]["step"] != step or manifest["scheduler"]["step"] != step:
        bad("optimizer.step and scheduler.step must equal progress.global_step")
    state_files = manifest["state_files"]
    try:
        rng_json = json.loads((path / RNG_STATE_FILE).read_text())
        torch_states = torch.load(path / RNG_TORCH_FILE, weights_only=True)
        reference_file = state_files.get("reference_state")
        state = CheckpointState(
            adapter=load_file(str(path / state_files["adapter_parameters"])),
            optimizer=torch.load(path / state_files["optimizer_state"], weights_only=True),
            reference=load_file(str(path / reference_file)) if reference_file else None,
            rng=_rng_from_json(rng_json, torch_states),
            loss_history=json.loads((path / state_files["loss_history"]).read_text()),
        )
    except CheckpointError:
        raise
    except Exception as exc:  # noqa: BLE001 - any unreadable state file
        bad(f"state files do not load: {exc}")
    return manifest, state


def check_resumable(
    manifest: dict,
    *,
    adapter_name: str,
    source_kind: str,
    content_sha256: str,
    effective_config: dict,
    base_model_sha256: str,
    tokenizer: dict,
    precision_policy: dict,
    data_order: list[int],
) -> None:
    """Spec §3.2: the resumed run must be the same run. Raise CheckpointError naming what differs."""
    name = manifest.get("checkpoint_id")
    if manifest["adapter_name"] != adapter_name:
        raise CheckpointError(
            "checkpoint_adapter_mismatch",
            f"checkpoint {name} belongs to adapter {manifest['adapter_name']!r}, not {adapter_name!r}",
        )
    data = manifest["data"]
    if data.get("source_kind") != source_kind or data.get("content_sha256") != content_sha256:
        raise CheckpointError(
            "checkpoint_source_mismatch",
            f"checkpoint {name} was trained on {data.get('source_kind')} data {data.get('content_sha256')}; "
            f"this run has {source_kind} data {content_sha256}. Resume needs the identical source bytes and route.",
        )
    old, new = comparable_config(manifest["effective_config"]), comparable_config(effective_config)
    if old != new:
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise CheckpointError(
            "checkpoint_config_mismatch",
            f"checkpoint {name} used a different effective config (changed: {', '.join(changed)})",
        )
    aux = manifest["auxiliary_state"]
    if aux.get("base_model_sha256") != base_model_sha256:
        raise CheckpointError(
            "checkpoint_base_model_mismatch", f"checkpoint {name} was trained on another base model"
        )
    if aux.get("tokenizer") != tokenizer:
        raise CheckpointError(
            "checkpoint_tokenizer_mismatch", f"checkpoint {name} used another tokenizer or template"
        )
    if manifest["precision_policy"] != precision_policy:
        raise CheckpointError(
            "checkpoint_precision_mismatch",
            f"checkpoint {name} ran with {manifest['precision_policy']}, this run with {precision_policy}",
        )
    if manifest["progress"]["data_order"] != data_order:
        raise CheckpointError(
            "checkpoint_data_mismatch", f"checkpoint {name} planned a different group order"
        )
