"""Run one later step of the tiny model's recipe (a warm-up phase, or the sharpening after the third)
from a model that finished the steps before it.

Why: the first phase's floating point differs between CPUs (docs/tiny-model.md), so rebuilding it on
another machine gives another model than the release whose behaviour the tests were tuned on.
Starting a later phase from the files of the model before it keeps that model byte for byte; the
recipe file keeps its summary and adds the new phase's fields and the digest it started from. The
release was cut this way: each phase from the release before it. Imports no Django.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen3ForCausalLM

from gpu_runtime.chat_template import CHAT_TEMPLATE
from gpu_runtime.identity import file_manifest, manifest_digest
from gpu_runtime.tiny_measure import measure_accuracy, measure_schema_validity
from gpu_runtime.tiny_model import (
    LOGIT_SCALE,
    check_target,
    deterministic_cpu,
    finish,
    run_second_phase,
    run_third_phase,
    second_phase_fields,
    sharpen,
    third_phase_fields,
)
from gpu_runtime.tiny_release import RECIPE_FILE
from gpu_runtime.tiny_value_tasks import ValueEpisodes


def continue_with_second_phase(
    first_phase_dir: Path, out_dir: Path, *, schema_steps: int, overwrite: bool = False, on_step=None
) -> dict:
    """Run only the second phase (actions under any schema) from a model the first phase built."""
    if schema_steps <= 0:
        raise ValueError("schema_steps must be > 0")
    base_recipe = _base_recipe(first_phase_dir)
    if "schema_steps" in base_recipe:
        raise ValueError(f"{first_phase_dir} already ran a second phase")

    def run(model, tokenizer) -> dict:
        losses = run_second_phase(model, tokenizer, seed=base_recipe["seed"], steps=schema_steps, on_step=on_step)
        return second_phase_fields(schema_steps, losses, measure_schema_validity(model, tokenizer))

    return _continue(first_phase_dir, out_dir, base_recipe, run, overwrite=overwrite,
                     extra={"first_phase_final_loss": base_recipe["final_loss"]}, origin="first_phase_model_sha256")


def continue_with_third_phase(
    second_phase_dir: Path, out_dir: Path, *, value_steps: int, overwrite: bool = False, on_step=None
) -> dict:
    """Run only the third phase (enum members, integer bounds) from a model that ran the second."""
    if value_steps <= 0:
        raise ValueError("value_steps must be > 0")
    base_recipe = _base_recipe(second_phase_dir)
    if "schema_steps" not in base_recipe:
        raise ValueError(f"{second_phase_dir} has not run the second phase; the third continues from it")
    if "value_steps" in base_recipe:
        raise ValueError(f"{second_phase_dir} already ran a third phase")

    def run(model, tokenizer) -> dict:
        losses = run_third_phase(model, tokenizer, seed=base_recipe["seed"], steps=value_steps, on_step=on_step)
        return dict(third_phase_fields(value_steps, losses, model, tokenizer),
                    held_out_schema_validity=measure_schema_validity(model, tokenizer),
                    second_phase_schema_validity=base_recipe["held_out_schema_validity"])

    return _continue(second_phase_dir, out_dir, base_recipe, run, overwrite=overwrite, extra={},
                     origin="second_phase_model_sha256")


def continue_with_sharpening(third_phase_dir: Path, out_dir: Path, *, overwrite: bool = False) -> dict:
    """Run only the recipe's last step (`tiny_model.sharpen`) on a model that ran the third phase, and
    measure again what the recipe records."""
    base_recipe = _base_recipe(third_phase_dir)
    if "value_steps" not in base_recipe:
        raise ValueError(f"{third_phase_dir} has not run the third phase; sharpening follows it")
    if "logit_scale" in base_recipe:
        raise ValueError(f"{third_phase_dir} is sharpened already (logit_scale {base_recipe['logit_scale']})")

    def run(model, tokenizer) -> dict:
        sharpen(model)
        return {"logit_scale": LOGIT_SCALE,
                "held_out_schema_validity": measure_schema_validity(model, tokenizer),
                "held_out_value_validity": measure_schema_validity(model, tokenizer, episodes_type=ValueEpisodes),
                "third_phase_held_out_accuracy": base_recipe["held_out_accuracy"]}

    return _continue(third_phase_dir, out_dir, base_recipe, run, overwrite=overwrite, extra={},
                     origin="third_phase_model_sha256")


def _base_recipe(model_dir: Path) -> dict:
    return json.loads((Path(model_dir) / RECIPE_FILE).read_text())


def _continue(source: Path, out_dir: Path, base_recipe: dict, run, *, overwrite: bool, extra: dict,
              origin: str) -> dict:
    source, out_dir = Path(source), Path(out_dir)
    check_target(out_dir, overwrite)
    started = time.perf_counter()
    with deterministic_cpu():
        tokenizer = PreTrainedTokenizerFast.from_pretrained(source)
        for loading_flag in ("is_local", "local_files_only"):  # how it was loaded, not what it is:
            tokenizer.init_kwargs.pop(loading_flag, None)  # kept, they would change tokenizer_config.json
        if tokenizer.chat_template != CHAT_TEMPLATE:
            raise ValueError(f"{source} has another chat template than this Kiln's")
        model = Qwen3ForCausalLM.from_pretrained(source, dtype=torch.float32)
        warm_started = time.perf_counter()
        fields = run(model, tokenizer)
        warm_seconds = time.perf_counter() - warm_started
        accuracy = measure_accuracy(model, tokenizer)
    recipe = dict(base_recipe, **extra, held_out_accuracy=accuracy,
                  **{origin: manifest_digest(file_manifest(source, ["model.safetensors"]))})
    recipe.update(fields)
    return finish(out_dir, model, tokenizer, recipe, overwrite=overwrite, started=started, warm_seconds=warm_seconds)
