"""LoRA adapter plumbing for the GRPO trainer: attach, warm-start, snapshot, publish, smoke-test. Imports no Django.

- `attach_lora` wraps a causal LM in a trainable peft LoRA (r / alpha from GrpoConfig, attention
  projections by default, no dropout so a step is deterministic given the seed).
- `load_base_adapter` warm-starts from a published PEFT adapter: its LoRA weights only (never an
  optimizer state); rank, alpha and target modules must match the run's.
- `adapter_state` / `restore_adapter_state` copy the trainable tensors in and out (checkpoints,
  the EMA reference snapshot); `lora_delta_norms` is the receipt's `lora_delta_norms[]`.
- `StagedAdapter` publishes atomically through core.artifacts: save into a hidden sibling, add the
  receipt, fsync, rename.
- `adapter_content_sha256` is the same content digest the sampler's adapter manager computes
  (adapter_config.json + weights), so a behavior policy's adapter identity compares equal.
- `adapter_smoke_test` greedy-decodes a few prompts with the adapter disabled and enabled.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.artifacts import StagedDirectory, json_bytes
from gpu_runtime.grpo.errors import TrainingError
from gpu_runtime.grpo.train_types import DEFAULT_TARGET_MODULES
from gpu_runtime.identity import adapter_files, file_manifest, manifest_digest


def attach_lora(model, *, rank: int, alpha: float, target_modules: Sequence[str] = DEFAULT_TARGET_MODULES):
    """A trainable PeftModel around `model`. Call torch.manual_seed first: lora_A is drawn from the
    global generator, lora_B starts at zero (so the fresh adapter equals the base model)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(target_modules),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with warnings.catch_warnings():  # peft probes a deprecated transformers attribute
            warnings.simplefilter("ignore", FutureWarning)
            peft_model = get_peft_model(model, lora)
    except ValueError as exc:  # no module matched target_modules
        raise TrainingError(
            "shape_mismatch", f"LoRA could not attach: {exc}", failure_reason="shape_mismatch"
        ) from exc
    for parameter in peft_model.parameters():
        if parameter.requires_grad and parameter.dtype != torch.float32:
            parameter.data = parameter.data.float()  # LoRA weights and optimizer state stay fp32
    return peft_model


def trainable_parameters(peft_model) -> list[tuple[str, torch.nn.Parameter]]:
    """(name, parameter) of every trainable tensor, in a stable (sorted) order."""
    return sorted(
        ((n, p) for n, p in peft_model.named_parameters() if p.requires_grad), key=lambda item: item[0]
    )


def adapter_state(peft_model) -> dict[str, torch.Tensor]:
    """Detached CPU copies of the trainable tensors, keyed by parameter name."""
    return {
        name: p.detach().to("cpu", copy=True).contiguous() for name, p in trainable_parameters(peft_model)
    }


@torch.no_grad()
def restore_adapter_state(peft_model, state: dict[str, torch.Tensor]) -> None:
    """Copy `state` into the trainable tensors; names and shapes must match exactly."""
    params = dict(trainable_parameters(peft_model))
    if set(params) != set(state):
        missing = sorted(set(params) - set(state))[:3]
        extra = sorted(set(state) - set(params))[:3]
        raise TrainingError(
            "shape_mismatch",
            f"adapter tensors differ from the model's LoRA layout (missing {missing}, unexpected {extra})",
            failure_reason="shape_mismatch",
        )
    for name, param in params.items():
        if tuple(state[name].shape) != tuple(param.shape):
            raise TrainingError(
                "shape_mismatch",
                f"{name}: shape {tuple(state[name].shape)} != {tuple(param.shape)}",
                failure_reason="shape_mismatch",
            )
        param.copy_(state[name].to(device=param.device, dtype=param.dtype))


def load_base_adapter(
    peft_model, adapter_dir: Path, *, rank: int, alpha: float, target_modules: Sequence[str]
) -> dict:
    """Warm-start the LoRA weights from a published PEFT adapter; return its identity.

    Only weights are loaded: the optimizer starts fresh (use a checkpoint for exact continuation).
    """
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    adapter_dir = Path(adapter_dir)
    config_path = adapter_dir / "adapter_config.json"
    weights_path = adapter_dir / "adapter_model.safetensors"
    if not config_path.is_file() or not weights_path.is_file():
        raise TrainingError(
            "base_adapter_missing",
            f"base adapter {adapter_dir} has no adapter_config.json / adapter_model.safetensors",
            failure_reason="base_adapter_missing",
        )
    try:
        saved = json.loads(config_path.read_text())
        weights = load_file(str(weights_path))
    except Exception as exc:  # noqa: BLE001 - unreadable or corrupt files
        raise TrainingError(
            "adapter_load_failed",
            f"base adapter {adapter_dir} failed to load: {exc}",
            failure_reason="adapter_load_failed",
        ) from exc
    saved_targets = saved.get("target_modules") or []
    saved_targets = sorted([saved_targets] if isinstance(saved_targets, str) else saved_targets)
    mismatches = []
    if saved.get("r") != rank:
        mismatches.append(f"rank {saved.get('r')} != {rank}")
    if float(saved.get("lora_alpha", 0)) != float(alpha):
        mismatches.append(f"lora_alpha {saved.get('lora_alpha')} != {alpha}")
    if saved_targets != sorted(target_modules):
        mismatches.append(f"target_modules {saved_targets} != {sorted(target_modules)}")
    if mismatches:
        raise TrainingError(
            "shape_mismatch",
            "base adapter does not match this run's LoRA shape: "
            + "; ".join(mismatches)
            + " (shape conversion is not implemented; train with the base adapter's rank/alpha/targets)",
            failure_reason="shape_mismatch",
        )
    try:
        result = set_peft_model_state_dict(peft_model, weights)
    except RuntimeError as exc:  # size mismatch
        raise TrainingError(
            "shape_mismatch", f"base adapter weights: {exc}", failure_reason="shape_mismatch"
        ) from exc
    missing = [k for k in getattr(result, "missing_keys", []) if "lora_" in k]
    if missing or getattr(result, "unexpected_keys", []):
        raise TrainingError(
            "shape_mismatch",
            f"base adapter weights do not cover the LoRA layers (missing {missing[:3]}, "
            f"unexpected {list(result.unexpected_keys)[:3]})",
            failure_reason="shape_mismatch",
        )
    return adapter_identity(adapter_dir)


def adapter_content_sha256(adapter_dir: Path) -> str:
    return manifest_digest(file_manifest(Path(adapter_dir), adapter_files(Path(adapter_dir))))


def adapter_identity(adapter_dir: Path) -> dict:
    adapter_dir = Path(adapter_dir)
    files = adapter_files(adapter_dir)
    weights = adapter_dir / "adapter_model.safetensors"
    return {
        "path": str(adapter_dir),
        "adapter_model_sha256": manifest_digest(file_manifest(adapter_dir, files)),
        "adapter_model_bytes": weights.stat().st_size if weights.is_file() else None,
    }


@torch.no_grad()
def lora_delta_norms(peft_model) -> list[dict[str, Any]]:
    """Frobenius norm of each LoRA module's weight delta scaling * B @ A (computed via r x r Grams)."""
    out = []
    for name, module in peft_model.named_modules():
        lora_a, lora_b = getattr(module, "lora_A", None), getattr(module, "lora_B", None)
        if not lora_a or not lora_b or not hasattr(lora_a, "keys"):
            continue
        for key in lora_a.keys():
            a = lora_a[key].weight.detach().double()
            b = lora_b[key].weight.detach().double()
            scale = float(module.scaling[key])
            gram = (b.T @ b) * (a @ a.T)
            out.append(
                {
                    "module": name.removeprefix("base_model.model."),
                    "norm": scale * float(gram.sum().clamp(min=0).sqrt()),
                }
            )
    return out


@dataclass
class StagedAdapter:
    """A saved adapter in a hidden sibling of its final directory (core.artifacts), not yet visible."""

    staged: StagedDirectory
    identity: dict

    @property
    def staging(self) -> Path:
        return self.staged.staging

    @property
    def final(self) -> Path:
        return self.staged.final

    @classmethod
    def save(cls, peft_model, final: Path) -> StagedAdapter:
        final = Path(final)
        if final.exists():
            raise TrainingError(
                "adapter_already_exists", f"{final} already exists; adapters are never overwritten"
            )
        staged = StagedDirectory(final)
        try:
            peft_model.save_pretrained(str(staged.staging), safe_serialization=True)
            # peft's generated model card: not part of the adapter
            (staged.staging / "README.md").unlink(missing_ok=True)
        except BaseException:
            staged.discard()
            raise
        return cls(staged, adapter_identity(staged.staging) | {"path": str(final)})

    def publish(self, extra_json: dict[str, Any]) -> Path:
        """Write the extra JSON files (e.g. train_receipt.json), then publish the folder atomically."""
        try:
            for name, value in extra_json.items():
                (self.staging / name).write_bytes(json_bytes(value))
            if self.final.exists():
                raise TrainingError(
                    "adapter_already_exists", f"{self.final} appeared while training; not overwritten"
                )
            return self.staged.publish()
        except BaseException:
            self.discard()
            raise

    def discard(self) -> None:
        self.staged.discard()


@torch.no_grad()
def adapter_smoke_test(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int = 24,
    template_kwargs: dict | None = None,
) -> dict[str, Any]:
    """Greedy outputs of the base (adapter disabled) and the adapter for each prompt.

    Evidence, not a gate: `passed` means every adapter output was produced from finite logits
    and is non-empty; `changed` counts prompts whose greedy text moved.
    """
    from gpu_runtime.model_loading import render_prompt

    kwargs = dict(template_kwargs or {})
    thinking = bool(kwargs.pop("enable_thinking", False))
    device = next(model.parameters()).device
    results, finite = [], True
    for prompt in prompts:
        _, ids = render_prompt(
            tokenizer, [{"role": "user", "content": prompt}], enable_thinking=thinking, template_kwargs=kwargs
        )
        texts = {}
        for label, ctx in (("base", model.disable_adapter()), ("adapter", nullcontext())):
            with ctx:
                seq = torch.tensor([ids], device=device)
                out_ids = []
                for _ in range(max_new_tokens):
                    logits = model(input_ids=seq).logits[0, -1].float()
                    finite = finite and bool(torch.isfinite(logits).all())
                    token = int(logits.argmax())
                    if token == tokenizer.eos_token_id:
                        break
                    out_ids.append(token)
                    seq = torch.cat([seq, torch.tensor([[token]], device=device)], dim=1)
                texts[label] = tokenizer.decode(out_ids, skip_special_tokens=True)
        results.append(
            {
                "prompt": prompt,
                "base": texts["base"],
                "adapter": texts["adapter"],
                "changed": texts["base"] != texts["adapter"],
            }
        )
    return {
        "prompts": len(results),
        "max_new_tokens": max_new_tokens,
        "decoding": "greedy",
        "changed": sum(r["changed"] for r in results),
        "passed": finite and all(r["adapter"] for r in results),
        "results": results,
    }
