"""The tiny model recipe's measurements, and the tokenisation they share with its warm-up. Imports no Django.

`measure_accuracy` (held-out sums at T = 0.9) and `measure_schema_validity` (OpenEnv actions under
schemas with held-out field names at the collector's T = 1.0) are what the recipe file records; both
sample with the plain Hugging Face forward under a seeded generator, deliberately apart from
`gpu_runtime.sampler`, so the recorded figures do not depend on the code they are later used to test.
`encode_examples` renders (prompt, answer) pairs exactly as the sampler sees them, for the warm-up's
batches and for these prompts alike.
"""

from __future__ import annotations

import json
import random
import re

import jsonschema
import torch
from transformers import DynamicCache

from gpu_runtime.chat_template import IM_END
from gpu_runtime.tiny_schema_tasks import SchemaEpisodes
from gpu_runtime.tiny_tasks import SYSTEM_PROMPT, Example, held_out_arithmetic

SCHEMA_PROBES = 64  # held-out-key schemas in the recorded validity measurement
SCHEMA_TEMPERATURE = 1.0  # the OpenEnv collector's default
EVAL_PROMPTS = 200
EVAL_TEMPERATURE = 0.9
EVAL_SEED = 7


def encode_examples(
    tokenizer, examples: list[Example], flags: list[tuple[bool, bool]]
) -> list[tuple[list[int], int]]:
    """Tokenise (prompt, answer) pairs exactly as the sampler sees them: prompt ids, then answer ids.

    `flags` holds (thinking, with_system) per example. Single-turn prompts are rendered through the
    chat template once per flag combination with a placeholder question, which is exact because the
    template copies message content verbatim; an example with its own `messages` is rendered whole.
    """
    placeholder = "\x00QUESTION\x00"
    frames = {}
    for thinking in (False, True):
        for with_system in (False, True):
            messages = [{"role": "system", "content": SYSTEM_PROMPT}] if with_system else []
            messages.append({"role": "user", "content": placeholder})
            frames[thinking, with_system] = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, enable_thinking=thinking, tokenize=False
            )
    prompts, answers = [], []
    for ex, (thinking, with_system) in zip(examples, flags, strict=True):
        if ex.messages is not None:  # a whole conversation (OpenEnv): rendered as the collector sends it
            prompts.append(tokenizer.apply_chat_template(
                list(ex.messages), add_generation_prompt=True, enable_thinking=thinking, tokenize=False))
        else:
            prompts.append(frames[thinking, with_system].replace(placeholder, ex.question))
        answer = f"{ex.reasoning}\n</think>\n\n{ex.answer}" if thinking else ex.answer
        answers.append(answer + IM_END)
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(answers, add_special_tokens=False)["input_ids"]
    return [(p + a, len(p)) for p, a in zip(prompt_ids, answer_ids, strict=True)]


@torch.inference_mode()
def measure_accuracy(
    model,
    tokenizer,
    *,
    count: int = EVAL_PROMPTS,
    temperature: float = EVAL_TEMPERATURE,
    seed: int = EVAL_SEED,
) -> dict:
    """Sample one answer per held-out arithmetic prompt (thinking off) and count exact matches.

    Deliberately independent of gpu_runtime.sampler: the plain Hugging Face forward and
    torch.multinomial under a seeded generator, so the recorded figure does not depend on the
    code it is later used to test.
    """
    model.eval()
    examples = held_out_arithmetic(count)
    encoded = encode_examples(tokenizer, examples, [(False, False)] * count)
    outputs, done = _sample_plain(model, tokenizer, [ids[:n] for ids, n in encoded],
                                  temperature=temperature, seed=seed, max_new_tokens=8)
    correct = sum(
        1
        for ex, out, finished in zip(examples, outputs, done.tolist(), strict=True)
        if finished and tokenizer.decode(out, skip_special_tokens=True).strip() == ex.answer
    )
    return {
        "prompts": count,
        "correct": correct,
        "accuracy": round(correct / count, 4),
        "temperature": temperature,
        "sampling_seed": seed,
        "thinking": False,
    }


@torch.inference_mode()
def measure_schema_validity(
    model, tokenizer, *, count: int = SCHEMA_PROBES, temperature: float = SCHEMA_TEMPERATURE, seed: int = EVAL_SEED,
    episodes_type=SchemaEpisodes,
) -> dict:
    """The share of OpenEnv actions that pass their schema, on schemas whose field names the warm-up
    never trained (held out by hash): one sample per schema, thinking off, Kiln's system prompt.
    `episodes_type` draws the schemas: the second phase's (any field) or the third's (enums and bounded
    integers, whose enum members the third phase held out too)."""
    model.eval()
    episodes = episodes_type(random.Random(seed), letter_pieces(tokenizer))
    schemas, examples = [], []
    for _ in range(count):
        schema, required, action = episodes.schema(held_out=True)
        messages, answer, reasoning = episodes.conversation(schema, required, action)
        schemas.append(schema)
        examples.append(Example("openenv", messages[-1]["content"], answer, reasoning, tuple(messages)))
    encoded = encode_examples(tokenizer, examples, [(False, False)] * count)
    outputs, done = _sample_plain(model, tokenizer, [ids[:n] for ids, n in encoded],
                                  temperature=temperature, seed=seed, max_new_tokens=48)
    valid = sum(
        1
        for schema, out, finished in zip(schemas, outputs, done.tolist(), strict=True)
        if finished and _is_valid_action(tokenizer.decode(out, skip_special_tokens=True), schema)
    )
    return {"schemas": count, "valid": valid, "validity": round(valid / count, 4), "temperature": temperature,
            "sampling_seed": seed, "thinking": False}


def _is_valid_action(text: str, schema: dict) -> bool:
    try:
        action = json.loads(text.strip())
    except ValueError:
        return False
    return isinstance(action, dict) and jsonschema.Draft202012Validator(schema).is_valid(action)


def letter_pieces(tokenizer) -> list[str]:
    """The tokenizer's letter-only entries: the pieces the second phase builds made-up keys from."""
    return sorted(piece for piece in tokenizer.get_vocab() if re.fullmatch(r"[a-z]+", piece))


def _sample_plain(model, tokenizer, prompts: list[list[int]], *, temperature: float, seed: int, max_new_tokens: int):
    """Left-padded batch sampling with the plain Hugging Face forward (and its KV cache) and a seeded
    generator, deliberately independent of gpu_runtime.sampler. Returns (token ids per row, finished mask)."""
    count = len(prompts)
    eos = tokenizer.convert_tokens_to_ids(IM_END)
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    seqs = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    generator = torch.Generator().manual_seed(seed)
    done = torch.zeros(count, dtype=torch.bool)
    outputs: list[list[int]] = [[] for _ in range(count)]
    cache, step_ids = DynamicCache(config=model.config), seqs
    for _ in range(max_new_tokens):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, -step_ids.shape[1]:]
        logits = model(input_ids=step_ids, attention_mask=mask, position_ids=positions, cache=cache,
                       use_cache=True, logits_to_keep=1).logits[:, -1].float()
        probs = torch.softmax(logits / temperature, dim=-1)
        nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        for row in range(count):
            if not done[row]:
                if int(nxt[row]) == eos:
                    done[row] = True
                else:
                    outputs[row].append(int(nxt[row]))
        step_ids = nxt[:, None]
        mask = torch.cat([mask, torch.ones(count, 1, dtype=mask.dtype)], dim=1)
        if bool(done.all()):
            break
    return outputs, done
