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


SHORT_WRITE = "[enforce fail at inline_container.cc:672] . unexpected pos 120320 vs 120208"


def _torch_save_failing_for(name: str, monkeypatch, message: str) -> None:
    """torch.save raises `message` (a RuntimeError without errno, as torch's zip writer does) for `name`."""
    import torch

    real_save = torch.save

    def save(obj, target, *args, **kwargs):
        if str(target).endswith(name):
            raise RuntimeError(message)
        return real_save(obj, target, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def test_torch_short_write_of_a_checkpoint_ends_the_run_disk_full(tiny_model_dir, tmp_path, one_thread, monkeypatch):
    from gpu_runtime.grpo import checkpoint

    _torch_save_failing_for(checkpoint.OPTIMIZER_FILE, monkeypatch, SHORT_WRITE)
    with pytest.raises(TrainingError) as caught:
        run(train_request(tiny_model_dir, fixed_groups(2), tmp_path, "short", checkpoint_interval=1))
    assert caught.value.code == "adapter_disk_quota_exceeded", caught.value.message
    assert "unexpected pos" in caught.value.message and "kiln adapters delete" in caught.value.hint
    assert sorted(p.name for p in tmp_path.iterdir()) == ["short.train_receipt.failed.json"]


def _state():
    import torch

    from gpu_runtime.grpo.checkpoint import CheckpointState

    return CheckpointState(adapter={"lora_A": torch.zeros(2, 2)}, optimizer={"state": {}}, reference=None,
                           rng={"torch_cpu": torch.zeros(1)}, loss_history=[])


@pytest.mark.parametrize("free_bytes, disk_full", [(4096, True), (50 * 2**30, False)])
def test_a_failed_checkpoint_write_on_a_nearly_full_disk_is_disk_full(tmp_path, monkeypatch, free_bytes, disk_full):
    """A torch write error that names no cause counts as the disk being full when the checkpoint's
    filesystem has (almost) no room left; with room, it stays what it was."""
    import shutil
    from collections import namedtuple

    from core.errors import is_disk_full
    from gpu_runtime.grpo import checkpoint

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100 * 2**30, 100 * 2**30 - free_bytes, free_bytes))
    _torch_save_failing_for(checkpoint.OPTIMIZER_FILE, monkeypatch, "PytorchStreamWriter: write error at 4096")
    with pytest.raises((OSError, RuntimeError)) as caught:
        checkpoint.write_checkpoint(tmp_path, adapter_name="full", step=1, state=_state(), manifest={})
    assert is_disk_full(caught.value) is disk_full
    if disk_full:
        assert caught.value.errno == errno.ENOSPC and "PytorchStreamWriter: write error" in str(caught.value)
    else:
        assert type(caught.value) is RuntimeError
    assert list(tmp_path.iterdir()) == []  # the staged folder is gone either way
