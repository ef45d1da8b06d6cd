"""Benchmark: Kiln's batched sampler vs Hugging Face `generate` (static cache): tokens/s and time to first token.

For each model (`tiny`: the shipped tiny model; `q25m`: a random-weight Qwen3 of 25.7 M
parameters, hidden 512, 8 layers, the tiny tokenizer; or `--model DIR`) and each concurrency
(default 1, 8 and 32 requests at once), both sides decode the same prompts for exactly
`--tokens` new tokens (end-of-turn ignored) with plain temperature-1 sampling:
- kiln: every request submitted to `gpu_runtime.sampler.Sampler` at once (continuous batching);
  a kiln.rollout-provenance.v1 record is built for every completion inside the timed region;
- hf-static: one left-padded batch through `model.generate(cache_implementation="static")`, the
  strongest CPU baseline transformers has (on the CPU it does not compile the forward);
- hf-dynamic (`--hf-caches static,dynamic`): the same with the default dynamic cache.
Tokens per second = tokens produced / wall time of the whole call. Time to first token = from the
call's start to a request's first sampled token (Kiln: its `on_token` callback; transformers: the
streamer's first put after the prompt), the median over the requests. Sides alternate run by
run after one warm-up of each; medians of `--repeats` runs. Run:

    .venv/bin/python benchmarks/sampler.py [--models tiny,q25m] [--concurrency 1 8 32] [--tokens 64] [--repeats 3]

Prints one table (ratio kiln/hf-static > 1 means Kiln is faster); never asserts speed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import bench_support as bench  # noqa: E402

from core.contracts.provenance import build_rollout_provenance  # noqa: E402
from gpu_runtime.model_loading import load_model  # noqa: E402
from gpu_runtime.sample_types import SampleRequest  # noqa: E402
from gpu_runtime.sampler import Sampler  # noqa: E402
from gpu_runtime.sampling import SamplingParams  # noqa: E402

PROMPTS = [
    "What is 47 + 13? Reply with just the number.",
    "What is 8 + 91? Reply with just the number.",
    'Reply with one JSON object that sets "delta" to 2.',
    "Hello!",
    "Compute 60 + 25. Reply with just the number.",
    "Tell me a fact.",
    "What is 5 + 5? Reply with just the number.",
    "Return a JSON object with amount = 7.",
]


def kiln_run(sampler: Sampler, messages: list[list[dict]], tokens: int) -> dict:
    first: dict[int, float] = {}

    def on_token(i):
        def record(ids):
            if i not in first:
                first[i] = time.perf_counter()

        return record

    requests = [
        SampleRequest(
            messages=m,
            enable_thinking=False,
            seed=i,
            ignore_eos=True,
            sampling=SamplingParams(temperature=1.0, max_tokens=tokens),
            on_token=on_token(i),
        )
        for i, m in enumerate(messages)
    ]
    start = time.perf_counter()
    results = sampler.generate(requests)
    for m, r in zip(messages, results, strict=True):
        build_rollout_provenance(r, prompt_messages=m)
    elapsed = time.perf_counter() - start
    return {
        "seconds": elapsed,
        "tokens": sum(len(r.completion_token_ids) for r in results),
        "ttft_ms": statistics.median((t - start) * 1000 for t in first.values()),
    }


class FirstTokenClock:
    """A `generate` streamer that notes when the first new tokens arrive (the first put is the prompt)."""

    def __init__(self):
        self.puts = 0
        self.first = None

    def put(self, value):
        self.puts += 1
        if self.puts == 2:
            self.first = time.perf_counter()

    def end(self):
        pass


def hf_run(loaded, messages: list[list[dict]], tokens: int, cache: str) -> dict:
    tok = loaded.tokenizer
    prompts = [loaded.render_prompt(m, enable_thinking=False)[1] for m in messages]
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=loaded.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=loaded.device)
    extra = {"cache_implementation": "static"} if cache == "static" else {}
    clock = FirstTokenClock()
    torch.manual_seed(0)
    start = time.perf_counter()
    with torch.inference_mode():
        out = loaded.model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=tokens,
            min_new_tokens=tokens,
            pad_token_id=pad,
            streamer=clock,
            **extra,
        )
    elapsed = time.perf_counter() - start
    return {
        "seconds": elapsed,
        "tokens": (out.shape[1] - width) * len(prompts),
        "ttft_ms": (clock.first - start) * 1000,
    }


def measure(fns: dict, repeats: int) -> dict:
    """Median tokens/s and time to first token of each side, run alternately (same machine load)."""
    runs = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            runs[name].append(fn())
    return {
        name: {
            "tok_s": statistics.median(r["tokens"] / r["seconds"] for r in values),
            "ttft_ms": statistics.median(r["ttft_ms"] for r in values),
        }
        for name, values in runs.items()
    }


def bench_model(name: str, model_dir: Path, caches: list[str], args) -> None:
    loaded = load_model(model_dir)
    sampler = Sampler(loaded)
    for conc in args.concurrency:
        messages = [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(conc)]
        fns = {"kiln": lambda messages=messages: kiln_run(sampler, messages, args.tokens)}
        for c in caches:
            fns[c] = lambda messages=messages, c=c: hf_run(loaded, messages, args.tokens, c)
        kiln_run(sampler, messages, 4)  # warm every path once at this batch
        for c in caches:
            hf_run(loaded, messages, 4, c)
        rates = measure(fns, args.repeats)
        k = rates["kiln"]
        line = f"{name:6} {conc:>4}  {k['tok_s']:>10.1f}"
        line += "".join(f"  {rates[c]['tok_s']:>17.1f}" for c in caches)
        line += f"  {k['ttft_ms']:>12.1f}" + "".join(f"  {rates[c]['ttft_ms']:>16.1f}" for c in caches)
        line += "".join(f"  {k['tok_s'] / rates[c]['tok_s']:>15.2f}" for c in caches)
        print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="tiny,q25m", help="comma-separated of tiny, q25m")
    parser.add_argument("--model", type=Path, help="a model directory instead of --models")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--hf-caches", default="static", help="comma-separated of static, dynamic")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--models-dir", type=Path, help="keep the built models here (default: a temporary folder)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    caches = [c for c in args.hf_caches.split(",") if c]
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            models = {args.model.name: args.model}
        else:
            names = [m for m in args.models.split(",") if m]
            models = bench.prepare_models(args.models_dir or Path(tmp), names)
        peak = bench.matmul_peak(args.threads, size=3072, repeats=5)
        header = f"{'model':6} {'conc':>4}  {'kiln tok/s':>10}"
        header += "".join(f"  {'hf-' + c + ' tok/s':>17}" for c in caches)
        header += f"  {'kiln ttft ms':>12}" + "".join(f"  {'hf-' + c + ' ttft':>16}" for c in caches)
        header += "".join(f"  {'kiln/hf-' + c:>15}" for c in caches)
        print(header + "\n" + "-" * len(header), flush=True)
        for name, model_dir in models.items():
            bench_model(name, model_dir, caches, args)
    print(
        f"torch threads {args.threads}, {args.tokens} new tokens per request, temperature 1, medians of "
        f"{args.repeats} alternating runs after a warm-up; fp32 matmul peak {peak / 1e9:.1f} GFLOP/s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
