"""Fused sampling (Triton, interpreted) against `gpu_runtime.sampling`: the same distribution, the
same draw for the same uniform number, and rows that do not depend on their batch.

Vocabulary 301 with a 128-wide block (three blocks, the last partial). Rows cover every control
alone and together, greedy, ties at the maximum and at the top-k boundary, -inf logits, a top_p
below float32's range (keeps the top token) and forced tokens. Tokens must be equal; log-probs
agree to 1e-5 (the two sum the softmax in different orders).
"""

from __future__ import annotations

import math

import pytest
import torch

from gpu_runtime.kernels import sampling as fused
from gpu_runtime.sampling import SamplingParams, behavior_logprobs, draw_tokens

V = 301
PARAMS = [
    SamplingParams(),
    SamplingParams(temperature=0.7, top_k=5),
    SamplingParams(top_p=0.8),
    SamplingParams(temperature=1.3, min_p=0.1),
    SamplingParams(temperature=0),
    SamplingParams(top_k=20, top_p=0.9, min_p=0.05),
    SamplingParams(top_p=1e-200),
    SamplingParams(top_k=3, temperature=0.5),
]


# Cheaper rows (no bisection) where the test is about the draw or the stream, not the filters.
DRAW_PARAMS = [SamplingParams(), SamplingParams(temperature=0.7, min_p=0.1), SamplingParams(top_k=4)]


@pytest.fixture
def small_blocks(monkeypatch):
    monkeypatch.setattr(fused, "MAX_BLOCK", 128)  # three blocks per row, the last partial


def logits_for(rows: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, V, generator=g) * 3
    logits[1 % rows, :60] = -math.inf  # filtered-out words
    logits[5 % rows, 7] = logits[5 % rows].max()  # a tie at the maximum
    top = logits[7 % rows].topk(3).values
    logits[7 % rows, 250] = top[2]  # a tie at the top-k boundary: vocabulary order decides
    return logits


def torch_path(logits, params, uniforms, forced):
    logprobs = behavior_logprobs(logits, params)
    tokens = draw_tokens(logprobs, uniforms)
    tokens = torch.tensor([t if f is None else f for t, f in zip(tokens.tolist(), forced, strict=True)])
    return tokens, logprobs.gather(1, tokens[:, None]).squeeze(1)


@pytest.mark.parametrize("seed", [0, 1])
def test_tokens_and_logprobs_match_the_torch_path(seed, small_blocks):
    logits = logits_for(len(PARAMS), seed)
    uniforms = torch.rand(len(PARAMS), dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    forced = [None] * len(PARAMS)
    forced[2 + seed] = 60 + seed  # a forced token reports its log-prob (possibly -inf)
    got = fused.sample(logits, PARAMS, uniforms=uniforms, forced=forced)
    want = torch_path(logits, PARAMS, uniforms, forced)
    assert got[0].tolist() == want[0].tolist()
    torch.testing.assert_close(got[1], want[1], atol=1e-5, rtol=0)
    assert got[1][6] == 0.0  # top_p 1e-200: greedy within the filter


def test_extreme_uniforms_stay_inside_the_distribution():
    logits = logits_for(len(DRAW_PARAMS), 2)
    for u in (0.0, 1.0 - 2**-53):
        uniforms = torch.full((len(DRAW_PARAMS),), u, dtype=torch.float64)
        got = fused.sample(logits, DRAW_PARAMS, uniforms=uniforms)
        want = torch_path(logits, DRAW_PARAMS, uniforms, [None] * len(DRAW_PARAMS))
        assert got[0].tolist() == want[0].tolist()
        assert torch.isfinite(got[1]).all()


def test_philox_stream_is_keyed_by_seed_and_position_not_by_the_batch():
    params = DRAW_PARAMS * 2
    logits = logits_for(len(params), 3)
    seeds = [11, 12, 2**64 - 1, 14, 15, 11]
    positions = [0, 3, 9, 1, 4, 1]
    batch = fused.sample(logits, params, seeds=seeds, positions=positions)
    # Each row alone, and the rows in reverse order, give the same tokens and log-probs.
    for row in (0, 2, 5):
        alone = fused.sample(logits[row : row + 1], params[row : row + 1], seeds=seeds[row : row + 1],
                             positions=positions[row : row + 1])
        assert alone[0].item() == batch[0][row].item() and alone[1].item() == batch[1][row].item()
    flipped = fused.sample(logits.flip(0), params[::-1], seeds=seeds[::-1], positions=positions[::-1])
    assert flipped[0].flip(0).tolist() == batch[0].tolist()
    # The stream's numbers, fed to the torch path, give the same draw.
    uniforms = fused.philox_uniforms(seeds, positions)
    assert ((uniforms >= 0) & (uniforms < 1)).all() and len(set(uniforms.tolist())) == len(seeds)
    assert torch_path(logits, params, uniforms, [None] * len(params))[0].tolist() == batch[0].tolist()
    # Another position is another number.
    moved = fused.philox_uniforms(seeds, [p + 1 for p in positions])
    assert (moved != uniforms).all()
