"""TRL's side of benchmarks/learning.py: GRPOTrainer on the demo task, in TRL's own virtual environment.

Runs with the TRL venv's python (benchmarks/trl_env.sh), never Kiln's: it imports only torch,
transformers, peft, datasets and trl. Argument: a JSON file (model, seed, threads, group,
prompts_per_step, learning_rate, temperature, max_tokens, budget_s, eval_every, targets, rank,
alpha, train [[question, answer]], held_out [[question, answer]]).

The workload matches Kiln's: the same model, TRAIN prompts in the same order, the guide's
last-integer reward, LoRA rank/alpha/targets, completions per prompt, temperature, completion bound,
AdamW at the same constant learning rate, KL 0.1 to the base, Dr. GRPO advantages (no std
scaling) and fp32 without gradient checkpointing (TRL "tuned" in benchmarks/grpo_scaling.py).
Greedy held-out accuracy is measured before training and every `eval_every` steps with the clock
stopped; training stops once `budget_s` seconds of training have passed. Prints one line
`TRL_CURVE [points]`.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
import time

import torch

cfg = json.load(open(sys.argv[1]))
torch.set_num_threads(cfg["threads"])
torch.manual_seed(cfg["seed"])

from datasets import Dataset  # noqa: E402
from peft import LoraConfig  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

NUMBER = re.compile(r"-?\d+")


def last_integer(text: str, answer: str) -> float:
    numbers = NUMBER.findall(text)
    return 1.0 if numbers and numbers[-1] == answer else 0.0


def reward(completions, answer, **kwargs):
    return [last_integer(c[0]["content"], a) for c, a in zip(completions, answer, strict=True)]


tokenizer = AutoTokenizer.from_pretrained(cfg["model"])


@torch.inference_mode()
def held_out_accuracy(model) -> float:
    was_training = model.training
    model.eval()
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                           enable_thinking=False, tokenize=False) for q, _ in cfg["held_out"]]
    tokenizer.padding_side = "left"
    correct = 0
    for start in range(0, len(texts), 64):
        batch = tokenizer(texts[start:start + 64], return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(**batch, max_new_tokens=cfg["max_tokens"], do_sample=False,
                             pad_token_id=tokenizer.pad_token_id)
        for row, (_, answer) in zip(out, cfg["held_out"][start:start + 64], strict=True):
            text = tokenizer.decode(row[batch["input_ids"].shape[1]:], skip_special_tokens=True)
            correct += last_integer(text, answer)
    if was_training:
        model.train()
    return correct / len(texts)


rows = [{"prompt": [{"role": "user", "content": q}], "answer": a} for q, a in cfg["train"]]
steps = len(rows) // cfg["prompts_per_step"]
with tempfile.TemporaryDirectory() as tmp:
    args = GRPOConfig(
        output_dir=tmp, per_device_train_batch_size=cfg["prompts_per_step"] * cfg["group"],
        num_generations=cfg["group"], max_completion_length=cfg["max_tokens"], temperature=cfg["temperature"],
        beta=0.1, learning_rate=cfg["learning_rate"], lr_scheduler_type="constant", warmup_steps=0,
        loss_type="dr_grpo", scale_rewards="none", max_steps=steps, report_to="none", use_cpu=True,
        bf16=False, gradient_checkpointing=False, save_strategy="no", shuffle_dataset=False, seed=cfg["seed"],
        logging_steps=10_000, chat_template_kwargs={"enable_thinking": False},
    )
    trainer = GRPOTrainer(
        model=cfg["model"], reward_funcs=reward, args=args, train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=cfg["rank"], lora_alpha=cfg["alpha"], target_modules=cfg["targets"],
                               lora_dropout=0.0, task_type="CAUSAL_LM"),
    )
    points = [{"step": 0, "wall_s": 0.0, "samples": 0, "accuracy": held_out_accuracy(trainer.model)}]

    class Clock(TrainerCallback):
        """Training wall time with the held-out measurements taken out; stops at the budget."""

        def __init__(self):
            self.wall, self.resumed = 0.0, None

        def on_step_begin(self, args, state, control, **kwargs):
            if self.resumed is None:
                self.resumed = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.wall += time.perf_counter() - self.resumed
            over = self.wall >= cfg["budget_s"]
            if state.global_step % cfg["eval_every"] == 0 or over:
                points.append({"step": state.global_step, "wall_s": round(self.wall, 2),
                               "samples": state.global_step * cfg["prompts_per_step"] * cfg["group"],
                               "accuracy": held_out_accuracy(trainer.model)})
            control.should_training_stop = over
            self.resumed = time.perf_counter()

    trainer.add_callback(Clock())
    trainer.train()
print("TRL_CURVE " + json.dumps(points), flush=True)
