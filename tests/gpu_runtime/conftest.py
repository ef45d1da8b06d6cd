"""Shared fixtures for the gpu_runtime tests: the warmed tiny model (real recipe, built once and cached)."""

from __future__ import annotations

import pytest
import torch

from gpu_runtime.model_loading import load_model
from gpu_runtime.sampler import Sampler
from tests.support.tiny_cache import cached_tiny_model


@pytest.fixture(scope="session")
def tiny_model():
    """(path, recipe) of the tiny model built by the default create-tiny recipe (seed 0).

    Shared with the rest of the suite through tests.support.tiny_cache; never write into it.
    """
    return cached_tiny_model()


@pytest.fixture(scope="session")
def loaded(tiny_model):
    return load_model(tiny_model[0])


@pytest.fixture(scope="session")
def sampler(loaded):
    return Sampler(loaded)


@pytest.fixture
def full_forward(loaded):
    """Logits [len, vocab] of one uncached forward pass over `ids` (the reference for log-probs)."""

    @torch.inference_mode()
    def run(ids: list[int]) -> torch.Tensor:
        return loaded.model(input_ids=torch.tensor([ids], device=loaded.device)).logits[0].float()

    return run
