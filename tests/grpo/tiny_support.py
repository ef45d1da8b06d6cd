"""Helpers for the GRPO trainer tests: a seeded batched sampler for the tiny model and its rewards.

Deliberately independent of the trainer (and of gpu_runtime.sampler): plain full-sequence
forwards with left padding and torch.multinomial under one seeded generator, so what the tests
measure does not depend on the code under test.
"""

from __future__ import annotations

import re

import torch

NUMBER = re.compile(r"-?\d+")


def arithmetic_answer(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def arithmetic_prompt(a: int, op: str, b: int) -> str:
    return f"What is {a} {op} {b}? Reply with just the number."


def arithmetic_tasks(count: int, *, offset: int = 0) -> list[tuple[str, str]]:
    """(question, answer) pairs, deterministic."""
    out = []
    for i in range(offset, offset + count):
        a, b = (i * 37) % 90 + 5, (i * 53) % 40 + 2
        op = "+" if i % 2 == 0 else "-"
        out.append((arithmetic_prompt(a, op, b), str(arithmetic_answer(a, op, b))))
    return out


def exact_match_reward(text: str, finished: bool, answer: str) -> float:
    """1.0 for exactly the answer; 0.5 for exactly a bare integer (the requested format); else 0.
    An unfinished completion (no end-of-turn) scores 0."""
    if not finished:
        return 0.0
    if text == answer:
        return 1.0
    return 0.5 if NUMBER.fullmatch(text) else 0.0


@torch.no_grad()
def sample(
    model,
    tokenizer,
    prompts: list[str],
    n: int,
    *,
    seed: int,
    max_new_tokens: int = 6,
    temperature: float = 1.0,
    thinking: bool = False,
) -> list[list[tuple[str, bool]]]:
    """n completions per prompt: [(text, finished)] per prompt. Same seed, same samples."""
    generator = torch.Generator().manual_seed(seed)
    rows = [p for p in prompts for _ in range(n)]
    ids = []
    for prompt in rows:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            enable_thinking=thinking,
            tokenize=False,
        )
        ids.append(tokenizer.encode(text, add_special_tokens=False))
    width, pad = max(map(len, ids)), tokenizer.pad_token_id
    seq = torch.tensor([[pad] * (width - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    device = next(model.parameters()).device
    seq, mask = seq.to(device), mask.to(device)
    outs: list[list[int]] = [[] for _ in rows]
    done = [False] * len(rows)
    for _ in range(max_new_tokens):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=seq, attention_mask=mask, position_ids=positions).logits[:, -1].float()
        nxt = torch.multinomial(
            torch.softmax(logits / temperature, -1).cpu(), 1, generator=generator
        ).squeeze(1)
        for r, token in enumerate(nxt.tolist()):
            if not done[r]:
                if token == tokenizer.eos_token_id:
                    done[r] = True
                else:
                    outs[r].append(token)
        seq = torch.cat([seq, nxt[:, None].to(device)], 1)
        mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=mask.dtype, device=device)], 1)
        if all(done):
            break
    flat = [(tokenizer.decode(o, skip_special_tokens=True), d) for o, d in zip(outs, done, strict=True)]
    return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]


def scored_groups(model, tokenizer, tasks, n: int, *, seed: int, max_new_tokens: int = 6) -> list[dict]:
    """GRPO groups (spec §2.1) of the model's own samples, scored by exact_match_reward."""
    samples = sample(model, tokenizer, [q for q, _ in tasks], n, seed=seed, max_new_tokens=max_new_tokens)
    groups = []
    for (question, answer), completions in zip(tasks, samples, strict=True):
        groups.append(
            {
                "messages": [{"role": "user", "content": question}],
                "completions": [
                    {"text": t, "reward": exact_match_reward(t, d, answer)} for t, d in completions
                ],
            }
        )
    return groups


def mean_reward(model, tokenizer, tasks, n: int, *, seed: int) -> float:
    samples = sample(model, tokenizer, [q for q, _ in tasks], n, seed=seed)
    scores = [
        exact_match_reward(t, d, a) for (_, a), comps in zip(tasks, samples, strict=True) for t, d in comps
    ]
    return sum(scores) / len(scores)


def fixed_groups(count: int = 4) -> list[dict]:
    """Hand-made scored groups (no sampling): arithmetic prompts with varied-reward completions."""
    groups = []
    for question, answer in arithmetic_tasks(count):
        texts = [answer, str(int(answer) + 1), "the answer", answer + " is it"]
        groups.append(
            {
                "messages": [{"role": "user", "content": question}],
                "completions": [{"text": t, "reward": exact_match_reward(t, True, answer)} for t in texts],
            }
        )
    return groups


def train_request(model_dir, groups, out, name="adapter", *, request_kwargs=None, **config):
    """A TrainRequest with small, fast defaults (AdamW, rank 4, thinking off)."""
    from core.contracts.grpo_config import GrpoConfig
    from gpu_runtime.grpo.trainer import TrainRequest

    merged = {
        "optimizer": {"kind": "adam_w"},
        "learning_rate": 1e-3,
        "lora_rank": 4,
        "lora_alpha": 8,
        "seed": 7,
    }
    merged.update(config)
    return TrainRequest(
        model_dir=model_dir,
        groups=groups,
        config=GrpoConfig.from_dict(merged),
        output_dir=out / name,
        adapter_name=name,
        checkpoint_root=out,
        template_kwargs={"enable_thinking": False},
        **(request_kwargs or {}),
    )


def run(request, *, stop_after: int | None = None, progress: list | None = None, gpu_writer=None):
    """train_grpo with a progress recorder and an optional stop after `stop_after` groups."""
    from gpu_runtime.grpo.trainer import train_grpo

    seen = progress if progress is not None else []
    return train_grpo(
        request,
        on_progress=seen.append,
        # Count group reports only (a checkpoint, a failed checkpoint and a resume report too).
        should_stop=lambda: stop_after is not None
        and sum(1 for figures in seen if "groups_done" in figures) >= stop_after,
        gpu_writer=gpu_writer,
    )


def completion_logprobs(model, tokenizer, groups) -> tuple[float, float]:
    """Mean per-token log-prob of the rewarded (reward > 0) and unrewarded completions, teacher-forced
    exactly as the trainer encodes them (prompt + text + end-of-turn)."""
    rewarded, unrewarded = [], []
    for group in groups:
        prompt = tokenizer.apply_chat_template(
            group["messages"], add_generation_prompt=True, enable_thinking=False, tokenize=False
        )
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        for completion in group["completions"]:
            ids = (
                prompt_ids
                + tokenizer.encode(completion["text"], add_special_tokens=False)
                + [tokenizer.eos_token_id]
            )
            tensor = torch.tensor([ids])
            with torch.no_grad():
                logp = torch.log_softmax(model(input_ids=tensor).logits[0, :-1].float(), -1)
            positions = torch.arange(len(prompt_ids) - 1, len(ids) - 1)
            value = logp[positions, tensor[0, len(prompt_ids) :]].mean().item()
            (rewarded if completion["reward"] > 0 else unrewarded).append(value)
    return sum(rewarded) / len(rewarded), sum(unrewarded) / len(unrewarded)
