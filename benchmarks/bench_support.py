"""Shared pieces of the CPU scaling benchmarks (grpo_scaling.py, sampler.py). Imports no Django.

- the two models: the shipped tiny model (what `kiln model create-tiny` installs) and a
  random-weight Qwen3 of 25.7 M parameters (hidden 512, 8 layers, the tiny tokenizer);
- the machine's fp32 matmul peak, measured with a large `torch.matmul`;
- a FLOP model of a Qwen3 forward / backward / decode, so each side's achieved FLOP/s can be
  set against that peak;
- peak resident memory of the current process.

Also runs as a script: `python benchmarks/bench_support.py [--threads N]` prints the matmul peak.
"""

from __future__ import annotations

import json
import resource
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

from core.contracts.training_memory import ModelShape  # noqa: E402 - after the path is set

# The larger model of the issue: a random-weight Qwen3 with the tiny model's tokenizer and vocabulary.
Q25M_SHAPE = {
    "hidden_size": 512,
    "intermediate_size": 1536,
    "num_hidden_layers": 8,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 64,
}
MODELS = ("tiny", "q25m")


def install_tiny(parent: Path) -> Path:
    """The shipped tiny model (the release `kiln model create-tiny` installs) under `parent`."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from gpu_runtime.tiny_release import install

    out = Path(parent) / "tiny"
    if not (out / "config.json").is_file():
        install(out)
    return out


def build_q25m(parent: Path, tiny_dir: Path, seed: int = 0) -> Path:
    """A random-weight Qwen3 of Q25M_SHAPE (25.7 M parameters, tied embeddings) with the tiny tokenizer."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = Path(parent) / "q25m"
    if (out / "config.json").is_file():
        return out
    tiny_config = json.loads((Path(tiny_dir) / "config.json").read_text())
    config = Qwen3Config(
        vocab_size=tiny_config["vocab_size"],
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        eos_token_id=tiny_config["eos_token_id"],
        pad_token_id=tiny_config["pad_token_id"],
        bos_token_id=tiny_config.get("bos_token_id"),
        rms_norm_eps=tiny_config["rms_norm_eps"],
        **Q25M_SHAPE,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config).to(torch.float32)
    model.save_pretrained(out)
    for item in Path(tiny_dir).iterdir():
        if item.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            shutil.copy(item, out / item.name)
    return out


def prepare_models(parent: Path, names=MODELS) -> dict[str, Path]:
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    tiny = install_tiny(parent)
    out = {"tiny": tiny}
    if "q25m" in names:
        out["q25m"] = build_q25m(parent, tiny)
    return {name: out[name] for name in names}


def matmul_peak(threads: int, size: int = 2048, repeats: int = 6) -> float:
    """The fp32 matmul peak (FLOP/s) at `threads` torch threads: the best of `repeats` large matmuls."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size), torch.randn(size, size)
        c = torch.empty(size, size)
        torch.matmul(a, b, out=c)
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            torch.matmul(a, b, out=c)
            best = min(best, time.perf_counter() - started)
    finally:
        torch.set_num_threads(before)
    return 2.0 * size**3 / best


def peak_rss_mib() -> float:
    """Peak resident set size of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class Shape(ModelShape):
    """What the FLOP model needs of a Qwen3-style config (the shape the memory preflight reads too)."""

    @classmethod
    def of(cls, model_dir: Path) -> Shape:
        return cls.from_config(json.loads((Path(model_dir) / "config.json").read_text()))

    def dense_params(self) -> int:
        """Matmul weights of the decoder layers (q, k, v, o, gate, up, down), LM head excluded."""
        q, kv = self.query_width, self.kv_width
        per_layer = self.hidden * (q + 2 * kv) + q * self.hidden + 3 * self.hidden * self.intermediate
        return self.layers * per_layer

    def lora_params(self, rank: int) -> int:
        """LoRA on q, k, v and o (the trainer's default targets)."""
        return self.lora_parameters(rank)

    def total_params(self) -> int:
        return self.dense_params() + self.vocab * self.hidden  # tied embeddings / LM head


def forward_flops(shape: Shape, rows: list[tuple[int, int, int]], rank: int = 8) -> float:
    """FLOPs of one forward over `rows`, each (tokens fed, context before them, positions whose
    LM-head logits are taken): decoder matmuls + LoRA + causal attention + the LM head."""
    per_token = 2 * (shape.dense_params() + shape.lora_params(rank))
    attn_width = shape.heads * shape.head_dim
    total = 0.0
    for tokens, context, logits in rows:
        # query i (0-based within the row) sees context + i + 1 keys: QK^T and AV, 2 FLOPs a MAC each
        keys = tokens * context + tokens * (tokens + 1) / 2
        total += per_token * tokens + 4 * attn_width * keys * shape.layers + 2 * shape.hidden * shape.vocab * logits
    return total


def backward_flops(shape: Shape, rows: list[tuple[int, int, int]], rank: int = 8) -> float:
    """FLOPs of the backward of `forward_flops(rows)` with frozen base weights: the input gradient
    of every matmul (as much as its forward), twice the attention (dQ, dK and dV, dP) and the LoRA
    weight gradients. Recomputed forwards (gradient checkpointing) are not useful work and not counted."""
    per_token_dense = 2 * shape.dense_params()
    lora = 2 * shape.lora_params(rank) * 2  # input and weight gradient of A and B
    attn_width = shape.heads * shape.head_dim
    total = 0.0
    for tokens, context, logits in rows:
        keys = tokens * context + tokens * (tokens + 1) / 2
        total += (per_token_dense + lora) * tokens + 8 * attn_width * keys * shape.layers
        total += 2 * shape.hidden * shape.vocab * logits
    return total


def generation_flops(shape: Shape, prompt_lengths: list[int], new_tokens: int, rank: int = 8) -> float:
    """Prefill of every prompt plus `new_tokens - 1` decode steps each (the last sampled token is
    never fed back), with the LM head on the last prompt position and every decode step."""
    rows = [(p, 0, 1) for p in prompt_lengths]
    rows += [(1, p + j, 1) for p in prompt_lengths for j in range(new_tokens - 1)]
    return forward_flops(shape, rows, rank)


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="print the fp32 matmul peak of this machine")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--size", type=int, default=2048)
    args = parser.parse_args(argv)
    print(f"fp32 matmul peak at {args.threads} thread(s): {matmul_peak(args.threads, args.size) / 1e9:.1f} GFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
