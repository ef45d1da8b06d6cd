"""Content identities of a model directory, its tokenizer and an adapter. Imports no Django (nor torch).

All digests are `sha256:<hex>`. File manifests are RFC 8785 canonical JSON of
`[{file, size, sha256}]` sorted by relative path; the chat template is hashed as its raw UTF-8
bytes so `sha256sum chat_template.jinja` reproduces it.

The file and adapter digests live in `core.content_identity` (re-exported here) so the web side
can recompute an adapter's content digest without importing gpu_runtime.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from core.canonical import json_digest, sha256_digest
from core.content_identity import (  # noqa: F401 (re-exported)
    ADAPTER_FILES,
    adapter_content_sha256,
    adapter_files,
    file_manifest,
    file_sha256,
    manifest_digest,
)

WEIGHT_SUFFIXES = (".safetensors",)
LEGACY_WEIGHT_SUFFIXES = (".bin", ".pt", ".pth")


def weight_shards(model_dir: Path) -> list[str]:
    """Relative names of the weight shards: safetensors if any exist, else legacy pickles."""
    model_dir = Path(model_dir)
    names = sorted(p.name for p in model_dir.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
    if not names:
        names = sorted(
            p.name for p in model_dir.iterdir() if p.is_file() and p.name.endswith(LEGACY_WEIGHT_SUFFIXES)
        )
    return names


def stat_signature(root: Path, files: Iterable[str]) -> tuple:
    """Cheap change detector (name, size, mtime_ns) used to decide when to re-hash."""
    sig = []
    for name in sorted(files):
        st = os.stat(Path(root) / name)
        sig.append((name, st.st_size, st.st_mtime_ns))
    return tuple(sig)


def tokenizer_identity(tokenizer) -> dict:
    """vocab, config and chat-template digests of a loaded Hugging Face tokenizer.

    - vocab_sha256: the tokenizer model (vocabulary and merges) plus the added tokens, read from
      the fast tokenizer's own serialisation, so formatting of tokenizer.json does not matter;
    - config_sha256: everything else that changes token ids or decoding (normalizer,
      pre-tokenizer, post-processor, decoder) and the special tokens;
    - chat_template_sha256: the template's UTF-8 bytes.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        spec = json.loads(backend.to_str())
        vocab = {"model": spec.get("model"), "added_tokens": spec.get("added_tokens")}
        pipeline = {k: spec.get(k) for k in ("normalizer", "pre_tokenizer", "post_processor", "decoder")}
    else:  # a slow tokenizer: the vocabulary is all we can see
        vocab = {"vocab": tokenizer.get_vocab()}
        pipeline = {}
    specials = {
        name: getattr(tokenizer, name, None) for name in ("bos_token", "eos_token", "pad_token", "unk_token")
    }
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else ""
    return {
        "vocab_sha256": json_digest(vocab),
        "config_sha256": json_digest(
            {"pipeline": pipeline, "special_tokens": {k: str(v) if v else None for k, v in specials.items()}}
        ),
        "chat_template_sha256": sha256_digest(template.encode("utf-8")),
    }
