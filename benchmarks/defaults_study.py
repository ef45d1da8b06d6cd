"""Why Muon at lr 2e-3 overshoots on the demo model, and which default does not (issue 17).

One GRPO round on the shipped tiny model, the way the guide runs it: sample the base model's own
answers to TRAIN arithmetic prompts (gpu_runtime.tiny_tasks), score them by exact match (1/0),
keep the groups with contrast, and train one LoRA adapter per configuration with `train_grpo` (one
optimizer step per group, the trainer's token_level default). For each configuration it prints:

- the learning rate the trainer used, and the LoRA scale alpha/rank;
- the update per optimizer step, two ways: the LoRA parameters' step relative to their own norm
  (||d theta|| / ||theta||, mean over steps), and the effective weight delta's step
  ||scale * (B'A' - BA)||_F relative to the base weights it adds to (||W0||_F, all targeted
  projections together; mean and max over steps);
- the whole round's delta ||scale * BA||_F / ||W0||_F;
- held-out accuracy (greedy, exact match) on `held_out_arithmetic` prompts, base and after;
- the mean reward of the next round's on-policy samples (fresh TRAIN prompts, temperature 0.9);
- training wall time.

    .venv/bin/python benchmarks/defaults_study.py [--seeds 1 2] [--train-prompts 48] [--group-size 8]

Speed is not the point here (benchmarks never assert); each configuration trains in seconds on
2 cores. The numbers in docs/tiny-model.md ("Training defaults for the demo") came from this script.
"""

from __future__ import annotations

import argparse
import math
import random
import re
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NUMBER = re.compile(r"-?\d+")

# name -> GrpoConfig overrides. The guide's bodies set none of these: rank 16, alpha 32, Muon, and
# the learning rate the trainer resolves (`GrpoConfig.resolved_learning_rate`: since issue 17, Muon
# 1e-4 x 2 / (alpha/rank); it was a flat 2e-3).
CONFIGS = {
    "muon 2e-3 (the old default)": {"learning_rate": 2e-3},
    "muon 1e-3": {"learning_rate": 1e-3},
    "muon 5e-4": {"learning_rate": 5e-4},
    "muon 2e-4": {"learning_rate": 2e-4},
    "muon default (rule): r16 a32": {},
    "adam_w 3e-5": {"optimizer": {"kind": "adam_w"}, "learning_rate": 3e-5},
    "adam_w default (rule): 1e-5": {"optimizer": {"kind": "adam_w"}},
    "muon 2e-3, r4 a8": {"lora_rank": 4, "lora_alpha": 8, "learning_rate": 2e-3},
    "muon 2e-3, r16 a16": {"lora_alpha": 16, "learning_rate": 2e-3},
    "muon default (rule): r16 a16": {"lora_alpha": 16},
}


def exact_match(content: str, answer: str) -> float:
    numbers = NUMBER.findall(content)
    return 1.0 if numbers and numbers[-1] == answer else 0.0


def sample(sampler, examples, n: int, *, seed: int, temperature: float, adapter: str | None = None):
    from gpu_runtime.sample_types import SampleRequest
    from gpu_runtime.sampling import SamplingParams

    requests = [
        SampleRequest(messages=[{"role": "user", "content": ex.question}],
                      sampling=SamplingParams(temperature=temperature, max_tokens=8), adapter=adapter,
                      seed=seed * 1_000_000 + i * 100 + j, enable_thinking=False)
        for i, ex in enumerate(examples) for j in range(n)
    ]
    results = sampler.generate(requests)
    return [results[i * n:(i + 1) * n] for i in range(len(examples))]


def held_out_accuracy(sampler, examples, adapter=None) -> float:
    groups = sample(sampler, examples, 1, seed=0, temperature=0.0, adapter=adapter)
    return sum(exact_match(rs[0].content, ex.answer) for ex, rs in zip(examples, groups, strict=True)) / len(examples)


def sampled_accuracy(sampler, examples, n: int = 4, adapter=None) -> float:
    """Held-out accuracy at the sampling temperature the rollouts use (0.9), n samples a prompt."""
    return mean_reward(sampler, examples, n, seed=10_007, adapter=adapter)


def mean_reward(sampler, examples, n: int, *, seed: int, adapter=None) -> float:
    groups = sample(sampler, examples, n, seed=seed, temperature=0.9, adapter=adapter)
    scores = [exact_match(r.content, ex.answer) for ex, rs in zip(examples, groups, strict=True) for r in rs]
    return sum(scores) / len(scores)


class UpdateMeter:
    """Wraps the trainer's optimizer: measures every step's LoRA and effective weight update."""

    def __init__(self, base_weights: dict):
        self.base = base_weights
        self.param_rel: list[float] = []
        self.delta_rel: list[float] = []
        self.final_rel = 0.0

    def _pairs(self, params):
        named = dict(params)
        for name in named:
            if ".lora_A." in name:
                b_name = name.replace(".lora_A.", ".lora_B.")
                module = name.removeprefix("base_model.model.").split(".lora_A.")[0]
                yield named[name], named[b_name], self.base[module + ".weight"]

    def wrap(self, build):
        import torch

        def build_measured(params, config):
            optimizer = build(params, config)
            step = optimizer.step
            pairs = list(self._pairs(params))
            scale = config.alpha_over_rank
            w0 = math.sqrt(sum(float(w.double().pow(2).sum()) for _, _, w in pairs))

            def measured_step(*args, **kwargs):
                with torch.no_grad():
                    before = [(a.detach().double().clone(), b.detach().double().clone()) for a, b, _ in pairs]
                    theta0 = math.sqrt(sum(float(p.detach().double().pow(2).sum()) for _, p in params))
                out = step(*args, **kwargs)
                with torch.no_grad():
                    dtheta = math.sqrt(sum(float((a.detach().double() - a0).pow(2).sum()
                                                 + (b.detach().double() - b0).pow(2).sum())
                                           for (a, b, _), (a0, b0) in zip(pairs, before, strict=True)))
                    ddelta = math.sqrt(sum(float((scale * (b.detach().double() @ a.detach().double() - b0 @ a0))
                                                 .pow(2).sum())
                                           for (a, b, _), (a0, b0) in zip(pairs, before, strict=True)))
                    total = math.sqrt(sum(float((scale * (b.detach().double() @ a.detach().double())).pow(2).sum())
                                          for a, b, _ in pairs))
                self.param_rel.append(dtheta / theta0)
                self.delta_rel.append(ddelta / w0)
                self.final_rel = total / w0
                return out

            optimizer.step = measured_step
            return optimizer

        return build_measured


def base_weights(model_dir: Path) -> dict:
    from safetensors.torch import load_file

    weights = {}
    for file in sorted(model_dir.glob("*.safetensors")):
        weights.update(load_file(str(file)))
    return weights


def train_one(model_dir, groups, out: Path, name: str, overrides: dict, seed: int, weights: dict):
    from core.contracts.grpo_config import GrpoConfig
    from gpu_runtime.grpo import trainer
    from gpu_runtime.grpo.trainer import TrainRequest, train_grpo

    config = GrpoConfig.from_dict({"behavior_policy": "no_importance_correction", "seed": seed, **overrides})
    meter = UpdateMeter(weights)
    original = trainer.build_optimizer
    trainer.build_optimizer = meter.wrap(original)
    try:
        started = time.perf_counter()
        result = train_grpo(TrainRequest(model_dir=model_dir, groups=groups, config=config, output_dir=out / name,
                                         adapter_name=name, template_kwargs={"enable_thinking": False}),
                            on_progress=lambda _: None, should_stop=lambda: False)
        wall = time.perf_counter() - started
    finally:
        trainer.build_optimizer = original
    return result, meter, wall, config


def run(args) -> list[dict]:
    import torch

    from gpu_runtime.model_loading import load_model
    from gpu_runtime.sampler import Sampler
    from gpu_runtime.tiny_tasks import arithmetic_example, draw_arithmetic, held_out_arithmetic
    from tests.support.tiny_cache import cached_tiny_model

    torch.set_num_threads(args.threads)
    model_dir = Path(args.model) if args.model else cached_tiny_model()[0]
    weights = base_weights(model_dir)
    adapters: dict = {}
    sampler = Sampler(load_model(model_dir, device="cpu"), adapters.get, max_batch_size=256)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            rng = random.Random(seed)
            held_out = held_out_arithmetic(args.held_out, seed=seed)
            train_ex = [arithmetic_example(*draw_arithmetic(rng, held_out=False)) for _ in range(args.train_prompts)]
            next_ex = [arithmetic_example(*draw_arithmetic(rng, held_out=False)) for _ in range(args.train_prompts)]
            groups = []
            for ex, rs in zip(train_ex, sample(sampler, train_ex, args.group_size, seed=seed, temperature=0.9),
                              strict=True):
                completions = [{"text": r.content, "reward": exact_match(r.content, ex.answer)} for r in rs]
                if len({c["reward"] for c in completions}) > 1:
                    groups.append({"messages": [{"role": "user", "content": ex.question}],
                                   "completions": completions})
            base_acc = held_out_accuracy(sampler, held_out)
            base_next = mean_reward(sampler, next_ex, args.next_samples, seed=seed + 7)
            rows.append({"seed": seed, "config": "base (no training)", "lr": None, "scale": None, "steps": 0,
                         "param_rel": None, "delta_rel": None, "delta_rel_max": None, "final_rel": 0.0,
                         "held_out": base_acc, "held_out_t09": sampled_accuracy(sampler, held_out), "next_reward": base_next, "wall": 0.0, "groups": len(groups)})
            for i, (label, overrides) in enumerate(CONFIGS.items()):
                if args.only and not any(o in label for o in args.only):
                    continue
                name = f"s{seed}-c{i}"
                result, meter, wall, config = train_one(model_dir, groups, Path(tmp), name, overrides, seed, weights)
                adapters[name] = result.adapter_path
                rows.append({
                    "seed": seed, "config": label, "lr": result.receipt["hyperparameters"]["learning_rate"],
                    "scale": config.alpha_over_rank, "steps": result.final_step,
                    "param_rel": sum(meter.param_rel) / len(meter.param_rel),
                    "delta_rel": sum(meter.delta_rel) / len(meter.delta_rel), "delta_rel_max": max(meter.delta_rel),
                    "final_rel": meter.final_rel, "held_out": held_out_accuracy(sampler, held_out, name),
                    "held_out_t09": sampled_accuracy(sampler, held_out, adapter=name),
                    "next_reward": mean_reward(sampler, next_ex, args.next_samples, seed=seed + 7, adapter=name),
                    "wall": wall, "groups": len(groups),
                })
                print_row(rows[-1], flush=True)
    return rows


HEADER = (f"{'seed':>4} {'config':<30} {'lr used':>9} {'a/r':>4} {'steps':>5} {'|dθ|/|θ|':>9} "
          f"{'|dW|/|W0| step':>14} {'max':>8} {'round |ΔW|/|W0|':>15} {'held-out':>8} {'@T0.9':>6} {'next rwd':>8} "
          f"{'wall s':>6}")


def _fmt(value, spec):
    return "-".rjust(int(spec.split(".")[0])) if value is None else format(value, spec)


def print_row(row: dict, flush: bool = False) -> None:
    print(f"{row['seed']:>4} {row['config']:<30} {_fmt(row['lr'], '9.2e')} {_fmt(row['scale'], '4.1f')} "
          f"{row['steps']:>5} {_fmt(row['param_rel'], '9.2e')} {_fmt(row['delta_rel'], '14.2e')} "
          f"{_fmt(row['delta_rel_max'], '8.2e')} {_fmt(row['final_rel'], '15.3f')} {row['held_out']:8.3f} "
          f"{row['held_out_t09']:6.3f} "
          f"{row['next_reward']:8.3f} {row['wall']:6.1f}", flush=flush)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--train-prompts", type=int, default=48)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--held-out", type=int, default=100)
    parser.add_argument("--next-samples", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", help="a model directory (default: the shipped tiny model)")
    parser.add_argument("--only", nargs="*", help="run only configurations whose label contains one of these")
    parser.add_argument("--extra", action="append", default=[],
                        help="LABEL=JSON: one more configuration (GrpoConfig overrides)")
    args = parser.parse_args(argv)
    import json

    for item in args.extra:
        label, _, body = item.partition("=")
        CONFIGS[label] = json.loads(body)
    print(HEADER, flush=True)
    rows = run(args)
    print("\nsummary (mean over seeds)")
    print(HEADER)
    for label in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == label]
        mean = {k: (sum(r[k] for r in mine) / len(mine) if mine[0][k] is not None else None)
                for k in ("param_rel", "delta_rel", "delta_rel_max", "final_rel", "held_out", "held_out_t09", "next_reward", "wall")}
        print_row({**mine[0], **mean, "seed": len(mine)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
