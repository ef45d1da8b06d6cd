"""The lean forward equals the transformers/peft forward: values, LoRA, gradients, prefix sharing, caches."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from gpu_runtime import chunked_attention, kv_cache, lean_decoder, lean_plan, onednn_linear, packed_linear
from gpu_runtime.grpo.adapter_io import attach_lora
from gpu_runtime.grpo.reference import token_logprobs

SHAPE = dict(
    vocab_size=101,
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)


def _model(family: str):
    torch.manual_seed(0)
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=8))
    elif family == "qwen2":  # q/k/v biases, no per-head norms
        model = Qwen2ForCausalLM(Qwen2Config(**SHAPE))
    else:  # llama with rope scaling handled by its own rotary module
        model = LlamaForCausalLM(LlamaConfig(**SHAPE, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    model.eval()
    if family == "qwen2":
        with torch.no_grad():
            for layer in model.model.layers:
                layer.self_attn.q_proj.bias.normal_(0, 0.5)  # zero-initialised: make them count
    return model


def _batch() -> tuple[torch.Tensor, list[int]]:
    """Right-padded rows sharing a 6-token prompt."""
    torch.manual_seed(1)
    prompt = torch.randint(3, 100, (6,)).tolist()
    lengths = [14, 11, 16, 9]
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for row, n in enumerate(lengths):
        ids[row, :n] = torch.tensor(prompt + torch.randint(3, 100, (n - 6,)).tolist())
    return ids, lengths


def _real(values: torch.Tensor, lengths: list[int], start: int) -> list[torch.Tensor]:
    return [values[row, start:n] for row, n in enumerate(lengths)]


def _hf_logprobs(model, ids, lengths):
    attention = (torch.arange(ids.shape[1])[None] < torch.tensor(lengths)[:, None]).long()
    return token_logprobs(model(input_ids=ids, attention_mask=attention).logits, ids)


def _with_random_lora(model):
    torch.manual_seed(2)
    peft = attach_lora(model, rank=4, alpha=8)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.2)
    return peft


@pytest.fixture(params=["stacked", "apart"])
def projections(request, monkeypatch):
    """Tiny models run q|k|v and gate|up as one stacked matmul each; larger ones keep them apart."""
    if request.param == "apart":
        monkeypatch.setattr(lean_plan, "FUSE_MAX_ELEMENTS", 0)
    return request.param


@pytest.fixture(params=["small", "sdpa", "chunked"])
def attention_path(request, monkeypatch):
    """Which attention a forward with gradients takes: batched matmuls (small calls), the SDPA
    kernel, or query chunks (larger CPU training calls; chunks of 3 here so that a 16-token batch
    runs in several). Returns the calls the chunked path saw."""
    calls = []
    if request.param != "small":
        monkeypatch.setattr(lean_decoder, "SMALL_ATTENTION_SCORES", 0)
    if request.param == "sdpa":
        monkeypatch.setattr(lean_decoder, "CHUNKED_ATTENTION_KEPT_SCORES", 0)
    if request.param == "chunked":
        monkeypatch.setattr(chunked_attention, "MIN_CHUNK", 3)
        monkeypatch.setattr(lean_decoder, "CHUNKED_ATTENTION_MIN_HEAD_DIM", 8)
    original = chunked_attention.causal_attention

    def counted(*args):
        calls.append(args[0].shape)
        return original(*args)

    monkeypatch.setattr(chunked_attention, "causal_attention", counted)
    return request.param, calls


def _check_layout(plan, projections):
    assert all((layer.qkv.weight is None) == (projections == "apart") for layer in plan.layers)
    assert all((layer.gate_up.weight is None) == (projections == "apart") for layer in plan.layers)


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_log_probs_equal_the_transformers_forward(family, projections):
    model = _model(family)
    ids, lengths = _batch()
    with torch.no_grad():
        expected = _hf_logprobs(model, ids, lengths)
        plan = lean_decoder.plan_for(model)
        _check_layout(plan, projections)
        full = lean_decoder.sequence_logprobs(plan, ids, 6)
        shared = lean_decoder.sequence_logprobs(plan, ids, 6, prefix=6)
    for got in (full, shared):
        for a, b in zip(_real(got, lengths, 6), _real(expected, lengths, 6), strict=True):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=0)
    assert (full[:, :6] == 0).all()


def test_lora_values_gradients_and_disabled_adapter_match_peft(projections, attention_path):
    peft = _with_random_lora(_model("qwen3"))
    ids, lengths = _batch()
    params = [p for _, p in sorted(peft.named_parameters()) if p.requires_grad]

    def grads(compute):
        for p in params:
            p.grad = None
        values = compute()
        mask = torch.zeros_like(values, dtype=torch.bool)
        for row, n in enumerate(lengths):
            mask[row, 6:n] = True
        (values * mask).sum().backward()
        return values.detach(), torch.cat([p.grad.flatten() for p in params])

    hf_values, hf_grads = grads(lambda: _hf_logprobs(peft, ids, lengths))
    plan = lean_decoder.plan_for(peft)
    _check_layout(plan, projections)
    assert all(len(layer.qkv.parts[0].loras) == 1 for layer in plan.layers)  # LoRA picked up
    for kwargs in ({}, {"prefix": 6}, {"checkpoint_segments": 2}):
        values, lean_grads = grads(lambda kw=kwargs: lean_decoder.sequence_logprobs(plan, ids, 6, **kw))
        for a, b in zip(_real(values, lengths, 6), _real(hf_values, lengths, 6), strict=True):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=0)
        torch.testing.assert_close(lean_grads, hf_grads, atol=1e-4, rtol=1e-4)
    assert hf_grads.abs().max() > 1e-3  # the comparison is about real gradients
    path, chunked_calls = attention_path
    # Both layers of: the full forward, the shared prompt, the completions over it, the
    # checkpointed forward and its recomputation on backward.
    assert len(chunked_calls) == (10 if path == "chunked" else 0)

    with peft.disable_adapter(), torch.no_grad():
        base_plan = lean_decoder.plan_for(peft)
        base = lean_decoder.sequence_logprobs(base_plan, ids, 6)
        expected = _hf_logprobs(peft, ids, lengths)
    assert all(not layer.qkv.parts[0].loras for layer in base_plan.layers)
    for a, b in zip(_real(base, lengths, 6), _real(expected, lengths, 6), strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0)
    assert (base - hf_values).abs().max() > 1e-2  # the adapter really changes the policy


def test_left_padded_prefill_then_decode_matches_full_forwards():
    """The sampler's layout: left-padded prompts with explicit positions, then one token a step
    against the cached keys/values; every row equals its own unpadded full forward."""
    model = _model("qwen3")
    plan = lean_decoder.plan_for(model)
    rows = [[5, 9, 14, 3, 22, 7], [8, 41, 2]]
    steps = [[11, 12], [60, 61]]
    width = max(len(r) for r in rows)
    ids = torch.tensor([[0] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    attend = ((causal & mask.bool()[:, None, :]) | torch.eye(width, dtype=torch.bool))[:, None]
    with torch.no_grad():
        hidden, kv = lean_decoder.forward(plan, ids, positions=positions, mask=attend)
        got = [lean_decoder.lm_logits(plan, hidden[:, -1])]
        for step in range(2):
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
            token = torch.tensor([[steps[0][step]], [steps[1][step]]])
            positions = positions[:, -1:] + 1
            hidden, kv = lean_decoder.forward(
                plan, token, positions=positions, mask=mask.bool()[:, None, None, :], past=kv
            )
            got.append(lean_decoder.lm_logits(plan, hidden[:, -1]))
        for row in range(2):
            full = model(input_ids=torch.tensor([rows[row] + steps[row]])).logits[0]
            for step in range(3):
                torch.testing.assert_close(
                    got[step][row], full[len(rows[row]) - 1 + step], atol=2e-5, rtol=0
                )


@pytest.mark.skipif(onednn_linear.onednn_problem() is not None, reason=f"{onednn_linear.onednn_problem()}")
@pytest.mark.parametrize("threads", [1, 2, 4])
def test_rows_attending_by_start_get_bitwise_their_logits_alone(threads):
    """The sampler's batch-invariant path: a packed plan, rows left-padded and attending from their
    first real column (`starts`), prefilled together and decoded over a LeanCache. Each row's logits
    equal, bit for bit, those it gets alone (rows that share a start make one attention group in the
    prefill), and its own unpadded full forward's to rounding, at one thread and at several (where a
    decode step's SDPA call splits its work by its row count, so decode attends row by row)."""
    model = _model("qwen3")
    plan, problem = packed_linear.packed_plan(lean_decoder.plan_for(model, merge_lora=True))
    assert problem is None and isinstance(plan, packed_linear.PackedPlan)
    shared = [(7 * i) % 97 + 1 for i in range(40)]  # two long rows with one start
    rows = [[5, 9, 14, 3, 22, 7], [8, 41, 2], [8, 41, 7], [17, 4, 4, 90], shared, shared[:-1] + [3]]
    steps = [[11, 12], [60, 61], [60, 3], [1, 2], [5, 6], [7, 8]]
    before = torch.get_num_threads()
    torch.set_num_threads(threads)

    def run(prompts, tokens):
        width = max(len(r) for r in prompts)
        ids = torch.tensor([[0] * (width - len(r)) + r for r in prompts])
        starts = [width - len(r) for r in prompts]
        positions = torch.tensor([[0] * start + list(range(len(r))) for start, r in zip(starts, prompts, strict=True)])
        with torch.inference_mode():
            hidden, kv = lean_decoder.forward(plan, ids, positions=positions, starts=starts)
            cache = kv_cache.LeanCache(kv)
            logits = [packed_linear.lm_logits(plan, hidden[:, -1])]
            for step in range(2):
                positions = positions[:, -1:] + 1
                token = torch.tensor([[t[step]] for t in tokens])
                hidden, _ = lean_decoder.forward(plan, token, positions=positions, starts=starts, cache=cache)
                logits.append(packed_linear.lm_logits(plan, hidden[:, -1]))
        return torch.stack(logits, 1)  # (rows, steps, vocab)

    try:
        together = run(rows, steps)
        for row, (prompt, tokens) in enumerate(zip(rows, steps, strict=True)):
            assert torch.equal(together[row], run([prompt], [tokens])[0]), row
            with torch.no_grad():
                full = model(input_ids=torch.tensor([prompt + tokens])).logits[0]
            torch.testing.assert_close(together[row], full[len(prompt) - 1 : len(prompt) + 2], atol=2e-5, rtol=0)
    finally:
        torch.set_num_threads(before)


def test_the_batch_invariant_silu_rounds_a_row_alike_in_any_batch():
    """torch's fused silu rounds the scalar tail of a loop apart from its vectorised body, and a
    multi-threaded elementwise op cuts rows where its element count splits, so a row's activations
    moved with the batch (6 of these 2,003 rows at 8 threads). `_silu_times` rounds them alike."""
    before = torch.get_num_threads()
    torch.set_num_threads(8)
    try:
        with torch.inference_mode():
            gate, up = (torch.randn(2003, 576, generator=torch.Generator().manual_seed(0)) * 3).split(288, -1)
            together = lean_decoder._silu_times(gate, up)
            torch.testing.assert_close(together, torch.nn.functional.silu(gate) * up)
            for row in range(len(gate)):
                assert torch.equal(lean_decoder._silu_times(gate[row : row + 1], up[row : row + 1]), together[row : row + 1])
    finally:
        torch.set_num_threads(before)


def test_the_matmul_and_sdpa_attention_paths_agree(monkeypatch):
    model = _model("qwen3")
    ids, lengths = _batch()
    plan = lean_decoder.plan_for(model)
    with torch.no_grad():
        small = lean_decoder.sequence_logprobs(plan, ids, 6, prefix=6)
        monkeypatch.setattr(lean_decoder, "SMALL_ATTENTION_SCORES", 0)
        fused = lean_decoder.sequence_logprobs(plan, ids, 6, prefix=6)
    for a, b in zip(_real(small, lengths, 6), _real(fused, lengths, 6), strict=True):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=0)


def test_unsupported_models_say_why():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)).eval()
    assert "transformers causal LM with a decoder body" in lean_decoder.unsupported_reason(gpt2)
    sliding = Qwen3ForCausalLM(
        Qwen3Config(**SHAPE, head_dim=8, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    )
    assert "sliding-window" in lean_decoder.unsupported_reason(sliding)
    assert lean_decoder.unsupported_reason(_model("qwen3")) is None

    from peft import LoraConfig, get_peft_model

    dora = get_peft_model(_model("qwen3"), LoraConfig(r=2, target_modules=["q_proj"], use_dora=True))
    assert "DoRA" in lean_decoder.unsupported_reason(dora)
    mistral_like = _model("llama")
    mistral_like.config.model_type = "mistral"
    assert "model type 'mistral'" in lean_decoder.unsupported_reason(mistral_like)


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_bfloat16_weights_with_float32_lora_match_transformers(family):
    """The CUDA training layout (bf16 activations, fp32 LoRA tensors), checked on the CPU:
    reduced-precision norms, the LoRA dtype cast and fp32 log-probs follow transformers/peft."""
    peft = _with_random_lora(_model(family).to(torch.bfloat16))
    assert {p.dtype for p in peft.parameters() if p.requires_grad} == {torch.float32}
    ids, lengths = _batch()
    with torch.no_grad():
        expected = _hf_logprobs(peft, ids, lengths)
        got = lean_decoder.sequence_logprobs(lean_decoder.plan_for(peft), ids, 6, prefix=6)
        with peft.disable_adapter():
            base = lean_decoder.sequence_logprobs(lean_decoder.plan_for(peft), ids, 6, prefix=6)
    assert got.dtype == torch.float32
    for a, b in zip(_real(got, lengths, 6), _real(expected, lengths, 6), strict=True):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=0)  # bf16 rounding only
    moved = [(a - b).abs().max() for a, b in zip(_real(got, lengths, 6), _real(base, lengths, 6), strict=True)]
    assert max(moved) > 0.1  # the adapter matters, so the tolerance above cannot hide a dropped LoRA


def test_the_chunked_attention_is_for_wide_heads_in_training_within_its_budget(monkeypatch):
    plan = lean_decoder.plan_for(_model("qwen3"))  # heads of 8: narrower than the chunked path's minimum
    monkeypatch.setattr(lean_decoder, "SMALL_ATTENTION_SCORES", 0)

    def chunked(grad=True, **shape):
        args = dict(batch=4, length=16, keys=22) | shape
        with torch.set_grad_enabled(grad):
            how = lean_decoder._attention_for(plan, args["batch"], args["length"], args["keys"], None, plan.embed.device)
        return how.chunked, how.sdpa_mask

    assert chunked()[0] is False
    monkeypatch.setattr(lean_decoder, "CHUNKED_ATTENTION_MIN_HEAD_DIM", 8)
    assert chunked()[0] is True
    assert chunked(grad=False)[0] is False  # the reference forward and the sampler keep nothing
    assert chunked(length=1)[0] is False  # a decode step: nothing to chunk
    # Past the kept budget: SDPA, with the end-aligned mask spelled out (its is_causal aligns to key 0).
    monkeypatch.setattr(lean_decoder, "CHUNKED_ATTENTION_KEPT_SCORES", 4 * 4 * 16 * 22 - 1)
    on, mask = chunked()
    assert on is False
    assert mask.shape == (16, 22) and mask[0, :7].all() and not mask[0, 7:].any() and mask[-1].all()
