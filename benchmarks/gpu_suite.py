"""The kernels' GPU suite: each Triton kernel against its torch path, a whole GRPO step, the sampler.
Imports no Django.

One prepared command for a session that is lent a GPU; it prints one table:

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_suite.py            # CUDA: the shapes below, bf16
    .venv/bin/python benchmarks/gpu_suite.py --cpu-reduced        # here: reduced shapes, so it is known to work

Rows, at a Qwen3-0.6B-like and a Qwen3-4B-like shape (hidden 1024 / 2560, vocabulary 151,936,
2 groups x 8 completions of 512 tokens, bf16, random weights):
  - linear_logprobs: LM head -> chosen-token log-probs, forward + backward (hidden-state gradient);
  - token_loss: the GRPO loss (token PPO, k3 KL), forward + backward;
  - sampling: filters + draw for 32 rows (top_k 50, top_p 0.9, min_p 0.05);
  - grpo_step: one `train_grpo` run over the 2 groups (reference, policy forward, backward, optimizer);
  - sampler_cN: the batching sampler at N concurrent requests, tokens per second.
Each row gives the torch path and the Triton path: median milliseconds (or tokens/s), and on CUDA
the peak memory the work allocated beyond what was resident. Without CUDA (or with --cpu-reduced)
every shape is cut down and Triton runs under its interpreter (TRITON_INTERPRET=1): those times
show that the command works, not how fast a kernel is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch  # torch does not import triton; transformers does, so TRITON_INTERPRET is set before it

CUDA = torch.cuda.is_available()
REDUCED = "--cpu-reduced" in sys.argv or not CUDA
if REDUCED and not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch.nn.functional as F  # noqa: E402

from core.contracts.grpo_config import GrpoConfig  # noqa: E402
from gpu_runtime.grpo.losses import GrpoBatch, grpo_loss  # noqa: E402
from gpu_runtime.kernels import selection  # noqa: E402
from gpu_runtime.kernels.linear_logprobs import linear_logprobs  # noqa: E402
from gpu_runtime.kernels.sampling import sample  # noqa: E402
from gpu_runtime.sampling import SamplingParams, behavior_logprobs, draw_tokens  # noqa: E402

FULL_SHAPES = {
    "qwen3-0.6b-like": dict(hidden=1024, layers=28, heads=16, kv_heads=8, head_dim=128, intermediate=3072),
    "qwen3-4b-like": dict(hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128, intermediate=9728),
}
REDUCED_SHAPES = {
    "reduced-a": dict(hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, intermediate=128),
    "reduced-b": dict(hidden=96, layers=2, heads=4, kv_heads=2, head_dim=24, intermediate=192),
}
FULL = dict(vocab=151936, groups=2, group_size=8, completion=512, sample_tokens=64, concurrency=(1, 8, 32))
SMALL = dict(vocab=2048, groups=2, group_size=8, completion=24, sample_tokens=4, concurrency=(1, 8, 32))


def sync():
    if CUDA:
        torch.cuda.synchronize()


def measure(fn, repeats: int) -> tuple[float, float | None]:
    """(median ms, peak MiB above the memory resident before) of fn(), after one warm-up call."""
    fn()
    times = []
    peak = None
    for _ in range(repeats):
        if CUDA:
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        sync()
        started = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - started) * 1000.0)
        if CUDA:
            peak = max(peak or 0.0, (torch.cuda.max_memory_allocated() - base) / 2**20)
    return statistics.median(times), peak


def kernel_rows(shape: dict, dims: dict, device, dtype, repeats: int) -> list[tuple]:
    g = torch.Generator(device=device).manual_seed(0)
    tokens = dims["groups"] * dims["group_size"] * dims["completion"]
    hidden = torch.randn(tokens, shape["hidden"], device=device, dtype=dtype, generator=g)
    weight = torch.randn(dims["vocab"], shape["hidden"], device=device, dtype=dtype, generator=g) * 0.02
    targets = torch.randint(0, dims["vocab"], (tokens,), device=device, generator=g)

    def head(fused: bool):
        h = hidden.detach().requires_grad_()
        if fused:
            out, _ = linear_logprobs(h, weight, targets)
        else:  # the trainer's torch path (lean_decoder.lm_logprobs without the norm)
            out = -F.cross_entropy(F.linear(h, weight).float(), targets, reduction="none")
        out.sum().backward()

    rows = [("linear_logprobs", measure(lambda: head(False), repeats), measure(lambda: head(True), repeats))]

    b, t = dims["groups"] * dims["group_size"], dims["completion"]
    cfg = GrpoConfig.from_dict({"kl_coeff": 0.05, "kl_estimator": "k3", "loss": {"echo": None}})
    policy = -torch.rand(b, t, device=device, generator=g) * 3
    reference = policy + 0.1 * torch.randn(b, t, device=device, generator=g)
    mask = torch.rand(b, t, device=device, generator=g) < 0.9
    adv = torch.randn(b, device=device, generator=g)
    fused_choice = selection.KernelChoice("triton", "triton")

    def loss(choice):
        leaf = policy.detach().requires_grad_()
        value, _ = grpo_loss(GrpoBatch(leaf, mask, adv, reference_logprobs=reference), cfg, kernels=choice)
        value.backward()

    rows.append(("token_loss", measure(lambda: loss(None), repeats), measure(lambda: loss(fused_choice), repeats)))

    logits = torch.randn(32, dims["vocab"], device=device, generator=g) * 3
    params = [SamplingParams(top_k=50, top_p=0.9, min_p=0.05)] * 32
    uniforms = torch.rand(32, dtype=torch.float64, device=device, generator=g)

    def draw_torch():
        draw_tokens(behavior_logprobs(logits, params), uniforms)

    rows.append(
        ("sampling", measure(draw_torch, repeats), measure(lambda: sample(logits, params, uniforms=uniforms), repeats))
    )
    return rows


def random_model(parent: Path, name: str, shape: dict, vocab: int, tokenizer_dir: Path) -> Path:
    """A random-weight Qwen3 of `shape` saved with the tiny model's tokenizer (ids past its vocabulary
    decode to nothing, which is all a throughput run needs)."""
    import shutil

    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab, hidden_size=shape["hidden"], num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"], num_key_value_heads=shape["kv_heads"], head_dim=shape["head_dim"],
        intermediate_size=shape["intermediate"], max_position_embeddings=4096, tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    # Initialised where it will run, in its run dtype: a 4B model built in fp32 on the CPU first
    # would cost a device session minutes.
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16 if CUDA else torch.float32)
    try:
        with torch.device("cuda" if CUDA else "cpu"):
            model = Qwen3ForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    out = parent / name
    model.save_pretrained(out)
    del model
    if CUDA:
        torch.cuda.empty_cache()
    for item in tokenizer_dir.iterdir():
        if item.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            shutil.copy(item, out / item.name)
    return out


def grpo_row(model_dir: Path, dims: dict, out: Path) -> tuple:
    from gpu_runtime.grpo.trainer import TrainRequest, train_grpo

    words = " ".join(["seven"] * dims["completion"])  # about one token per word with the tiny tokenizer
    groups = [
        {
            "messages": [{"role": "user", "content": f"Question {i}: count."}],
            "completions": [{"text": f"{j} {words}", "reward": float(j % 3)} for j in range(dims["group_size"])],
        }
        for i in range(dims["groups"])
    ]
    results = []
    for mode in ("torch", "triton"):
        os.environ[selection.ENV] = mode
        config = GrpoConfig.from_dict(
            {"optimizer": {"kind": "adam_w"}, "learning_rate": 1e-4, "lora_rank": 16, "lora_alpha": 32,
             "kl_coeff": 0.05, "kl_estimator": "k3", "seed": 1}
        )
        request = TrainRequest(
            model_dir=model_dir, groups=groups, config=config, output_dir=out / mode, adapter_name=mode,
            checkpoint_root=out, template_kwargs={"enable_thinking": False},
        )
        if CUDA:
            torch.cuda.reset_peak_memory_stats()
        result = train_grpo(request, on_progress=lambda _: None, should_stop=lambda: False)
        timings = result.receipt["phase_timings"]
        ms = sum(timings.get(k, 0.0) for k in ("reference_forward_ms", "policy_forward_ms", "backward_ms", "optimizer_ms"))
        peak = torch.cuda.max_memory_allocated() / 2**20 if CUDA else None
        results.append((ms / dims["groups"], peak))
    os.environ.pop(selection.ENV, None)
    return ("grpo_step (per group)", *results)


def sampler_rows(model_dir: Path, dims: dict) -> list[tuple]:
    from gpu_runtime.model_loading import load_model
    from gpu_runtime.sample_types import SampleRequest
    from gpu_runtime.sampler import Sampler

    loaded = load_model(model_dir)
    rows = []
    samplers = {}
    for mode in ("torch", "triton"):
        os.environ[selection.ENV] = mode
        samplers[mode] = Sampler(loaded)
    os.environ.pop(selection.ENV, None)
    for n in dims["concurrency"]:
        requests = [
            SampleRequest(
                messages=[{"role": "user", "content": f"Tell me fact {i}."}], enable_thinking=False, seed=i,
                sampling=SamplingParams(max_tokens=dims["sample_tokens"], top_p=0.95), ignore_eos=True,
            )
            for i in range(n)
        ]
        cells = []
        for mode in ("torch", "triton"):
            samplers[mode].generate(requests[:1])  # warm-up
            started = time.perf_counter()
            results = samplers[mode].generate(requests)
            elapsed = time.perf_counter() - started
            cells.append((sum(len(r.completion_token_ids) for r in results) / elapsed, None))
        rows.append((f"sampler_c{n} (tok/s)", *cells))
    return rows


def print_table(header: str, rows: list[tuple]) -> None:
    def cell(value):
        ms, peak = value
        return f"{ms:>12.2f} {'' if peak is None else f'{peak:>9.0f}':>9}"

    print(f"\n{header}")
    print(f"| {'row':<24} | {'torch ms|tok/s':>12} {'peak MiB':>9} | {'triton ms|tok/s':>12} {'peak MiB':>9} | {'triton gain':>12} |")
    print(f"|{'-' * 26}|{'-' * 24}|{'-' * 25}|{'-' * 14}|")
    for name, plain, fused in rows:
        # > 1 means the Triton path is faster (less time, or more tokens per second).
        ratio = plain[0] / fused[0] if "tok/s" not in name else fused[0] / plain[0]
        print(f"| {name:<24} | {cell(plain)} | {cell(fused):>23} | {ratio:>12.2f} |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-reduced", action="store_true", help="reduced shapes (the default without CUDA)")
    parser.add_argument("--repeats", type=int, default=1 if REDUCED else 3)
    parser.add_argument("--skip-model", action="store_true", help="only the kernel rows")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if CUDA else "cpu")
    dtype = torch.bfloat16
    shapes, dims = (REDUCED_SHAPES, SMALL) if REDUCED else (FULL_SHAPES, FULL)
    if not CUDA:
        os.environ.setdefault(selection.ENV, "auto")
    name = torch.cuda.get_device_name() if CUDA else "cpu (Triton interpreted)"
    print(f"gpu_suite on {name}, torch {torch.__version__}, {'reduced' if REDUCED else 'full'} shapes, "
          f"vocab {dims['vocab']}, {dims['groups']}x{dims['group_size']} completions of {dims['completion']} "
          f"tokens, kernel inputs {dtype}, median of {args.repeats}")
    from gpu_runtime.tiny_release import install as install_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tokenizer_dir = tmp / "tiny"
        if not args.skip_model:
            install_tiny_model(tokenizer_dir)
        for label, shape in shapes.items():
            rows = kernel_rows(shape, dims, device, dtype, args.repeats)
            if not args.skip_model:
                model_dir = random_model(tmp, label, shape, dims["vocab"], tokenizer_dir)
                rows.append(grpo_row(model_dir, dims, tmp / f"{label}-runs"))
                rows.extend(sampler_rows(model_dir, dims))
            print_table(f"{label}: hidden {shape['hidden']}, {shape['layers']} layers", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
