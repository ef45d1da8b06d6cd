"""One TRL measurement for benchmarks/grpo_scaling.py: a fresh process in TRL's own virtual environment.

Runs with the TRL venv's python (benchmarks/trl_env.sh), never Kiln's: it imports only torch,
transformers, peft, datasets and trl. Argument: one JSON object (model, prompts, group,
new_tokens, rounds, threads, targets, mode, warmup_tokens, out). `mode` is
- "default": TRL's GRPOConfig defaults for precision and memory (bf16 autocast, gradient
  checkpointing on), and
- "tuned": fp32 and no gradient checkpointing, the peer Kiln is measured against.
Everything else is the same workload as Kiln's: LoRA r 8 / alpha 16 on q, k, v, o, beta 0.1 (KL
against the base model, adapter disabled), temperature 1, exactly `new_tokens` sampled tokens per
completion (min_new_tokens; the mask confirms it), one optimizer step per round of
len(prompts) x group completions. A short warm-up trainer (same batch, `warmup_tokens` tokens)
runs first in the same process. Prints one line `TRL_RESULT {json}` with per-round phase times.
"""

from __future__ import annotations

import json
import resource
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from anon_memory import AnonPeak  # noqa: E402 (standard library only)

ANON = AnonPeak()  # first: both sides count from their start

import torch  # noqa: E402

cfg = json.loads(sys.argv[1])
torch.set_num_threads(cfg["threads"])


def matmul_peak(size: int = 2048, repeats: int = 4) -> float:
    """As bench_support.matmul_peak: the best of `repeats` fp32 matmuls, in FLOP/s."""
    a, b, c = torch.randn(size, size), torch.randn(size, size), torch.empty(size, size)
    torch.matmul(a, b, out=c)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        torch.matmul(a, b, out=c)
        best = min(best, time.perf_counter() - started)
    return 2.0 * size**3 / best


PEAK = matmul_peak()  # this process's own peak, under today's load

import trl  # noqa: E402
import trl.extras.profiling as profiling  # noqa: E402
from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

state = {"timing": False, "current": defaultdict(float), "rounds": [], "calls": defaultdict(int)}


def _log(self, duration):
    if state["timing"] and self.name.endswith("transformers.generate"):
        state["current"]["generation_ms"] += duration * 1000


profiling.ProfilingContext._log_metrics = _log


def reward(completions, **kwargs):
    texts = [c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def make_trainer(new_tokens: int, steps: int, out: str) -> GRPOTrainer:
    rows = [{"prompt": [{"role": "user", "content": q}]} for q in cfg["prompts"]] * steps
    knobs = {} if cfg["mode"] == "default" else {"bf16": False, "gradient_checkpointing": False}
    args = GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=len(cfg["prompts"]) * cfg["group"],
        num_generations=cfg["group"],
        max_completion_length=new_tokens,
        generation_kwargs={"min_new_tokens": new_tokens},
        beta=0.1,
        learning_rate=1e-5,
        max_steps=steps,
        report_to="none",
        use_cpu=True,
        temperature=1.0,
        gradient_accumulation_steps=1,
        save_strategy="no",
        shuffle_dataset=False,
        seed=0,
        chat_template_kwargs={"enable_thinking": False},
        **knobs,
    )
    return GRPOTrainer(
        model=cfg["model"],  # TRL loads it (fp32 unless model_init_kwargs says otherwise)
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_list(rows),
        peft_config=LoraConfig(
            r=8, lora_alpha=16, target_modules=cfg["targets"], lora_dropout=0.0, task_type="CAUSAL_LM"
        ),
    )


def instrument(trainer: GRPOTrainer) -> None:
    def timed(fn, key_of):
        def wrapper(*a, **k):
            started = time.perf_counter()
            out = fn(*a, **k)
            if state["timing"]:
                key = key_of()
                state["current"][key] += (time.perf_counter() - started) * 1000
                state["calls"][key] += 1
            return out

        return wrapper

    trainer._get_per_token_logps_and_entropies = timed(
        trainer._get_per_token_logps_and_entropies,
        lambda: "policy_forward_ms" if torch.is_grad_enabled() else "reference_forward_ms",
    )
    trainer.accelerator.backward = timed(trainer.accelerator.backward, lambda: "backward_ms")
    compute_loss = trainer._compute_loss

    def recording_loss(model, inputs):
        if state["timing"]:
            cur = state["current"]
            cur["trained_tokens"] = int(inputs["completion_mask"].sum())
            cur["sequences"] = int(inputs["prompt_ids"].shape[0])
            cur["padded_prompt"] = int(inputs["prompt_ids"].shape[1])
            cur["completion_width"] = int(inputs["completion_ids"].shape[1])
            cur["prompt_tokens"] = int(inputs["prompt_mask"].sum())
        return compute_loss(model, inputs)

    trainer._compute_loss = recording_loss

    class Clock(TrainerCallback):
        def on_step_begin(self, args, s, c, **k):
            state["current"] = defaultdict(float)
            self.step_started = time.perf_counter()

        def on_pre_optimizer_step(self, args, s, c, **k):
            self.opt_started = time.perf_counter()

        def on_optimizer_step(self, args, s, c, **k):
            state["current"]["optimizer_ms"] += (time.perf_counter() - self.opt_started) * 1000

        def on_step_end(self, args, s, c, **k):
            if state["timing"]:
                state["current"]["step_ms"] = (time.perf_counter() - self.step_started) * 1000
                state["rounds"].append(dict(state["current"]))

    trainer.add_callback(Clock())


with tempfile.TemporaryDirectory() as tmp:
    warm = make_trainer(cfg["warmup_tokens"], 1, tmp + "/warm")
    instrument(warm)
    warm.train()
    del warm
    trainer = make_trainer(cfg["new_tokens"], cfg["rounds"], tmp + "/timed")
    instrument(trainer)
    state["timing"] = True
    trainer.train()
print(
    "TRL_RESULT "
    + json.dumps(
        {
            "rounds": state["rounds"],
            "calls": dict(state["calls"]),
            "peak_flops": PEAK,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "peak_anon_mib": ANON.stop(),
            "trl": trl.__version__,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "mode": cfg["mode"],
        }
    ),
    flush=True,
)
