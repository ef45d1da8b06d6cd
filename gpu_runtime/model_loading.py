"""Load a local Hugging Face causal LM with its tokenizer and chat template, and fix its identity. Imports no Django.

Nothing is ever fetched from a hub (`local_files_only=True`). CPU runs float32; CUDA runs bfloat16.
The identity hashes (weights, tokenizer, chat template, inference configuration) are computed once
here and travel with the `LoadedModel`, so every rollout can name exactly what produced it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import peft
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.canonical import json_digest
from gpu_runtime.identity import file_manifest, manifest_digest, tokenizer_identity, weight_shards
from gpu_runtime.shared_base import SharedBase

SAMPLER_IMPLEMENTATION = "kiln.gpu_runtime.sampler/1"
ATTN_IMPLEMENTATION = "sdpa"


class ModelLoadError(Exception):
    """A model could not be loaded. `code` is stable and safe to show; `message` says what to fix.

    Codes: model_not_configured, model_path_missing, model_path_invalid, model_weights_missing,
    tokenizer_load_failed, chat_template_missing, model_load_failed.
    """

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    identity: dict  # plain JSON-able dict, see identity_of()
    device: torch.device
    dtype: torch.dtype
    path: Path
    served_model_id: str
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    # The base weights as loaded, for a trainer in this process to build on (no second copy).
    shared_base: SharedBase | None = None
    # Recent renders by their inputs' JSON: a GRPO group sends one prompt with many seeds.
    _rendered: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def render_prompt(
        self,
        messages: list[dict],
        *,
        enable_thinking: bool = True,
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> tuple[str, list[int]]:
        """Render chat messages through the model's template; return (text, token ids)."""
        call = dict(enable_thinking=enable_thinking, add_generation_prompt=add_generation_prompt, tools=tools,
                    template_kwargs=template_kwargs)
        key = _render_key(self.tokenizer, messages, call)
        remembered = self._rendered.get(key) if key is not None else None  # one lookup: another thread may clear
        if remembered is not None:
            text, ids = remembered
            return text, list(ids)
        text, ids = render_prompt(self.tokenizer, messages, **call)
        if key is not None:
            if len(self._rendered) >= RENDER_CACHE_SIZE:
                self._rendered.clear()
            self._rendered[key] = (text, tuple(ids))
        return text, ids


RENDER_CACHE_SIZE = 1024


def _render_key(tokenizer, messages, call: dict) -> str | None:
    """The JSON of a render's inputs, or None when it must not be cached: inputs that are not plain
    JSON, or a template that reads the clock (`strftime_now`: today's date in the prompt)."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or "strftime_now" in template:
        return None
    try:
        # The template's own hash too: a tokenizer whose template is swapped must not get old renders.
        return json.dumps([hash(template), messages, call], sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):
        return None


def default_device() -> tuple[torch.device, torch.dtype]:
    if torch.cuda.is_available():
        return torch.device("cuda"), torch.bfloat16
    return torch.device("cpu"), torch.float32


def load_model(
    path: str | os.PathLike | None,
    *,
    served_model_id: str | None = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> LoadedModel:
    """Load the model directory at `path` for inference; raise ModelLoadError with a stable code."""
    if path is None or str(path).strip() == "":
        raise ModelLoadError(
            "model_not_configured", "No model is configured; set KILN_MODEL_PATH or model.path in kiln.toml."
        )
    model_dir = Path(path).expanduser()
    if not model_dir.exists():
        raise ModelLoadError("model_path_missing", f"Model directory {model_dir} does not exist.")
    if not model_dir.is_dir() or not (model_dir / "config.json").is_file():
        raise ModelLoadError(
            "model_path_invalid", f"{model_dir} is not a Hugging Face model directory (no config.json)."
        )
    shards = weight_shards(model_dir)
    if not shards:
        raise ModelLoadError("model_weights_missing", f"{model_dir} holds no *.safetensors weight files.")

    default_dev, default_dtype = default_device()
    device = torch.device(device) if device is not None else default_dev
    dtype = dtype or (default_dtype if device.type == default_dev.type else torch.float32)

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure here is a broken tokenizer
        raise ModelLoadError(
            "tokenizer_load_failed", f"Tokenizer in {model_dir} failed to load: {exc}"
        ) from exc
    if not isinstance(getattr(tokenizer, "chat_template", None), str) or not tokenizer.chat_template:
        raise ModelLoadError("chat_template_missing", f"The tokenizer in {model_dir} has no chat template.")
    try:
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, local_files_only=True, dtype=dtype, attn_implementation=ATTN_IMPLEMENTATION
        )
        model.to(device)
        model.eval()
    except Exception as exc:  # noqa: BLE001 - corrupt weights, unknown architecture, OOM...
        raise ModelLoadError("model_load_failed", f"Model in {model_dir} failed to load: {exc}") from exc

    served_model_id = served_model_id or model_dir.resolve().name
    weights_identity = identity_of(model_dir, tokenizer, shards=shards, device=device, dtype=dtype)
    identity = {**weights_identity, "served_model_id": served_model_id}
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        identity=identity,
        device=device,
        dtype=dtype,
        path=model_dir,
        served_model_id=served_model_id,
        eos_token_ids=eos_token_ids(model, tokenizer),
        shared_base=SharedBase.of(model, path=model_dir, device=device, dtype=dtype, identity=weights_identity),
    )


def identity_of(
    model_dir: Path, tokenizer, *, shards: list[str], device: torch.device, dtype: torch.dtype
) -> dict:
    """The behaviour-defining identity of a loaded model, as a plain dict."""
    weights = file_manifest(model_dir, shards)
    inference_config = {
        "schema": "kiln.inference-config.v1",
        "device_type": device.type,
        "dtype": str(dtype).removeprefix("torch."),
        "attn_implementation": ATTN_IMPLEMENTATION,
        "sampling_dtype": "float32",
        "cdf_dtype": "float64",
    }
    return {
        "base_model_sha256": manifest_digest(weights),
        "weights_manifest": weights,
        "tokenizer": tokenizer_identity(tokenizer),
        "inference_config": inference_config,
        "inference_config_sha256": json_digest(inference_config),
        "implementation": (
            f"{SAMPLER_IMPLEMENTATION} torch/{torch.__version__} "
            f"transformers/{transformers.__version__} peft/{peft.__version__}"
        ),
        "generation_backend": f"torch-{device.type}",
    }


def eos_token_ids(model, tokenizer) -> tuple[int, ...]:
    """Tokens that end a completion: generation_config's eos ids plus the tokenizer's eos."""
    ids: list[int] = []
    gen = getattr(model, "generation_config", None)
    configured = getattr(gen, "eos_token_id", None) if gen is not None else None
    if isinstance(configured, int):
        ids.append(configured)
    elif configured:
        ids.extend(int(i) for i in configured)
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    return tuple(dict.fromkeys(ids))


def normalize_messages(messages: list[dict]) -> list[dict]:
    """Flatten content parts to text and turn None into "" (reference-spec §2.1), leaving other keys."""
    out = []
    for message in messages:
        message = dict(message)
        content = message.get("content")
        if content is None:
            message["content"] = ""
        elif isinstance(content, list):
            message["content"] = "".join(
                part.get("text", "")
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            )
        out.append(message)
    return out


def render_prompt(
    tokenizer,
    messages: list[dict],
    *,
    enable_thinking: bool = True,
    add_generation_prompt: bool = True,
    tools: list[dict] | None = None,
    template_kwargs: dict | None = None,
) -> tuple[str, list[int]]:
    """Render through the chat template and tokenize without adding special tokens (the template has them)."""
    kwargs = dict(template_kwargs or {})
    kwargs["enable_thinking"] = enable_thinking
    text = tokenizer.apply_chat_template(
        normalize_messages(messages),
        tools=tools or None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
        **kwargs,
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    return text, ids
