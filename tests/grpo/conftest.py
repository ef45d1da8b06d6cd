"""Fixtures for the GRPO trainer tests: one tiny Qwen3 model per session (`one_thread` is in tests/conftest.py).

The model is built by `gpu_runtime.tiny_model.create_tiny_model` with a short warm-up (it
answers in the right format about a quarter of the time and almost never correctly), once per
test session, into a temporary directory.
"""

from __future__ import annotations

import pytest

TINY_WARM_STEPS = 30


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from gpu_runtime.tiny_model import create_tiny_model

    path = tmp_path_factory.mktemp("grpo-tiny") / "model"
    create_tiny_model(path, seed=0, warm_steps=TINY_WARM_STEPS, schema_steps=0)
    return path


