"""The trainer's writers (adapter folder, checkpoints, receipts) publish through core.artifacts: when
that layer fails, the run fails and nothing that looks finished is left behind."""

from __future__ import annotations

import errno
import json

import pytest

from core import artifacts
from gpu_runtime.grpo.errors import TrainingError
from tests.grpo.tiny_support import fixed_groups, run, train_request


@pytest.mark.parametrize("settings, writer", [
    ({"checkpoint_interval": 1}, ".full-checkpoint-step-00000001.kiln-checkpoint."),  # the checkpoint writer
    ({}, ".full."),  # the adapter folder (StagedAdapter)
])
def test_a_full_disk_in_the_artifact_layer_leaves_no_adapter_and_no_checkpoint(
        tiny_model_dir, tmp_path, one_thread, monkeypatch, settings, writer):
    staged = []

    def disk_full(root):
        staged.append(root.name)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(artifacts, "fsync_tree", disk_full)
    with pytest.raises(TrainingError) as caught:
        run(train_request(tiny_model_dir, fixed_groups(2), tmp_path, "full", **settings))
    assert "No space left on device" in caught.value.message
    assert caught.value.code == "adapter_disk_quota_exceeded" and "kiln adapters delete" in caught.value.hint
    assert [name.startswith(writer) for name in staged] == [True], staged  # it went through the layer
    # Only the failure receipt remains (it says the run failed); no adapter, checkpoint or staging.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full.train_receipt.failed.json"]
    failed = json.loads((tmp_path / "full.train_receipt.failed.json").read_text())
    assert failed["status"] != "success" and "No space left" in json.dumps(failed)
