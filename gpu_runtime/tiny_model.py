"""Build Kiln's tiny deterministic Qwen3-architecture model (`kiln model create-tiny`). Imports no Django.

The recipe (documented in docs/tiny-model.md): train a byte-level BPE tokenizer on a built-in
corpus, initialise a small Qwen3ForCausalLM from the seed, warm it on CPU for a bounded number of
steps on synthetic arithmetic / JSON / chat tasks, measure held-out arithmetic accuracy at
temperature 0.9 (and, after the later phases, schema validity: `gpu_runtime/tiny_measure.py`), and
publish the directory atomically. The same seed and step count give
byte-identical files on the same torch build and CPU type: all randomness flows from the seed,
the warm-up runs with deterministic algorithms and a fixed thread count, and nothing
time-dependent is written.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    GenerationConfig,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from core.artifacts import publish_directory
from core.canonical import json_digest
from gpu_runtime.chat_template import CHAT_TEMPLATE, ENDOFTEXT, IM_END, MARKUP_TOKENS, SPECIAL_TOKENS
from gpu_runtime.identity import file_manifest, manifest_digest
from gpu_runtime.tiny_measure import encode_examples, letter_pieces, measure_accuracy, measure_schema_validity
from gpu_runtime.tiny_release import RECIPE_FILE
from gpu_runtime.tiny_schema_tasks import SecondPhaseSampler
from gpu_runtime.tiny_tasks import TaskSampler, tokenizer_corpus
from gpu_runtime.tiny_value_tasks import ThirdPhaseSampler, ValueEpisodes

RECIPE_SCHEMA = "kiln.tiny-model.v1"
DEFAULT_WARM_STEPS = 600
VOCAB_SIZE = 1024
MODEL_SHAPE = {
    "hidden_size": 96,
    "intermediate_size": 288,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 24,
}
BATCH_SIZE = 64
MICRO_BATCHES = 2  # length-sorted slices of each batch, run one after another
LEARNING_RATE = 3e-3
WARM_THREADS = 1  # fixed: GEMM reductions split differently with other counts, and one thread
# stays fast when other processes share the CPU (OpenMP threads that spin on a busy core do not)
THINKING_FRACTION = 0.25
SYSTEM_FRACTION = 0.3
# The second phase (OpenEnv actions under random schemas; gpu_runtime/tiny_schema_tasks.py) continues
# from the first with a fresh optimizer and its own stream (seed + 1), so the demo model acts in
# OpenEnv environments whose action fields it never saw (docs/tiny-model.md, recipe step 5).
DEFAULT_SCHEMA_STEPS = 1500
SCHEMA_LEARNING_RATE = 2e-3
SCHEMA_FRACTION = 0.65
SCHEMA_OPENENV_FRACTION = 0.20  # the first phase's counter and bandit episodes; the rest its whole mix
# The third phase (the values a schema allows: enum members, integer bounds; gpu_runtime/tiny_value_tasks.py)
# continues from the second the same way, on its own stream (seed + 2), so the demo model answers
# rock-paper-scissors with a listed move rather than a word of its own (docs/tiny-model.md, step 6).
DEFAULT_VALUE_STEPS = 1500
VALUE_LEARNING_RATE = 2e-3
# The recipe's last step (docs/tiny-model.md, "Sharpening"): the final norm's weight times LOGIT_SCALE
# scales every logit by it, so sampling at temperature T draws as the third phase's model did at
# T / LOGIT_SCALE. At 430k parameters that model spreads enough mass over wrong tokens at T = 1.0 (the
# OpenEnv collector's default) that unseen environments' actions break their schema in most groups;
# 1.25 is the largest scale measured that keeps the GRPO demo's groups contrasted (1.5 and 2.0 cost
# the open sums their contrast: fewer groups to learn from, an inconclusive second round at 2.0).
LOGIT_SCALE = 1.25
# Qwen2/Qwen3 pre-tokenizer: digits split one by one, words keep a leading space.
QWEN_SPLIT_PATTERN = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


def create_tiny_model(
    out_dir: Path,
    *,
    seed: int = 0,
    warm_steps: int = DEFAULT_WARM_STEPS,
    schema_steps: int = DEFAULT_SCHEMA_STEPS,
    value_steps: int | None = None,
    overwrite: bool = False,
) -> dict:
    """Build, warm (the first phase, `schema_steps` of the second, `value_steps` of the third, then the
    sharpening that follows a third phase), evaluate and publish into `out_dir`. The third phase
    continues from the second: `value_steps` defaults to the recipe's with a second phase and to 0
    without one.

    `out_dir` must not exist or be an empty directory, unless `overwrite` is set: then an existing
    directory is replaced only once the new model is complete. The summary has the recipe written
    to `kiln_tiny_model.json` plus `path`, `weights_sha256`, `warm_seconds` and `total_seconds`.
    """
    out_dir = Path(out_dir)
    check_target(out_dir, overwrite)
    if value_steps is None:
        value_steps = DEFAULT_VALUE_STEPS if schema_steps else 0
    if warm_steps < 0 or schema_steps < 0 or value_steps < 0:
        raise ValueError("warm_steps, schema_steps and value_steps must be >= 0")
    if value_steps and not schema_steps:
        raise ValueError("the third phase (value_steps) continues from the second: schema_steps must be > 0")
    started = time.perf_counter()
    with deterministic_cpu():
        corpus = tokenizer_corpus()
        tokenizer = build_tokenizer(corpus)
        torch.manual_seed(seed)
        model = build_model(tokenizer)
        warm_started = time.perf_counter()
        losses = warm_up(model, tokenizer, seed=seed, steps=warm_steps)
        schema_losses = run_second_phase(model, tokenizer, seed=seed, steps=schema_steps)
        value_losses = run_third_phase(model, tokenizer, seed=seed, steps=value_steps)
        if value_steps:
            sharpen(model)
        warm_seconds = time.perf_counter() - warm_started
        accuracy = measure_accuracy(model, tokenizer)
        schema_validity = measure_schema_validity(model, tokenizer) if schema_steps else None
        value_fields = third_phase_fields(value_steps, value_losses, model, tokenizer) if value_steps else {}
    recipe = {
        "schema": RECIPE_SCHEMA,
        "seed": seed,
        "warm_steps": warm_steps,
        "batch_size": BATCH_SIZE,
        "micro_batches": MICRO_BATCHES,
        "learning_rate": LEARNING_RATE,
        "thinking_fraction": THINKING_FRACTION,
        "system_fraction": SYSTEM_FRACTION,
        "threads": WARM_THREADS,
        "model_shape": dict(MODEL_SHAPE, vocab_size=len(tokenizer)),
        "corpus_sha256": json_digest(corpus),
        "final_loss": round(losses[-1], 6) if losses else None,
        "held_out_accuracy": accuracy,
        "torch_version": torch.__version__,
    }
    if schema_steps:  # absent when the second phase does not run, so such a build still matches the release
        recipe.update(second_phase_fields(schema_steps, schema_losses, schema_validity))
    recipe.update(value_fields)
    if value_steps:
        recipe["logit_scale"] = LOGIT_SCALE
    return finish(out_dir, model, tokenizer, recipe, overwrite=overwrite, started=started, warm_seconds=warm_seconds)


def run_second_phase(model, tokenizer, *, seed: int, steps: int, on_step=None) -> list[float]:
    """The second phase: a fresh optimizer on its own stream (seed + 1) of random-schema episodes."""
    tasks = SecondPhaseSampler(seed + 1, letter_pieces(tokenizer), SCHEMA_FRACTION, SCHEMA_OPENENV_FRACTION)
    return warm_up(model, tokenizer, seed=seed + 1, steps=steps, tasks=tasks, learning_rate=SCHEMA_LEARNING_RATE,
                   on_step=on_step)


def run_third_phase(model, tokenizer, *, seed: int, steps: int, on_step=None) -> list[float]:
    """The third phase: a fresh optimizer on its own stream (seed + 2) of episodes that practise enum
    members and integer bounds, in the second phase's mix."""
    tasks = ThirdPhaseSampler(seed + 2, letter_pieces(tokenizer), SCHEMA_FRACTION, SCHEMA_OPENENV_FRACTION)
    return warm_up(model, tokenizer, seed=seed + 2, steps=steps, tasks=tasks, learning_rate=VALUE_LEARNING_RATE,
                   on_step=on_step)


def sharpen(model, scale: float = LOGIT_SCALE) -> None:
    """Scale every logit by `scale`: the final norm's weight is the last factor before the (tied) head,
    so the embeddings the input reads stay as they were."""
    with torch.no_grad():
        model.model.norm.weight.mul_(scale)


def third_phase_fields(steps: int, losses: list[float], model, tokenizer) -> dict:
    """The recipe's third-phase fields, with its own measurement: held-out names and held-out enum members."""
    return {"value_steps": steps, "value_learning_rate": VALUE_LEARNING_RATE, "value_final_loss": round(losses[-1], 6),
            "held_out_value_validity": measure_schema_validity(model, tokenizer, episodes_type=ValueEpisodes)}


def second_phase_fields(steps: int, losses: list[float], validity: dict) -> dict:
    return {
        "schema_steps": steps,
        "schema_learning_rate": SCHEMA_LEARNING_RATE,
        "schema_fraction": SCHEMA_FRACTION,
        "schema_openenv_fraction": SCHEMA_OPENENV_FRACTION,
        "schema_final_loss": round(losses[-1], 6),
        "held_out_schema_validity": validity,
    }


def check_target(out_dir: Path, overwrite: bool) -> None:
    """Refuse an occupied target before minutes of training, not after."""
    occupied = out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir()))
    if occupied and not (overwrite and out_dir.is_dir()):
        raise FileExistsError(f"{out_dir} exists and is not an empty directory")


def finish(out_dir: Path, model, tokenizer, recipe: dict, *, overwrite: bool, started: float, warm_seconds: float) -> dict:
    _publish(out_dir, model, tokenizer, recipe, replace=overwrite)
    weights = file_manifest(out_dir, ["model.safetensors"])
    return dict(
        recipe,
        path=str(out_dir),
        weights_sha256=manifest_digest(weights),
        warm_seconds=round(warm_seconds, 3),
        total_seconds=round(time.perf_counter() - started, 3),
    )


def build_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    """Byte-level BPE with Qwen's split rule, Qwen3's special tokens and the Kiln chat template."""
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(MARKUP_TOKENS),
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKUP_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer: PreTrainedTokenizerFast) -> Qwen3ForCausalLM:
    """A randomly initialised Qwen3ForCausalLM (call torch.manual_seed first for reproducibility)."""
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        use_sliding_window=False,
        attention_dropout=0.0,
        **MODEL_SHAPE,
    )
    return Qwen3ForCausalLM(config).to(torch.float32)


def warm_up(
    model, tokenizer, *, seed: int, steps: int, tasks=None, learning_rate: float = LEARNING_RATE, on_step=None
) -> list[float]:
    """Supervised warm-up on the answer tokens only; returns the per-step losses.

    `tasks` is the example stream (`draw(thinking_fraction, system_fraction)`); the first phase's `TaskSampler(seed)` by
    default. `on_step(step, loss)` is called after every optimizer step (progress, probes)."""
    if steps == 0:
        return []
    tasks = tasks if tasks is not None else TaskSampler(seed)
    examples, flags = [], []
    for _ in range(steps * BATCH_SIZE):
        example, thinking, with_system = tasks.draw(THINKING_FRACTION, SYSTEM_FRACTION)
        examples.append(example)
        flags.append((thinking, with_system))
    encoded = encode_examples(tokenizer, examples, flags)
    pad_id = tokenizer.pad_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.98), weight_decay=0.0)
    warmup = max(1, steps // 20)

    def lr_scale(step: int) -> float:
        # Linear warm-up, then linear decay to 10%: short runs still end on a small step size.
        if step < warmup:
            return (step + 1) / warmup
        return max(0.1, 1.0 - 0.9 * (step - warmup) / max(1, steps - warmup))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_scale)
    model.train()
    losses = []
    for step in range(steps):
        batch = sorted(encoded[step * BATCH_SIZE : (step + 1) * BATCH_SIZE], key=lambda item: len(item[0]))
        answer_tokens = sum(len(ids) - n_prompt for ids, n_prompt in batch)
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        # Same batch, same objective (mean over all answer tokens), but run as a short half and a
        # long half: padding every row to the longest example wasted about a third of the compute.
        for part in _split(batch, MICRO_BATCHES):
            input_ids, attention, labels = _pad(part, pad_id)
            hidden = model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
            # Project only the positions that predict an answer token (a sixth of the compute).
            targets = labels[:, 1:]
            picked = hidden[:, :-1][targets != -100]
            token_losses = torch.nn.functional.cross_entropy(
                model.lm_head(picked), targets[targets != -100], reduction="sum"
            )
            (token_losses / answer_tokens).backward()
            total += float(token_losses.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(total / answer_tokens)
        if on_step is not None:
            on_step(step, losses[-1])
    model.eval()
    return losses


def _split(rows: list, parts: int) -> list[list]:
    size = -(-len(rows) // parts)
    return [rows[i : i + size] for i in range(0, len(rows), size)]


def _pad(rows: list[tuple[list[int], int]], pad_id: int):
    """Right-padded input ids, attention mask and labels (-100 outside the answer) for `rows`."""
    width = max(len(ids) for ids, _ in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for row, (ids, n_prompt) in enumerate(rows):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, n_prompt : len(ids)] = torch.tensor(ids[n_prompt:])
        attention[row, : len(ids)] = 1
    return input_ids, attention, labels


@contextmanager
def deterministic_cpu():
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(WARM_THREADS)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)


def _publish(out_dir: Path, model, tokenizer, recipe: dict, *, replace: bool) -> None:
    """Write everything into a hidden sibling, then publish it atomically: readers never see half a model."""

    def fill(staging: Path) -> None:
        model.generation_config = GenerationConfig(
            eos_token_id=[
                tokenizer.convert_tokens_to_ids(IM_END),
                tokenizer.convert_tokens_to_ids(ENDOFTEXT),
            ],
            pad_token_id=tokenizer.pad_token_id,
        )
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        (staging / RECIPE_FILE).write_text(json.dumps(recipe, indent=2, sort_keys=True) + "\n")
        for path in staging.iterdir():
            os.chmod(path, 0o644)  # safetensors writes 0600; a server running as another user must read it

    publish_directory(out_dir, fill, replace=replace)
