"""The flat-buffer AdamW/SGD equal torch's optimizers, share their state layout, and keep autograd's gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from gpu_runtime.grpo.flat_optim import FlatAdamW, FlatParameters, FlatSGD, flat_layout_supported


def _params(seed: int = 0) -> list[torch.nn.Parameter]:
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape)) for shape in ((4, 6), (6, 4), (3,), (2, 5))]


def _loss(params, step: int) -> torch.Tensor:
    torch.manual_seed(100 + step)
    return sum(((p * torch.randn_like(p)).sum() ** 2) for p in params)


def _run(params, optimizer, steps: int, *, flat: FlatParameters | None = None) -> list[float]:
    norms = []
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        _loss(params, step).backward()
        if flat is not None:
            norms.append(flat.grad_norm())
        optimizer.step()
    return norms


@pytest.mark.parametrize("kernel", ["fused", "python"])
def test_flat_adamw_follows_torch_adamw(kernel, monkeypatch):
    if kernel == "python":
        monkeypatch.delattr(torch, "_fused_adamw_")
    reference = _params()
    expected = torch.optim.AdamW(reference, lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    _run(reference, expected, 5)

    params = _params()
    flat = FlatParameters(params)
    optimizer = FlatAdamW(flat, lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    norms = _run(params, optimizer, 5, flat=flat)
    for got, want in zip(params, reference, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    assert all(n > 0 for n in norms)
    assert (params[0] - _params()[0]).abs().max() > 0.05  # it really moved


def test_gradients_land_in_the_flat_buffer_and_zeroing_keeps_the_views():
    params = _params()
    flat = FlatParameters(params)
    optimizer = FlatAdamW(flat, lr=0.01)
    _loss(params, 0).backward()
    stacked = torch.cat([p.grad.flatten() for p in params])
    assert torch.equal(flat.grads, stacked) and stacked.abs().sum() > 0
    assert flat.grad_norm() == pytest.approx(float(stacked.norm()), rel=1e-6)
    optimizer.zero_grad(set_to_none=True)
    assert all(p.grad is not None and p.grad.abs().sum() == 0 for p in params)
    assert params[0].grad.data_ptr() == flat.grads.data_ptr()  # still views of the buffer
    optimizer.step()  # values are views too: updating the buffer updates the parameters
    assert params[0].data_ptr() == flat.values.data_ptr()


def test_state_dicts_move_between_flat_and_torch_adamw():
    """Checkpoints keep torch's per-parameter layout, so a resumed run continues identically."""
    params = _params()
    flat = FlatParameters(params)
    optimizer = FlatAdamW(flat, lr=0.05, weight_decay=0.01)
    _run(params, optimizer, 3, flat=flat)
    state = optimizer.state_dict()
    assert set(state["state"]) == {0, 1, 2, 3} and float(state["state"][0]["step"]) == 3.0

    twin = [torch.nn.Parameter(p.detach().clone()) for p in params]
    torch_optimizer = torch.optim.AdamW(twin, lr=0.05, weight_decay=0.01)
    torch_optimizer.load_state_dict(copy.deepcopy(state))  # torch adopts the tensors as they are
    _run(twin, torch_optimizer, 2)

    resumed_params = [torch.nn.Parameter(p.detach().clone()) for p in params]
    resumed = FlatAdamW(FlatParameters(resumed_params), lr=0.05, weight_decay=0.01)
    resumed.load_state_dict(state)
    _run(resumed_params, resumed, 2)
    for a, b in zip(resumed_params, twin, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)

    # ...and torch's state (now at step 5) loads into a flat optimizer the other way round.
    onward = [torch.nn.Parameter(p.detach().clone()) for p in twin]
    flat_onward = FlatAdamW(FlatParameters(onward), lr=0.05, weight_decay=0.01)
    flat_onward.load_state_dict(copy.deepcopy(torch_optimizer.state_dict()))
    _run(onward, flat_onward, 1)
    _run(twin, torch_optimizer, 1)
    for a, b in zip(onward, twin, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)

    with pytest.raises(ValueError, match="does not match"):
        FlatAdamW(FlatParameters(_params()[:2]), lr=0.05).load_state_dict(state)


def test_flat_sgd_follows_torch_sgd():
    reference = _params()
    _run(reference, torch.optim.SGD(reference, lr=0.01), 4)
    params = _params()
    _run(params, FlatSGD(FlatParameters(params), lr=0.01), 4)
    for got, want in zip(params, reference, strict=True):
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def test_mixed_dtypes_are_not_flattened():
    assert not flat_layout_supported([torch.zeros(2), torch.zeros(2, dtype=torch.float64)])
    assert not flat_layout_supported([])
    with pytest.raises(ValueError):
        FlatParameters([torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2).double())])
