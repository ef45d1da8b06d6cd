"""The tiny model the tests share: the shipped release, or one recipe build, kept between runs.

The default (seed 0, the documented step count) is the release `kiln model create-tiny` installs,
the same bytes on every machine, copied and verified in a second. Any other seed or step count is
built with the real recipe (minutes on 2 cores) into a cache keyed by the recipe's source code,
seed and step count (and the torch version). Tests of create-tiny itself (determinism) build small
ones of their own.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECIPE_SOURCES = ("gpu_runtime/tiny_model.py", "gpu_runtime/tiny_tasks.py", "gpu_runtime/tiny_openenv_tasks.py",
                  "gpu_runtime/tiny_schema_tasks.py", "gpu_runtime/tiny_value_tasks.py",
                  "core/contracts/openenv_prompt.py", "gpu_runtime/chat_template.py", "gpu_runtime/identity.py")


def cache_root() -> Path:
    return Path(os.environ.get("KILN_TEST_MODEL_CACHE", Path.home() / ".cache" / "kiln-test-models"))


def recipe_key(seed: int, warm_steps: int, schema_steps: int, value_steps: int) -> str:
    import torch

    digest = hashlib.sha256(f"{seed}:{warm_steps}:{schema_steps}:{value_steps}:{torch.__version__}".encode())
    for source in RECIPE_SOURCES:
        digest.update((REPO / source).read_bytes())
    return digest.hexdigest()[:16]


def cached_tiny_model(
    *, seed: int = 0, warm_steps: int | None = None, schema_steps: int | None = None, value_steps: int | None = None
) -> tuple[Path, dict]:
    """(path, recipe summary) of the release (the default) or of a recipe build, made at most once."""
    from gpu_runtime import tiny_release
    from gpu_runtime.tiny_model import (
        DEFAULT_SCHEMA_STEPS,
        DEFAULT_VALUE_STEPS,
        DEFAULT_WARM_STEPS,
        RECIPE_FILE,
        create_tiny_model,
    )

    steps = DEFAULT_WARM_STEPS if warm_steps is None else warm_steps
    second = DEFAULT_SCHEMA_STEPS if schema_steps is None else schema_steps
    third = (DEFAULT_VALUE_STEPS if second else 0) if value_steps is None else value_steps
    shipped = tiny_release.read_manifest()["recipe"]
    use_release = (seed, steps, second, third) == (shipped["seed"], shipped["warm_steps"], shipped.get("schema_steps", 0),
                                                   shipped.get("value_steps", 0))
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    if use_release:
        digest = tiny_release.read_manifest()["model_sha256"].removeprefix("sha256:")[:16]
        path = root / f"tiny-release-{digest}"
    else:
        path = root / f"tiny-seed{seed}-steps{steps}-{second}-{third}-{recipe_key(seed, steps, second, third)}"
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test process may be building the same model
        if not (path / RECIPE_FILE).is_file():
            if use_release:
                tiny_release.install(path)
            else:
                create_tiny_model(path, seed=seed, warm_steps=steps, schema_steps=second, value_steps=third)
    return path, json.loads((path / RECIPE_FILE).read_text())


if __name__ == "__main__":
    # scripts/test builds the shared model before pytest starts, outside any per-test time-out.
    built_path, recipe = cached_tiny_model()
    print(f"tiny model ready: {built_path} (held-out accuracy {recipe.get('held_out_accuracy')})")
