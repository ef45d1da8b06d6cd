"""The batching sampler with its sampling step on the Triton kernel (interpreted) on the tiny model.

Each request's uniforms come from its own generator on both paths, so the same seeds must give
the same tokens as the torch path, alone or in a mixed batch (batch invariance); the behaviour
log-probs agree to 1e-5.
"""

from __future__ import annotations

import pytest

from gpu_runtime.sample_types import SampleRequest
from gpu_runtime.sampler import Sampler
from gpu_runtime.sampling import SamplingParams


def ask(content, *, seed, **sampling):
    sampling.setdefault("max_tokens", 6)
    return SampleRequest(
        messages=[{"role": "user", "content": content}],
        enable_thinking=False,
        seed=seed,
        sampling=SamplingParams(**sampling),
        ignore_eos=True,
    )


REQUESTS = [
    ask("What is 47 + 13? Reply with just the number.", seed=1234),
    ask("Hello!", seed=1, top_k=5, temperature=0.7),
    ask("Tell me a fact.", seed=2, top_p=0.9, min_p=0.05),
    ask("What is 3 + 4?", seed=3, temperature=0, max_tokens=3),
]


def test_the_kernel_sampler_matches_the_torch_sampler_alone_and_batched(loaded, monkeypatch):
    monkeypatch.setenv("KILN_KERNELS", "torch")
    plain = Sampler(loaded).generate(REQUESTS)
    monkeypatch.setenv("KILN_KERNELS", "triton")
    sampler = Sampler(loaded)
    assert sampler.kernels.triton
    batched = sampler.generate(REQUESTS)
    alone = sampler.generate([REQUESTS[0]])[0]
    for got, want in zip(batched, plain, strict=True):
        assert got.completion_token_ids == want.completion_token_ids
        assert got.token_logprobs == pytest.approx(want.token_logprobs, abs=1e-5)
    assert alone.completion_token_ids == batched[0].completion_token_ids
    # On the CPU the forward is batch-invariant bit for bit (packed matmuls, attention per row), and
    # the kernel computes each row's log-probs on its own: alone or batched, the same bits.
    assert alone.token_logprobs == batched[0].token_logprobs
