"""LoRA adapters for the sampler: resolve by name, load with peft, cache, switch per batch. Imports no Django.

Each loaded adapter gets an internal peft name that includes its content digest, so a new
revision published under the same name loads beside the old one: a batch that started on the
old revision finishes on it, and later requests use the new one. The base model is served by
disabling the adapter layers. The first adapter load wraps the LoadedModel's model in a
PeftModel in place; callers that share the model object must expect LoRA layers in it.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpu_runtime.identity import adapter_files, file_manifest, manifest_digest, stat_signature
from gpu_runtime.sample_types import SampleRequestError

# name -> the adapter's folder, or (folder, the registry's content digest of it): with a digest, bytes
# that no longer match it (edited or corrupted since publication) are refused, never served.
AdapterResolver = Callable[[str], "str | Path | tuple[str | Path, str] | None"]
BASE_NAMES = (None, "", "base")
_UNKNOWN = object()  # forces the next activate() to set peft state explicitly


@dataclass(frozen=True)
class AdapterHandle:
    name: str
    key: str  # internal peft adapter name: "<name>@<digest prefix>"
    content_sha256: str
    path: Path

    def identity(self) -> dict:
        return {"name": self.name, "content_sha256": self.content_sha256}


class AdapterManager:
    """Loads adapters on demand (LRU, at most `max_loaded`) and activates one at a time."""

    def __init__(self, loaded_model, resolver: AdapterResolver | None, *, max_loaded: int = 8):
        self._loaded = loaded_model
        self._resolver = resolver
        self._max_loaded = max_loaded
        self._peft = None  # PeftModel wrapping loaded_model.model, created on first load
        self._handles: OrderedDict[str, AdapterHandle] = OrderedDict()  # key -> handle, LRU order
        self._by_name: dict[str, tuple[tuple, AdapterHandle]] = {}  # name -> (stat signature, handle)
        self._active: str | None = None
        self.version = 0  # bumped whenever adapter layers are added or removed (plans go stale)

    @property
    def model(self):
        return self._peft if self._peft is not None else self._loaded.model

    def resident_names(self) -> list[str]:
        """The adapters loaded in memory now (the registry's `loaded` state), least recently used first."""
        return list(self._by_name)

    def resolve(self, name: str | None, *, in_use: set[str]) -> AdapterHandle | None:
        """The handle for adapter `name` (loading it if new or changed on disk); None for the base model."""
        if name in BASE_NAMES:
            return None
        path, expected = self._resolve_path(name)
        files = adapter_files(path)
        if "adapter_config.json" not in files or len(files) < 2:
            raise SampleRequestError(
                "adapter_load_failed", f"Adapter {name!r} at {path} has no adapter config/weights."
            )
        signature = stat_signature(path, files)
        cached = self._by_name.get(name)
        if cached and cached[0] == signature and cached[1].key in self._handles:
            _check_expected(cached[1], expected)
            self._handles.move_to_end(cached[1].key)
            return cached[1]
        digest = manifest_digest(file_manifest(path, files))
        # peft keys modules by adapter name, and module names may not contain dots.
        safe = re.sub(r"[^A-Za-z0-9_-]", "_", name)
        handle = AdapterHandle(name=name, key=f"{safe}@{digest[7:23]}", content_sha256=digest, path=path)
        _check_expected(handle, expected)
        if handle.key not in self._handles:
            self._evict(in_use)
            self._load(handle)
        self._handles[handle.key] = handle
        self._handles.move_to_end(handle.key)
        self._by_name[name] = (signature, handle)
        return handle

    def activate(self, key: str | None) -> None:
        """Make `key` (or the base model, for None) the adapter the next forward pass uses."""
        if self._peft is None or key == self._active:
            return
        tuner = self._peft.base_model
        if key is None:
            tuner.disable_adapter_layers()
        else:
            tuner.enable_adapter_layers()
            self._peft.set_adapter(key, inference_mode=True)
        self._active = key

    def _resolve_path(self, name: str) -> tuple[Path, str | None]:
        """The adapter's folder and the digest its bytes must have (None: not checked)."""
        if self._resolver is None:
            raise SampleRequestError(
                "adapter_not_found", f"No adapter resolver is configured; cannot load {name!r}."
            )
        try:
            resolved = self._resolver(name)
        except SampleRequestError:
            raise  # the resolver's own diagnosis (e.g. the registry is unavailable), not a missing adapter
        except Exception as exc:  # noqa: BLE001 - a registry miss may be any exception type
            raise SampleRequestError("adapter_not_found", f"Adapter {name!r} was not found: {exc}") from exc
        path, expected = resolved if isinstance(resolved, tuple) else (resolved, None)
        if path is None or not Path(path).is_dir():
            raise SampleRequestError("adapter_not_found", f"Adapter {name!r} was not found.")
        return Path(path), expected or None

    def _load(self, handle: AdapterHandle) -> None:
        from peft import PeftModel  # imported here: base-only serving never needs peft

        previous = self._active
        _check_readable(handle)  # fail before peft touches the model, where failures are clean
        self.version += 1
        try:
            if self._peft is None:
                self._peft = PeftModel.from_pretrained(
                    self._loaded.model, handle.path, adapter_name=handle.key, is_trainable=False
                )
                self._peft.eval()
            else:
                self._peft.load_adapter(handle.path, adapter_name=handle.key, is_trainable=False)
            self._peft.to(self._loaded.device)
        except Exception as exc:  # noqa: BLE001 - shape mismatch, bad config, corrupt weights
            # peft may have injected the adapter's layers before failing to load its weights:
            # take them out again so the base model (and other adapters) keep their behaviour.
            if self._peft is None:
                _strip_lora_layers(self._loaded.model)
            elif handle.key in self._peft.peft_config:
                self._peft.delete_adapter(handle.key)
            self._active = _UNKNOWN
            self.activate(previous)
            raise SampleRequestError(
                "adapter_load_failed", f"Adapter {handle.name!r} failed to load: {exc}"
            ) from exc
        # Loading may change which adapter peft considers active; put back what was active.
        self._active = _UNKNOWN
        self.activate(previous)

    def _evict(self, in_use: set[str]) -> None:
        while len(self._handles) >= self._max_loaded:
            victim = next((key for key in self._handles if key not in in_use and key != self._active), None)
            if victim is None:
                return
            self._handles.pop(victim)
            self.version += 1
            self._peft.delete_adapter(victim)


def _check_readable(handle: AdapterHandle) -> None:
    """Parse the adapter config and open its weights without touching the model."""
    from peft import PeftConfig
    from safetensors import safe_open

    try:
        PeftConfig.from_pretrained(handle.path)
        weights = handle.path / "adapter_model.safetensors"
        if weights.is_file():
            with safe_open(weights, framework="pt") as fh:
                list(fh.keys())
    except Exception as exc:  # noqa: BLE001 - any parse error means an unusable adapter
        raise SampleRequestError(
            "adapter_load_failed", f"Adapter {handle.name!r} is unreadable: {exc}"
        ) from exc


def _strip_lora_layers(model) -> None:
    """Put every peft-wrapped module of `model` back to its base layer (undo a failed first load)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(model.named_modules()):
        if isinstance(module, BaseTunerLayer):
            parent_name, _, child = name.rpartition(".")
            parent = model.get_submodule(parent_name) if parent_name else model
            setattr(parent, child, module.get_base_layer())


def _check_expected(handle: AdapterHandle, expected: str | None) -> None:
    """Refuse an adapter whose files no longer hash to the registry's digest: the bytes that serve
    must be the bytes that were published, evaluated and promoted."""
    if expected and handle.content_sha256 != expected:
        raise SampleRequestError(
            "adapter_content_mismatch",
            f"Adapter {handle.name!r} at {handle.path} now hashes to {handle.content_sha256}, but the "
            f"registry published {expected}: its files changed after publication, so it is not served. "
            f"Run `kiln adapters verify {handle.name}` to see which file changed.",
        )
