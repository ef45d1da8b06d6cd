"""Time one GRPO round on the tiny model: Kiln's trainer, and TRL's GRPOTrainer when it is installed. Imports no Django.

Workload (both sides): LoRA rank 8 / alpha 16 on q_proj, k_proj, v_proj, o_proj; 2 prompts x 8
completions of exactly 32 new tokens; KL on (beta / kl_coeff 0.1 against the base model); AdamW.
Kiln generates with the project's batched sampler (gpu_runtime.sampler) and trains with
`train_grpo` (one optimizer step per group, so 2 steps a round); TRL generates with
`model.generate` and takes one optimizer step over the 16 completions. Figures are printed per
round (2 prompts x 8) and split into generation, reference forward, policy forward, backward and
optimizer. TRL runs in its own virtual environment (it is not a Kiln dependency):

    python3 -m venv /tmp/trl-venv && /tmp/trl-venv/bin/pip install torch==2.13.0 trl transformers peft
    python benchmarks/grpo_step.py --trl-python /tmp/trl-venv/bin/python

This prints figures and never asserts speed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
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


def kiln_round(sampler, seed: int) -> tuple[list[dict], float]:
    results, generation_ms = sample_round(sampler, seed)
    return scored_groups(results), generation_ms


def build_tiny_model(parent: Path, warm_steps: int) -> Path:
    """The tiny model (default recipe, seed 0, `warm_steps` warm-up steps) under `parent`."""
    from gpu_runtime.tiny_model import create_tiny_model

    model_dir = Path(parent) / "tiny"
    print(f"building the tiny model ({warm_steps} warm-up steps)...", flush=True)
    create_tiny_model(model_dir, seed=0, warm_steps=warm_steps)
    return model_dir


def run_kiln(model_dir: Path, rounds: int, device: str, behavior_policy: str) -> dict:
    import torch

    from core.contracts.grpo_config import GrpoConfig
    from gpu_runtime.grpo.trainer import TrainRequest, train_grpo
    from gpu_runtime.model_loading import load_model
    from gpu_runtime.sampler import Sampler

    loaded = load_model(model_dir, device=device)
    sampler = Sampler(loaded)
    kiln_round(sampler, seed=999)  # warm-up
    groups, generation = [], []
    for r in range(rounds):
        round_groups, ms = kiln_round(sampler, seed=r)
        groups += round_groups
        generation.append(ms)
    config = GrpoConfig.from_dict(
        {
            "optimizer": {"kind": "adam_w"},
            "learning_rate": 1e-5,
            "lora_rank": 8,
            "lora_alpha": 16,
            "kl_coeff": 0.1,
            "dynamic_sampling": False,
            "behavior_policy": behavior_policy,
            "seed": 0,
        }
    )
    with tempfile.TemporaryDirectory() as tmp:

        def train(name: str, data: list[dict]):
            request = TrainRequest(
                model_dir=model_dir,
                groups=data,
                config=config,
                output_dir=Path(tmp) / name,
                adapter_name=name,
                device=device,
                template_kwargs={"enable_thinking": False},
            )
            return train_grpo(request, on_progress=lambda p: None, should_stop=lambda: False)

        train("warmup", groups[:2])
        started = time.perf_counter()
        result = train("timed", groups)
        wall_ms = (time.perf_counter() - started) * 1000
    timings = result.receipt["phase_timings"]
    steps = result.final_step
    per_round = steps / rounds
    return {
        "rounds": rounds,
        "optimizer_steps_per_round": per_round,
        "generation_ms": statistics.median(generation),
        "reference_forward_ms": timings["reference_forward_ms"] / rounds,
        "policy_forward_ms": timings["policy_forward_ms"] / rounds,
        "backward_ms": timings["backward_ms"] / rounds,
        "optimizer_ms": timings["optimizer_ms"] / rounds,
        "train_wall_ms_incl_setup": wall_ms / rounds,
        "reference_path": result.receipt["runtime"]["execution_provenance"]["reference_path"],
        "forward_path": result.receipt["runtime"]["execution_provenance"]["forward_path"],
        "fallbacks": result.receipt["fallbacks"],
        "behavior_policy": behavior_policy,
        "threads": torch.get_num_threads(),
        "device": device,
    }


TRL_SCRIPT = r"""
import json, sys, time
from collections import defaultdict
import torch
cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
import trl, trl.extras.profiling as profiling
from trl import GRPOConfig, GRPOTrainer

times = defaultdict(float)
profiling.ProfilingContext._log_metrics = lambda self, d: times.__setitem__("profile:" + self.name, times["profile:" + self.name] + d)
tok = AutoTokenizer.from_pretrained(cfg["model"])
model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
rows = [{"prompt": [{"role": "user", "content": q}]} for q in cfg["prompts"]] * (cfg["rounds"] + 1)
def reward(completions, **kwargs):
    texts = [c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]
args = GRPOConfig(
    output_dir=cfg["out"], per_device_train_batch_size=len(cfg["prompts"]) * cfg["group"], num_generations=cfg["group"],
    max_completion_length=cfg["new_tokens"], generation_kwargs={"min_new_tokens": cfg["new_tokens"]},
    beta=0.1, learning_rate=1e-5, max_steps=cfg["rounds"] + 1, logging_steps=1, report_to="none", use_cpu=True,
    bf16=False, temperature=1.0, gradient_accumulation_steps=1, save_strategy="no", shuffle_dataset=False,
    seed=0, disable_dropout=True, chat_template_kwargs={"enable_thinking": False}, optim="adamw_torch",
)
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
                      processing_class=tok,
                      peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=cfg["targets"], lora_dropout=0.0,
                                             task_type="CAUSAL_LM"))
state = {"step": 0}
def timed(key, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        out = fn(*a, **k)
        if state["step"] > 0:  # the first step is a warm-up
            name = key if not callable(key) else key()
            times[name] += time.perf_counter() - t
        return out
    return wrapper
trainer._get_per_token_logps_and_entropies = timed(
    lambda: "policy_forward" if torch.is_grad_enabled() else "reference_forward",
    trainer._get_per_token_logps_and_entropies)
trainer.accelerator.backward = timed("backward", trainer.accelerator.backward)
class Clock(TrainerCallback):
    def on_step_begin(self, args, s, c, **k): self.t = time.perf_counter()
    def on_pre_optimizer_step(self, args, s, c, **k): self.o = time.perf_counter()
    def on_optimizer_step(self, args, s, c, **k):
        if state["step"] > 0: times["optimizer"] += time.perf_counter() - self.o
    def on_step_end(self, args, s, c, **k):
        if state["step"] > 0: times["step"] += time.perf_counter() - self.t
        state["step"] += 1
trainer.add_callback(Clock())
warm = {}
def snapshot_profile():
    for k, v in times.items():
        if k.startswith("profile:"): warm[k] = v
class Warm(TrainerCallback):
    def on_step_end(self, args, s, c, **k):
        if state["step"] == 1: snapshot_profile()
trainer.add_callback(Warm())
trainer.train()
out = {k: v - warm.get(k, 0.0) for k, v in times.items()}
print("TRL_RESULT " + json.dumps({"times": out, "trl": trl.__version__, "torch": torch.__version__,
                                 "threads": torch.get_num_threads()}))
"""


def run_trl(python: str, model_dir: Path, rounds: int, threads: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = {
            "model": str(model_dir),
            "prompts": PROMPTS,
            "group": GROUP_SIZE,
            "new_tokens": NEW_TOKENS,
            "rounds": rounds,
            "threads": threads,
            "targets": TARGETS,
            "out": tmp,
        }
        proc = subprocess.run(
            [python, "-c", TRL_SCRIPT, json.dumps(cfg)], capture_output=True, text=True, timeout=timeout
        )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("TRL_RESULT ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"TRL run failed (rc {proc.returncode}): {proc.stderr[-2000:]}")
    data = json.loads(line.removeprefix("TRL_RESULT "))
    t = data["times"]
    ms = {k: v * 1000 / rounds for k, v in t.items()}
    return {
        "rounds": rounds,
        "optimizer_steps_per_round": 1,
        "generation_ms": sum(v for k, v in ms.items() if k.endswith("transformers.generate")),
        "reference_forward_ms": ms.get("reference_forward", 0.0),
        "policy_forward_ms": ms.get("policy_forward", 0.0),
        "backward_ms": ms.get("backward", 0.0),
        "optimizer_ms": ms.get("optimizer", 0.0),
        "step_ms": ms.get("step", 0.0),
        "trl": data["trl"],
        "torch": data["torch"],
        "threads": data["threads"],
    }


PHASES = ["generation_ms", "reference_forward_ms", "policy_forward_ms", "backward_ms", "optimizer_ms"]
GOAL_RATIO = 0.5  # the goal: Kiln at most half of TRL's time for each phase on CPU


def median_row(runs: list[dict]) -> dict:
    """Per-phase medians over repeated runs (the machine is shared: single runs are noisy)."""
    row = dict(runs[0])
    for key in PHASES + ["train_wall_ms_incl_setup", "step_ms"]:
        values = [r[key] for r in runs if key in r]
        if values:
            row[key] = statistics.median(values)
    row["repeats"] = len(runs)
    return row


def print_table(rows: dict[str, dict]) -> None:
    names = list(rows)
    ratio = "trl" in rows
    header = f"{'per round (2 prompts x 8 x 32 tokens)':40}" + "".join(f"{n:>16}" for n in names)
    print(header + (f"{'kiln/trl':>12}" if ratio else ""))
    for key in PHASES + ["train_ms"]:
        values = {
            n: sum(rows[n].get(k, 0.0) for k in PHASES[1:]) if key == "train_ms" else rows[n].get(key)
            for n in names
        }
        line = f"{key:40}" + "".join(f"{values[n]:>16.1f}" for n in names)
        if ratio and values["trl"]:
            line += f"{values['kiln'] / values['trl']:>12.2f}"
        print(line)
    print(
        f"{'optimizer steps per round':40}"
        + "".join(f"{rows[n]['optimizer_steps_per_round']:>16}" for n in names)
    )
    for n in names:
        steps = rows[n]["optimizer_steps_per_round"]
        per_step = {k: rows[n][k] / steps for k in PHASES[1:]}
        print(
            f"{n} per optimizer step ({steps:g} a round): "
            + ", ".join(f"{k.removesuffix('_ms')} {v:.1f}" for k, v in per_step.items())
            + f" ms; train {sum(per_step.values()):.1f} ms"
        )
    if ratio:
        worst = max(rows["kiln"][k] / rows["trl"][k] for k in PHASES if rows["trl"][k])
        verdict = "met" if worst <= GOAL_RATIO else "not met"
        print(f"goal (every phase kiln/trl <= {GOAL_RATIO}): {verdict}; worst phase ratio {worst:.2f}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, help="a local HF model dir (default: build a tiny model)")
    parser.add_argument(
        "--warm-steps", type=int, default=30, help="warm-up steps when building the tiny model"
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per side; medians are printed")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (both sides)")
    parser.add_argument("--trl-python", default="/tmp/trl-venv/bin/python")
    parser.add_argument("--trl-timeout", type=float, default=900)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model_dir
        if model_dir is None:
            model_dir = build_tiny_model(Path(tmp), args.warm_steps)
            torch.set_num_threads(args.threads)
        trl_note = None
        if not Path(args.trl_python).exists():
            trl_note = (
                f"TRL not run: {args.trl_python} does not exist (create the venv as the docstring shows)"
            )
        runs: dict[str, list[dict]] = {"kiln": [], "kiln-recorded": [], "trl": []}
        for repeat in range(args.repeats):  # alternate the sides so load changes hit both alike
            print(f"run {repeat + 1}/{args.repeats}...", flush=True)
            runs["kiln"].append(run_kiln(model_dir, args.rounds, args.device, "no_importance_correction"))
            runs["kiln-recorded"].append(run_kiln(model_dir, args.rounds, args.device, "recorded"))
            if trl_note is None:
                try:
                    runs["trl"].append(
                        run_trl(args.trl_python, model_dir, args.rounds, args.threads, args.trl_timeout)
                    )
                except (RuntimeError, subprocess.TimeoutExpired) as exc:
                    trl_note = f"TRL not run: {exc}"
        rows = {name: median_row(values) for name, values in runs.items() if values}
    print_table(rows)
    kiln = rows["kiln"]
    print(
        f"\nkiln forward path: {kiln['forward_path']} | reference path: {kiln['reference_path']} "
        f"| fallbacks: {kiln['fallbacks']}"
    )
    print(
        f"device {args.device}, torch threads {args.threads}, rounds timed {args.rounds} (after a warm-up), "
        f"medians of {args.repeats} alternating runs per side"
    )
    print("kiln-recorded also replays the recorded behavior log-probs once at setup (not in these phases).")
    if "trl" in rows:
        print(
            f"TRL {rows['trl']['trl']} (torch {rows['trl']['torch']}): one optimizer step per round; "
            f"whole step {rows['trl']['step_ms']:.1f} ms (includes reward scoring and bookkeeping)."
        )
        print("TRL's reference forward is its no-grad log-prob pass (adapter disabled, beta 0.1).")
    if trl_note:
        print(trl_note)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "runs": runs, "trl_note": trl_note}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
