"""Is a folder a LoRA adapter for the served base model? Read without torch: JSON and safetensors headers.

A safetensors file is an 8-byte little-endian header length, a JSON header (`{name: {dtype, shape,
data_offsets: [begin, end]}}`, plus an optional `__metadata__`), then the tensor bytes. The adapter's
tensors are checked against the base model's own weight headers (`model.safetensors` or the shards
of `model.safetensors.index.json`) and its `config.json` (hidden size, number of layers), so a LoRA
made for another model, or with the wrong shapes, is refused before anything serves it.

Pure module: os and json only (no Django, no torch).
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "U16": 2, "U32": 4, "U64": 8, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}
PEFT_PREFIX = "base_model.model."
_LAYER = re.compile(r"\.layers\.(\d+)\.")
# LoRA tensor suffix -> (which base dimension it must match, which of its own dimensions holds it)
_LORA_SUFFIXES = (".lora_A.weight", ".lora_B.weight", ".lora_embedding_A", ".lora_embedding_B",
                  ".lora_magnitude_vector")


class LayoutError(ValueError):
    """The folder is not an adapter Kiln can serve on this base model; the message says why."""


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """The tensors of a safetensors file: {name: {dtype, shape, data_offsets}}, checked for consistency
    (known dtypes, byte ranges that match the shapes and lie inside the file)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise LayoutError(f"{path.name}: not a safetensors file (shorter than its 8-byte header length)")
        (length,) = struct.unpack("<Q", prefix)
        if length > min(MAX_HEADER_BYTES, size - 8):
            raise LayoutError(f"{path.name}: not a safetensors file (header length {length} does not fit "
                              f"in its {size} bytes)")
        raw = fh.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise LayoutError(f"{path.name}: the safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise LayoutError(f"{path.name}: the safetensors header is not a JSON object")
    data_size = size - 8 - length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict) or entry.get("dtype") not in DTYPE_BYTES:
            raise LayoutError(f"{path.name}: tensor {name!r} has no known dtype")
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if (not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                   for d in shape)):
            raise LayoutError(f"{path.name}: tensor {name!r} has no valid shape")
        if (not isinstance(offsets, list) or len(offsets) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_size):
            raise LayoutError(f"{path.name}: tensor {name!r} has data offsets outside the file")
        if offsets[1] - offsets[0] != math.prod(shape) * DTYPE_BYTES[entry["dtype"]]:
            raise LayoutError(f"{path.name}: tensor {name!r} holds {offsets[1] - offsets[0]} bytes; "
                              f"its shape {shape} in {entry['dtype']} needs {math.prod(shape) * DTYPE_BYTES[entry['dtype']]}")
        tensors[name] = {"dtype": entry["dtype"], "shape": shape, "data_offsets": offsets}
    return tensors


def base_model_facts(model_dir: Path) -> tuple[dict, dict[str, list[int]]]:
    """(config.json, {weight name: shape}) of the served base model, read from its headers."""
    model_dir = Path(model_dir)
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise LayoutError(f"the served base model's config.json cannot be read ({exc})") from None
    if isinstance(config.get("text_config"), dict):  # multimodal wrappers keep the decoder's config inside
        config = {**config, **config["text_config"]}
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise LayoutError(f"the served base model's weight index cannot be read ({exc})") from None
    else:
        shards = sorted(p.name for p in model_dir.glob("*.safetensors"))
    if not shards:
        raise LayoutError("the served base model has no safetensors weights to check the adapter against")
    shapes: dict[str, list[int]] = {}
    for shard in shards:
        for name, entry in read_safetensors_header(model_dir / shard).items():
            shapes[name] = entry["shape"]
    return config, shapes


def _module_shape(module: str, shapes: dict[str, list[int]], config: dict) -> list[int] | None:
    shape = shapes.get(f"{module}.weight")
    if shape is None and module.endswith("lm_head") and config.get("tie_word_embeddings"):
        shape = next((s for n, s in shapes.items() if n.endswith("embed_tokens.weight")), None)
    return shape


def _split_lora(name: str) -> tuple[str, str] | None:
    for suffix in _LORA_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)], suffix
    return None


def _dimension_problem(suffix: str, own: list[int], base: list[int]) -> str | None:
    """Why a LoRA tensor does not fit the base weight it adapts (base is [out_features, in_features])."""
    if len(base) != 2:
        return f"it adapts a {len(base)}-dimensional weight"
    out_features, in_features = base
    if suffix in (".lora_A.weight", ".lora_B.weight", ".lora_embedding_A", ".lora_embedding_B") and len(own) != 2:
        return f"has shape {own}, not two dimensions"
    if suffix == ".lora_A.weight" and own[1] != in_features:
        return f"has in_features {own[1]}; the base model's is {in_features}"
    if suffix == ".lora_B.weight" and own[0] != out_features:
        return f"has out_features {own[0]}; the base model's is {out_features}"
    if suffix == ".lora_embedding_A" and own[1] != out_features:  # embeddings are [num_embeddings, dim]
        return f"covers {own[1]} embeddings; the base model has {out_features}"
    if suffix == ".lora_embedding_B" and own[0] != in_features:
        return f"has embedding size {own[0]}; the base model's is {in_features}"
    if suffix == ".lora_magnitude_vector" and own not in ([out_features], [1, out_features]):
        return f"has shape {own}; the base model's out_features are {out_features}"
    return None


def _target_modules(adapter_config: dict, module_names: set[str]) -> list[str]:
    targets = adapter_config.get("target_modules")
    if isinstance(targets, str):  # peft reads a string as a regular expression over module names
        try:
            pattern = re.compile(targets)
        except re.error:
            raise LayoutError(f"{CONFIG_FILE}: target_modules {targets!r} is not a valid regular expression") from None
        if not any(pattern.fullmatch(m) for m in module_names):
            raise LayoutError(f"{CONFIG_FILE}: target_modules {targets!r} matches no module of the base model")
        return [targets]
    if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
        raise LayoutError(f"{CONFIG_FILE}: target_modules must name the adapted modules")
    leaves = {m.rsplit(".", 1)[-1] for m in module_names}
    for target in targets:
        if target not in leaves and not any(m == target or m.endswith(f".{target}") for m in module_names):
            raise LayoutError(f"{CONFIG_FILE}: target module {target!r} is not a module of the base model",)
    return sorted(targets)


def check_peft_adapter(adapter_dir: Path, model_dir: Path) -> dict:
    """Check a LoRA adapter folder against the base model; return a summary, or raise LayoutError."""
    adapter_dir = Path(adapter_dir)
    for required in (CONFIG_FILE, WEIGHTS_FILE):
        if not (adapter_dir / required).is_file():
            raise LayoutError(f"the archive has no {required} (a PEFT adapter holds {CONFIG_FILE} and {WEIGHTS_FILE})")
    try:
        adapter_config = json.loads((adapter_dir / CONFIG_FILE).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise LayoutError(f"{CONFIG_FILE} is not JSON") from None
    if not isinstance(adapter_config, dict):
        raise LayoutError(f"{CONFIG_FILE} is not a JSON object")
    peft_type = adapter_config.get("peft_type")
    if not isinstance(peft_type, str) or peft_type.upper() != "LORA":
        raise LayoutError(f"{CONFIG_FILE}: peft_type is {peft_type!r}; Kiln serves LoRA adapters only")
    config, base_shapes = base_model_facts(model_dir)
    hidden, layers = config.get("hidden_size"), config.get("num_hidden_layers")
    module_names = {n[: -len(".weight")] for n in base_shapes if n.endswith(".weight")}
    targets = _target_modules(adapter_config, module_names)
    tensors = read_safetensors_header(adapter_dir / WEIGHTS_FILE)
    if not tensors:
        raise LayoutError(f"{WEIGHTS_FILE} holds no tensors")
    ranks: dict[str, dict[str, int]] = {}
    adapted = set()
    for name, entry in sorted(tensors.items()):
        shape = entry["shape"]
        inner = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
        layer = _LAYER.search(f".{inner}")
        if layer and isinstance(layers, int) and int(layer.group(1)) >= layers:
            raise LayoutError(f"{WEIGHTS_FILE}: tensor {name!r} adapts layer {layer.group(1)}; the base model "
                              f"has {layers} layers (num_hidden_layers)")
        split = _split_lora(inner)
        if split is None:  # modules_to_save: a full copy of a base weight
            base = base_shapes.get(inner)
            if base is None:
                raise LayoutError(f"{WEIGHTS_FILE}: tensor {name!r} is neither a LoRA weight nor a weight of "
                                  "the base model")
            if shape != base:
                raise LayoutError(f"{WEIGHTS_FILE}: tensor {name!r} has shape {shape}; the base model's is {base}")
            continue
        module, suffix = split
        base = _module_shape(module, base_shapes, config)
        if base is None:
            raise LayoutError(f"{WEIGHTS_FILE}: tensor {name!r} adapts {module!r}, which the base model does not have")
        problem = _dimension_problem(suffix, shape, base)
        if problem:
            context = f" (hidden_size {hidden})" if hidden in base else ""
            raise LayoutError(f"{WEIGHTS_FILE}: tensor {name!r} {problem}{context}")
        adapted.add(module)
        if suffix in (".lora_A.weight", ".lora_embedding_A"):
            ranks.setdefault(module, {})["A"] = shape[0]
        elif suffix in (".lora_B.weight", ".lora_embedding_B"):
            ranks.setdefault(module, {})["B"] = shape[1]
    for module, pair in sorted(ranks.items()):
        if set(pair) != {"A", "B"}:
            raise LayoutError(f"{WEIGHTS_FILE}: {module!r} has lora_{next(iter(pair))} without its partner")
        if pair["A"] != pair["B"]:
            raise LayoutError(f"{WEIGHTS_FILE}: {module!r} has lora_A of rank {pair['A']} and lora_B of rank {pair['B']}")
    rank = adapter_config.get("r")
    if isinstance(rank, int) and not adapter_config.get("rank_pattern"):
        wrong = sorted(m for m, pair in ranks.items() if pair["A"] != rank)
        if wrong:
            raise LayoutError(f"{WEIGHTS_FILE}: {wrong[0]!r} has rank {ranks[wrong[0]]['A']}; {CONFIG_FILE} says r={rank}")
    if not adapted:
        raise LayoutError(f"{WEIGHTS_FILE} holds no LoRA weights")
    return {"peft_type": "LORA", "r": rank, "lora_alpha": adapter_config.get("lora_alpha"),
            "target_modules": targets, "adapted_modules": len(adapted), "tensors": len(tensors),
            "hidden_size": hidden, "num_hidden_layers": layers}
