"""token_logprobs, and shared-prefix reference log-probs equal per-completion full forwards."""

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from gpu_runtime.grpo.reference import (
    common_prefix_length,
    full_reference_logprobs,
    shared_prefix_reference_logprobs,
    token_logprobs,
)

SEQUENCES = [
    [5, 6, 7, 8, 9, 10, 11],
    [5, 6, 7, 8, 12],
    [5, 6, 7, 8, 13, 14, 15, 16, 17],
    [5, 6, 7, 8],  # nothing after the prompt
]


@pytest.fixture(scope="module")
def tiny_qwen3():
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    return Qwen3ForCausalLM(config).eval()


def test_token_logprobs_matches_log_softmax():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 6)
    ids = torch.tensor([[1, 2, 3, 4], [5, 0, 1, 2]])
    out = token_logprobs(logits, ids)
    assert out.shape == (2, 4) and (out[:, 0] == 0).all()
    expected = torch.log_softmax(logits, dim=-1)[1, 2, 2]  # token 2 at position 3, from logits at 2
    assert out[1, 3].item() == pytest.approx(expected.item(), abs=1e-6)


def test_common_prefix_length():
    assert common_prefix_length(SEQUENCES) == 4
    assert common_prefix_length([[1, 2], [1, 3]]) == 1
    assert common_prefix_length([[1, 2]]) == 2


def test_shared_prefix_equals_full_forwards_float32(tiny_qwen3):
    shared = shared_prefix_reference_logprobs(tiny_qwen3, SEQUENCES)
    full = full_reference_logprobs(tiny_qwen3, SEQUENCES)
    assert shared.shape == full.shape == (4, 9)
    assert torch.allclose(shared, full, atol=1e-5)
    assert (shared[1, 5:] == 0).all()  # past the end of row 1


def test_shared_prefix_equals_full_forwards_float64_and_shorter_prefix(tiny_qwen3):
    model = Qwen3ForCausalLM(tiny_qwen3.config).eval()
    model.load_state_dict(tiny_qwen3.state_dict())
    model = model.double()
    full = full_reference_logprobs(model, SEQUENCES)
    for prefix_len in (1, 2, 4):
        shared = shared_prefix_reference_logprobs(model, SEQUENCES, prefix_len=prefix_len)
        assert torch.allclose(shared, full, atol=1e-10)


def test_prefix_must_be_shared(tiny_qwen3):
    with pytest.raises(ValueError):
        shared_prefix_reference_logprobs(tiny_qwen3, SEQUENCES, prefix_len=5)
    with pytest.raises(ValueError):
        shared_prefix_reference_logprobs(tiny_qwen3, [[1, 2], [3, 4]])
