"""Held-out accuracy against training wall time and samples generated: Kiln and TRL on the demo task (issue 17).

The task is the demo's headroom task (`gpu_runtime.tiny_tasks`, "open arithmetic": "What is 47 + 13?"
with no format asked for; the shipped tiny model usually announces the sum instead of giving it).
The reward is the guide's scorer (examples/grpo-math/score_math.py): 1.0 when the last integer in
the reply is the sum. Both sides train the same shipped model, on the same TRAIN prompts, with the
same reward, LoRA shape (rank 16, alpha 32 on q, k, v, o: the trainer's defaults), number of
completions per prompt, sampling temperature (0.9), completion bound and learning rate (the demo's
[training.defaults]: AdamW 3e-5 unless --learning-rate says otherwise):

- Kiln: the guide's recorded-policy loop in one process: each round samples the current policy
  (gpu_runtime.sampler, the adapter of the previous round loaded) on `--prompts` fresh TRAIN
  prompts x `--group` completions, scores them, records each completion's provenance (its exact
  tokens and behavior log-probs, as `kiln rollout-generate` does) and trains the next adapter from
  the previous one with `train_grpo`, `behavior_policy: recorded` (one optimizer step per group
  with reward contrast, the trainer's default). `--behavior-policy no_importance_correction` trains
  on the re-tokenized text instead (with its `finish_reason`, so a truncated one gets no end token).
- TRL: `GRPOTrainer` in its own virtual environment (benchmarks/trl_env.sh, a fresh process,
  benchmarks/trl_learning_worker.py), `--prompts-per-step` prompts x `--group` completions a step.

After every Kiln round and every `--trl-eval-every` TRL steps, greedy held-out accuracy on
`--held-out` HELD-OUT operand pairs (never in warm-up nor in training) is measured with the clock
stopped. Printed per seed and side: the curve (wall seconds of training incl. generation, samples
generated, accuracy), then the accuracy each side reaches after 1, 2 and 5 minutes (the last
point measured at or before that time) and the time each first reaches the targets.

    .venv/bin/python benchmarks/learning.py [--seeds 1 2 3] [--budget-s 300] [--sides kiln trl]

Benchmarks never assert; docs/tiny-model.md ("Learning on the demo") records the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

NUMBER = re.compile(r"-?\d+")
# The trainer's default LoRA targets (gpu_runtime.grpo.train_types.DEFAULT_TARGET_MODULES): what the
# guide's request bodies train; TRL gets the same.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
TEMPERATURE, MAX_TOKENS = 0.9, 16
CHECKPOINTS_S = (60, 120, 300)


def last_integer_reward(content: str, answer: str) -> float:
    """The guide's scorer: 1.0 when the last integer in the reply is the answer."""
    numbers = NUMBER.findall(content)
    return 1.0 if numbers and numbers[-1] == answer else 0.0


def task_prompts(seed: int, count: int, held_out: int) -> tuple[list, list]:
    from gpu_runtime.tiny_tasks import draw_arithmetic, held_out_open_arithmetic, open_arithmetic_example

    rng = random.Random(seed)
    train = [open_arithmetic_example(*draw_arithmetic(rng, held_out=False)) for _ in range(count)]
    return train, held_out_open_arithmetic(held_out, seed=1000 + seed)


def kiln_curve(model_dir: Path, seed: int, args) -> list[dict]:
    """The recorded-policy loop in this process; one point per round (and the base)."""
    import torch

    from core.contracts.grpo_config import GrpoConfig
    from core.contracts.provenance import build_rollout_provenance
    from gpu_runtime.grpo.trainer import TrainRequest, train_grpo
    from gpu_runtime.model_loading import load_model
    from gpu_runtime.sample_types import SampleRequest
    from gpu_runtime.sampler import Sampler
    from gpu_runtime.sampling import SamplingParams

    torch.set_num_threads(args.threads)
    torch.manual_seed(seed)
    adapters: dict = {}
    loaded = load_model(model_dir, device="cpu")
    sampler = Sampler(loaded, adapters.get, max_batch_size=256)
    train, held_out = task_prompts(seed, args.prompts * args.max_rounds, args.held_out)

    def generate(examples, n, temperature, adapter, salt):
        requests = [SampleRequest(messages=[{"role": "user", "content": ex.question}],
                                  sampling=SamplingParams(temperature=temperature, max_tokens=MAX_TOKENS),
                                  adapter=adapter, seed=salt * 1_000_003 + i * 101 + j, enable_thinking=False)
                    for i, ex in enumerate(examples) for j in range(n)]
        results = sampler.generate(requests)
        return [results[i * n:(i + 1) * n] for i in range(len(examples))]

    def accuracy(adapter):
        outs = generate(held_out, 1, 0.0, adapter, 0)
        return sum(last_integer_reward(o[0].content, ex.answer) for ex, o in zip(held_out, outs, strict=True)) / len(held_out)

    points = [{"round": 0, "wall_s": 0.0, "samples": 0, "accuracy": accuracy(None)}]
    wall, samples, previous = 0.0, 0, None
    with tempfile.TemporaryDirectory() as tmp:
        for round_no in range(1, args.max_rounds + 1):
            if wall >= args.budget_s:
                break
            batch = train[(round_no - 1) * args.prompts:round_no * args.prompts]
            started = time.perf_counter()
            groups = []
            for ex, outs in zip(batch, generate(batch, args.group, TEMPERATURE, previous, seed * 100 + round_no),
                                strict=True):
                messages = [{"role": "user", "content": ex.question}]
                completions = []
                for o in outs:
                    completion = {"text": o.text, "reward": last_integer_reward(o.content, ex.answer),
                                  "finish_reason": o.finish_reason}
                    if args.behavior_policy == "recorded":  # the exact sampled tokens, as rollout-generate records them
                        completion["provenance"] = build_rollout_provenance(o, prompt_messages=messages, text=o.text)
                    completions.append(completion)
                groups.append({"messages": messages, "completions": completions})
            config = GrpoConfig.from_dict({"optimizer": {"kind": "adam_w"}, "learning_rate": args.learning_rate,
                                           "seed": seed, "lora_rank": 16, "lora_alpha": 32,
                                           "behavior_policy": args.behavior_policy,
                                           "reward_filter_on_empty": "skip"})
            name = f"round-{round_no}"
            result = train_grpo(TrainRequest(
                model_dir=model_dir, groups=groups, config=config, output_dir=Path(tmp) / name, adapter_name=name,
                base_adapter_dir=adapters.get(previous), base_adapter_name=previous,
                template_kwargs={"enable_thinking": False}, lora_target_modules=TARGET_MODULES,
                shared_base=loaded.shared_base,  # as in the GPU worker: the sampler's weights, no second copy
            ), on_progress=lambda _: None, should_stop=lambda: False)
            wall += time.perf_counter() - started
            samples += len(batch) * args.group
            adapters[name], previous = result.adapter_path, name
            points.append({"round": round_no, "wall_s": round(wall, 2), "samples": samples,
                           "accuracy": accuracy(name), "steps": result.final_step})
            print(f"  kiln seed {seed} round {round_no}: {points[-1]}", flush=True)
    return points


def trl_curve(model_dir: Path, seed: int, args) -> list[dict]:
    train, held_out = task_prompts(seed, args.prompts * args.max_rounds, args.held_out)
    cfg = {
        "model": str(model_dir), "seed": seed, "threads": args.threads, "group": args.group,
        "prompts_per_step": args.prompts_per_step, "learning_rate": args.learning_rate,
        "temperature": TEMPERATURE, "max_tokens": MAX_TOKENS, "budget_s": args.budget_s,
        "eval_every": args.trl_eval_every, "targets": list(TARGET_MODULES), "rank": 16, "alpha": 32,
        "train": [[ex.question, ex.answer] for ex in train],
        "held_out": [[ex.question, ex.answer] for ex in held_out],
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(cfg, handle)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run([str(args.trl_python), str(HERE / "trl_learning_worker.py"), handle.name],
                          capture_output=True, text=True, timeout=args.budget_s * 4 + 600, env=env, cwd="/")
    os.unlink(handle.name)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("TRL_CURVE ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"TRL run failed (rc {proc.returncode}): {proc.stderr[-3000:]}")
    points = json.loads(line.removeprefix("TRL_CURVE "))
    for point in points[1:]:
        print(f"  trl seed {seed} step {point['step']}: {point}", flush=True)
    return points


def at_time(points: list[dict], seconds: float) -> float:
    """The accuracy of the last point measured at or before `seconds` (what a user would have then)."""
    return [p for p in points if p["wall_s"] <= seconds][-1]["accuracy"]


def time_to(points: list[dict], accuracy: float) -> float | None:
    return next((p["wall_s"] for p in points if p["accuracy"] >= accuracy), None)


def report(curves: dict[str, dict[int, list[dict]]], targets: list[float]) -> None:
    print("\nheld-out greedy accuracy at a training wall time (mean over seeds; the last point measured by then)")
    print(f"{'side':<6} {'base':>6} " + " ".join(f"{f'@{s // 60} min':>8}" for s in CHECKPOINTS_S) + "   per seed @5 min")
    for side, by_seed in curves.items():
        base = sum(p[0]["accuracy"] for p in by_seed.values()) / len(by_seed)
        cells = [sum(at_time(p, s) for p in by_seed.values()) / len(by_seed) for s in CHECKPOINTS_S]
        per_seed = ", ".join(f"{at_time(p, CHECKPOINTS_S[-1]):.2f}" for p in by_seed.values())
        print(f"{side:<6} {base:6.3f} " + " ".join(f"{c:8.3f}" for c in cells) + f"   {per_seed}")
    print("\nwall seconds of training to first reach an accuracy (per seed; - = not within the budget)")
    for target in targets:
        row = []
        for side, by_seed in curves.items():
            times = [time_to(p, target) for p in by_seed.values()]
            row.append(f"{side} " + "/".join("-" if t is None else f"{t:.0f}" for t in times))
        print(f"  {target:.2f}: " + "   ".join(row))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--sides", nargs="+", default=["kiln", "trl"], choices=["kiln", "trl"])
    parser.add_argument("--budget-s", type=float, default=300.0, help="training wall seconds per side and seed")
    # 96 prompts x 8 = 768 samples a round: Kiln's accuracy is measured on the same grid as TRL's
    # (every 24 steps x 4 prompts x 8), so neither side is charged for a coarser measurement.
    parser.add_argument("--prompts", type=int, default=96, help="Kiln: TRAIN prompts per round")
    parser.add_argument("--max-rounds", type=int, default=100, help="Kiln: at most this many rounds (the budget stops first)")
    parser.add_argument("--prompts-per-step", type=int, default=4, help="TRL: prompts per optimizer step")
    parser.add_argument("--trl-eval-every", type=int, default=24, help="TRL: steps between held-out measurements")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--behavior-policy", default="recorded", choices=["recorded", "no_importance_correction"],
                        help="Kiln: recorded trains on the exact sampled tokens with their log-probs (the guide's "
                             "loop); no_importance_correction re-tokenizes the text (end token unless truncated)")
    parser.add_argument("--learning-rate", type=float, default=3e-5)
    parser.add_argument("--held-out", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--targets", type=float, nargs="+", default=[0.3, 0.5, 0.6, 0.7, 0.75])
    parser.add_argument("--model", type=Path, help="a model directory (default: the shipped tiny model)")
    parser.add_argument("--trl-python", type=Path,
                        default=Path(os.environ.get("KILN_TRL_VENV", "/tmp/kiln-trl-venv")) / "bin" / "python")
    args = parser.parse_args(argv)
    sides = list(args.sides)
    if "trl" in sides and not args.trl_python.exists():
        print(f"TRL not run: {args.trl_python} does not exist (run bash benchmarks/trl_env.sh)")
        sides.remove("trl")
    with tempfile.TemporaryDirectory() as tmp:
        if args.model:
            model_dir = args.model.resolve()
        else:
            from gpu_runtime.tiny_release import install

            model_dir = Path(tmp) / "kiln-tiny"
            install(model_dir)
        curves: dict[str, dict[int, list[dict]]] = {side: {} for side in sides}
        for seed in args.seeds:
            for side in (sides if seed % 2 else sides[::-1]):  # alternate who goes first
                run = kiln_curve if side == "kiln" else trl_curve
                curves[side][seed] = run(model_dir, seed, args)
    print(json.dumps({"curves": curves}, separators=(",", ":")))
    report(curves, args.targets)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
