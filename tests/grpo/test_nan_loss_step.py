"""A step that leaves the loss or the adapter's weights non-finite fails the run `nan_loss` with a hint
and a failure receipt. Before, a learning rate of 1e308 on a one-group corpus trained one step into
inf/NaN weights, published nothing and failed `training_error: ValueError: Out of range float values
are not JSON compliant: nan` (the adapter's norms, written to the receipt), with no receipt at all."""

from __future__ import annotations

import json

import pytest
import torch

from core.contracts.grpo_config import GrpoConfig
from gpu_runtime.grpo import step
from gpu_runtime.grpo.errors import TrainingError
from tests.grpo.tiny_support import fixed_groups, run, train_request


def _fails_nan_loss(request) -> TrainingError:
    with pytest.raises(TrainingError) as caught:
        run(request)
    error = caught.value
    assert (error.code, error.failure_reason) == ("nan_loss", "nan_loss"), error
    assert "learning_rate" in error.hint
    receipt = json.loads(open(error.receipt_path).read())  # the failure receipt is written, as valid JSON
    assert receipt["status"] == "failed" and receipt["failure_reason"] == "nan_loss"
    assert not request.output_dir.exists()
    return error


@pytest.mark.parametrize("groups", [1, 2])
def test_a_step_into_non_finite_weights_fails_nan_loss(tiny_model_dir, tmp_path, one_thread, monkeypatch, groups):
    # GrpoConfig now refuses a learning_rate above 1, so the optimizer is handed the old probe's rate directly.
    monkeypatch.setattr(GrpoConfig, "resolved_learning_rate", property(lambda self: 1e308))
    error = _fails_nan_loss(train_request(tiny_model_dir, fixed_groups(groups), tmp_path, "huge"))
    assert error.message == "the optimizer step at learning_rate 1e+308 made the adapter's weights non-finite"
    # the first step's weights: their norms are null in the receipt, not NaN (which JSON cannot hold)
    assert any(n["norm"] is None for n in error.receipt["lora_delta_norms"])


def test_a_non_finite_loss_fails_nan_loss_with_a_hint(tiny_model_dir, tmp_path, one_thread, monkeypatch):
    real = step.grpo_loss

    def infinite(batch, config, **kwargs):
        loss, stats = real(batch, config, **kwargs)
        return loss + float("inf"), stats

    monkeypatch.setattr(step, "grpo_loss", infinite)
    error = _fails_nan_loss(train_request(tiny_model_dir, fixed_groups(1), tmp_path, "inf"))
    assert error.message == "the loss is inf (not finite)"
    assert all(torch.isfinite(torch.tensor(n["norm"])) for n in error.receipt["lora_delta_norms"])
