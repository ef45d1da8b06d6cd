"""Benchmark: Kiln's batched sampler vs Hugging Face `generate` on the tiny model (tokens/second).

Both sides decode the same prompts for the same number of new tokens (end-of-turn ignored) with
plain temperature-1 sampling, at batch 1 and batch 8. The Kiln side also builds a
kiln.rollout-provenance.v1 record for every completion inside the timed region. Run:

    python benchmarks/sampler.py [--model DIR] [--tokens 64] [--repeats 3]

Without --model it builds the tiny model (default recipe, seed 0) into a temporary directory.
Prints one line per batch size and the ratio kiln/hf (> 1 means Kiln is faster). The two sides
alternate run by run, so a busy machine slows both alike; the medians are reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from core.contracts.provenance import build_rollout_provenance  # noqa: E402
from gpu_runtime.model_loading import load_model  # noqa: E402
from gpu_runtime.sample_types import SampleRequest  # noqa: E402
from gpu_runtime.sampler import Sampler  # noqa: E402
from gpu_runtime.sampling import SamplingParams  # noqa: E402
from gpu_runtime.tiny_release import install as install_tiny_model  # noqa: E402

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


def kiln_run(sampler: Sampler, messages: list[list[dict]], tokens: int) -> tuple[float, int]:
    requests = [
        SampleRequest(
            messages=m,
            enable_thinking=False,
            seed=i,
            ignore_eos=True,
            sampling=SamplingParams(temperature=1.0, max_tokens=tokens),
        )
        for i, m in enumerate(messages)
    ]
    start = time.perf_counter()
    results = sampler.generate(requests)
    for m, r in zip(messages, results, strict=True):
        build_rollout_provenance(r, prompt_messages=m)
    elapsed = time.perf_counter() - start
    return elapsed, sum(len(r.completion_token_ids) for r in results)


def hf_run(loaded, messages: list[list[dict]], tokens: int) -> tuple[float, int]:
    tok = loaded.tokenizer
    prompts = [loaded.render_prompt(m, enable_thinking=False)[1] for m in messages]
    width = max(len(p) for p in prompts)
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=loaded.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=loaded.device)
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
        )
    elapsed = time.perf_counter() - start
    return elapsed, (out.shape[1] - width) * len(prompts)


def measure(fns: dict, repeats: int) -> dict:
    """Median tokens/second of each function, run alternately so both see the same machine load."""
    rates = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            elapsed, produced = fn()
            rates[name].append(produced / elapsed)
    return {name: statistics.median(values) for name, values in rates.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="model directory (default: build the tiny model)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            model_dir = Path(tmp) / "tiny"
            install_tiny_model(model_dir)  # the shipped demo model, the same on every machine
        loaded = load_model(model_dir)
        sampler = Sampler(loaded)
        print(
            f"model {loaded.served_model_id} on {loaded.device} ({loaded.dtype}), torch threads "
            f"{torch.get_num_threads()}, {args.tokens} new tokens per sequence, median of {args.repeats}"
        )
        print(f"{'batch':>5}  {'hf generate tok/s':>18}  {'kiln sampler tok/s':>19}  {'kiln/hf':>7}")
        for batch in args.batches:
            messages = [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}] for i in range(batch)]
            kiln_run(sampler, messages, 4)  # warm both paths once
            hf_run(loaded, messages, 4)
            rates = measure(
                {
                    "hf": lambda messages=messages: hf_run(loaded, messages, args.tokens),
                    "kiln": lambda messages=messages: kiln_run(sampler, messages, args.tokens),
                },
                args.repeats,
            )
            hf, kiln = rates["hf"], rates["kiln"]
            print(f"{batch:>5}  {hf:>18.1f}  {kiln:>19.1f}  {kiln / hf:>7.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
