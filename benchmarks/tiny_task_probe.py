"""What a tiny model does on its held-out sums: the figures in docs/tiny-model.md's "Measured" table.

    python benchmarks/tiny_task_probe.py [MODEL_DIR] [--prompts 200]

Through `gpu_runtime.sampler`, thinking off, greedy and at T = 0.9 (one seeded sample a prompt):
- sums ("What is A + B? Reply with just the number."): the stripped reply equals the sum;
- open sums ("What is A + B?", the demo task with headroom): the reply's last integer is the sum,
  as the guide's scorer (examples/grpo-math/score_math.py) checks it.
Operand pairs come from the tiny model's held-out split, so no pair was seen in the warm-up.
MODEL_DIR defaults to the shipped tiny model.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def last_integer(text: str) -> str | None:
    found = re.findall(r"-?\d+", text)
    return found[-1] if found else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=str(REPO / "gpu_runtime" / "assets" / "kiln-tiny"))
    parser.add_argument("--prompts", type=int, default=200)
    args = parser.parse_args(argv)

    from gpu_runtime.model_loading import load_model
    from gpu_runtime.sample_types import SampleRequest
    from gpu_runtime.sampler import Sampler
    from gpu_runtime.sampling import SamplingParams
    from gpu_runtime.tiny_tasks import held_out_arithmetic, held_out_open_arithmetic

    sampler = Sampler(load_model(args.model))
    tasks = {
        "sums": (held_out_arithmetic(args.prompts), lambda text, answer: text.strip() == answer),
        "open sums": (held_out_open_arithmetic(args.prompts), lambda text, answer: last_integer(text) == answer),
    }
    for name, (examples, correct) in tasks.items():
        shares = []
        for temperature in (0.0, 0.9):
            requests = [SampleRequest(messages=[{"role": "user", "content": ex.question}], seed=100 + i,
                                      enable_thinking=False, sampling=SamplingParams(temperature=temperature, max_tokens=24))
                        for i, ex in enumerate(examples)]
            results = sampler.generate(requests)
            shares.append(sum(correct(r.content, ex.answer) for r, ex in zip(results, examples, strict=True)) / len(examples))
        print(f"{name:10s} greedy {shares[0]:.3f}   T=0.9 {shares[1]:.3f}   ({len(examples)} held-out prompts)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
