"""A request's random stream is its seed mixed with its prompt (gpu_runtime.sequence.stream_seed):
the same seed and prompt replay the same draws, the same seed on another prompt draws others. The
guide gives every task seeds 42, 43, ...: seeded by the seed alone, completion j of every task
shared its uniforms (docs/tiny-model.md, "Learning on the demo")."""

from __future__ import annotations

import torch

from gpu_runtime.sequence import stream_seed


def _uniforms(seed: int, prompt: list[int], n: int = 8) -> list[float]:
    return torch.rand(n, generator=torch.Generator().manual_seed(stream_seed(seed, prompt)),
                      dtype=torch.float64).tolist()


def test_the_same_seed_and_prompt_replay_the_same_stream():
    assert stream_seed(42, [1, 2, 3]) == stream_seed(42, [1, 2, 3])
    assert _uniforms(42, [1, 2, 3]) == _uniforms(42, [1, 2, 3])
    assert 0 <= stream_seed(2**64 - 1, [151_643]) < 2**64


def test_another_prompt_or_seed_gets_its_own_stream():
    prompts = [[7, 8, 9 + i] for i in range(50)]
    firsts = [_uniforms(42, p)[0] for p in prompts]
    assert len(set(firsts)) == len(prompts)  # not one shared first draw across tasks
    assert sum(u < 0.5 for u in firsts) not in (0, len(prompts))
    assert _uniforms(42, [1, 2, 3]) != _uniforms(43, [1, 2, 3])
    assert stream_seed(42, [1, 23]) != stream_seed(42, [12, 3])  # token boundaries count
