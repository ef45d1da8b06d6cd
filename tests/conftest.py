"""Shared fixtures. In-process tests use tests/settings.py; `stack` starts real processes."""

from __future__ import annotations

import os

# The Triton kernels' CPU check runs under the interpreter, which triton chooses when it is first
# imported (transformers imports it): this must come before any other import (tests/gpu_runtime/kernels).
os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from tests.support.stack import Stack  # noqa: E402


@pytest.fixture
def stack_factory(tmp_path):
    """Build stacks on demand (extra_env lets a test choose e.g. a serving profile or queue cap)."""
    stacks = []

    def make(**extra_env) -> Stack:
        stack = Stack(tmp_path / f"home{len(stacks)}", extra_env={k: str(v) for k, v in extra_env.items()})
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        print(stack.log_tail())  # shown by pytest only when the test failed
        stack.stop()


@pytest.fixture
def stack(stack_factory) -> Stack:
    return stack_factory()


@pytest.fixture(autouse=True)
def _fresh_cache():
    """The cache holds throttling counters (wrong API tokens per address): none leak between tests."""
    from django.core.cache import cache

    cache.clear()
    yield


@pytest.fixture
def canary_worker(monkeypatch):
    """The serving canary answered by a stand-in GPU worker (tests/support/canary.py)."""
    from adapters import canary
    from tests.support.canary import StandInWorker

    worker = StandInWorker()
    monkeypatch.setattr(canary, "_complete", worker)
    return worker


@pytest.fixture
def one_thread():
    """Tiny models run far faster on one thread than on two contended ones."""
    import torch  # here, not at import: most tests never load torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_model_dir():
    """A tiny model built by the real create-tiny recipe (cached across runs; see tests/support/tiny_cache.py)."""
    from tests.support.tiny_cache import cached_tiny_model

    return cached_tiny_model()[0]


# Property tests search the same examples on every run, so CI never meets a case a developer did not.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("kiln", derandomize=True, print_blob=True)
_hypothesis_settings.load_profile("kiln")
