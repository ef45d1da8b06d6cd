"""One GRPO round on the tiny model, Kiln against TRL: the `tiny:8:32` cell of grpo_scaling.py. Imports no Django.

Workload (both sides): LoRA rank 8 / alpha 16 on q_proj, k_proj, v_proj, o_proj; 2 prompts x 8
completions of exactly 32 new tokens; KL on (coefficient 0.1 against the base model); AdamW.
The measurement itself lives in `benchmarks/grpo_scaling.py` (which mends this benchmark's old
method: Kiln trains on the sampled token ids through its recorded provenance instead of
re-tokenized text with an added end token, TRL runs both tuned and with its defaults, every
phase is a median over rounds on both sides, and every measurement is a fresh process):

    bash benchmarks/trl_env.sh
    .venv/bin/python benchmarks/grpo_step.py [--repeats 3] [--rounds 3] [--threads 1]

`sample_round` and `scored_groups` (a round of completions with provenance) stay here for
benchmarks/device_check.py. This prints figures and never asserts speed.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROMPTS = ["What is 47 + 38? Reply with just the number.", "What is 91 - 15? Reply with just the number."]
GROUP_SIZE = 8
NEW_TOKENS = 32
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def digit_reward(text: str) -> float:
    """A cheap reward with within-group variance (the share of digits), so no group is filtered."""
    return sum(ch.isdigit() for ch in text) / max(1, len(text))


def sample_round(sampler, seed: int) -> tuple[list, float]:
    """The round's 16 completions (2 prompts x 8, exactly NEW_TOKENS each) and the ms it took."""
    from gpu_runtime.sample_types import SampleRequest
    from gpu_runtime.sampling import SamplingParams

    requests = [
        SampleRequest(
            messages=[{"role": "user", "content": prompt}],
            sampling=SamplingParams(temperature=1.0, max_tokens=NEW_TOKENS),
            seed=seed * 100 + p * GROUP_SIZE + i,
            enable_thinking=False,
            ignore_eos=True,
        )
        for p, prompt in enumerate(PROMPTS)
        for i in range(GROUP_SIZE)
    ]
    started = time.perf_counter()
    results = sampler.generate(requests)
    generation_ms = (time.perf_counter() - started) * 1000
    assert all(len(r.completion_token_ids) == NEW_TOKENS for r in results)
    return results, generation_ms


def scored_groups(results: list) -> list[dict]:
    """GRPO groups (one per prompt) of `sample_round`'s results, with rewards and provenance."""
    from core.contracts.provenance import build_rollout_provenance

    groups = []
    for p, prompt in enumerate(PROMPTS):
        messages = [{"role": "user", "content": prompt}]
        chunk = results[p * GROUP_SIZE : (p + 1) * GROUP_SIZE]
        completions = [
            {
                "text": r.text,
                "reward": digit_reward(r.text),
                "provenance": build_rollout_provenance(r, prompt_messages=messages),
            }
            for r in chunk
        ]
        groups.append({"messages": messages, "completions": completions})
    return groups


def build_tiny_model(parent: Path, warm_steps: int) -> Path:
    """The tiny model (default recipe, seed 0, `warm_steps` warm-up steps) under `parent`.

    Without the second (OpenEnv schema) phase: speed does not depend on it, and it takes minutes."""
    from gpu_runtime.tiny_model import create_tiny_model

    model_dir = Path(parent) / "tiny"
    print(f"building the tiny model ({warm_steps} warm-up steps)...", flush=True)
    create_tiny_model(model_dir, seed=0, warm_steps=warm_steps, schema_steps=0)
    return model_dir


def main(argv=None) -> int:
    sys.path.insert(0, str(REPO / "benchmarks"))
    import grpo_scaling

    return grpo_scaling.main(["--cells", f"tiny:{GROUP_SIZE}:{NEW_TOKENS}", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    raise SystemExit(main())
