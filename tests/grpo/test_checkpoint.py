"""Exact resume: N groups, cancel (checkpoint), resume, M groups == N + M groups in one run, byte for byte."""

from __future__ import annotations

import json
import os

import pytest

from core.artifacts import describe_checkpoint
from gpu_runtime.grpo import checkpoint
from gpu_runtime.grpo.errors import CheckpointError
from tests.grpo.tiny_support import fixed_groups, run, train_request


def _strip_times(history):
    return [{k: v for k, v in h.items() if k != "elapsed_secs"} for h in history]


@pytest.mark.parametrize("optimizer", [{"kind": "adam_w"}, {"kind": "muon"}])
def test_resume_is_exact(tiny_model_dir, tmp_path, one_thread, optimizer):
    groups = fixed_groups(5)
    settings = {
        "optimizer": optimizer,
        "checkpoint_interval": 10,
        "kl_reference_policy": {"kind": "ema", "refresh_every": 2, "decay": 0.5},
    }
    whole = run(train_request(tiny_model_dir, groups, tmp_path / "whole", "math", **settings))

    stopped = run(train_request(tiny_model_dir, groups, tmp_path / "split", "math", **settings), stop_after=3)
    assert stopped.stopped and stopped.final_step == 3
    [ckpt] = stopped.checkpoints
    assert ckpt.name == "math-checkpoint-step-00000003.kiln-checkpoint"
    assert checkpoint.latest_checkpoint(tmp_path / "split", "math") == ckpt
    resumed = run(
        train_request(
            tiny_model_dir, groups, tmp_path / "split", "math", **settings, resume_checkpoint=ckpt.name
        )
    )
    assert resumed.final_step == 5 and resumed.receipt["resumed_from"]["global_step"] == 3
    # the live progress starts with the restored steps (a job's curves then show the whole run)
    import shutil

    restored = []
    shutil.copytree(ckpt, tmp_path / "again" / ckpt.name)
    run(train_request(tiny_model_dir, groups, tmp_path / "again", "math", **settings, resume_checkpoint=ckpt.name),
        progress=restored)
    assert [p["step"] for p in restored[0]["restored_loss_history"]] == [1, 2, 3]

    one = (whole.adapter_path / "adapter_model.safetensors").read_bytes()
    two = (resumed.adapter_path / "adapter_model.safetensors").read_bytes()
    assert one == two
    assert _strip_times(whole.receipt["loss_history"]) == _strip_times(resumed.receipt["loss_history"])
    assert whole.receipt["grpo"]["policy_audit"] == resumed.receipt["grpo"]["policy_audit"]
    assert whole.receipt["token_counts"] == resumed.receipt["token_counts"]


def test_checkpoint_layout_and_manifest(tiny_model_dir, tmp_path, one_thread):
    result = run(train_request(tiny_model_dir, fixed_groups(2), tmp_path, "lay", checkpoint_interval=2))
    [path] = result.checkpoints
    names = sorted(p.name for p in path.iterdir())
    assert names == [
        "adapter_parameters.safetensors",
        "checkpoint_manifest.json",
        "loss_history.json",
        "optimizer_state.pt",
        "rng_state.json",
        "rng_torch.pt",
    ]
    manifest, state = checkpoint.load_checkpoint(path)
    assert (
        manifest["manifest_type"] == "kiln.training-checkpoint.v1"
        and manifest["checkpoint_kind"] == "resumable"
    )
    assert (
        manifest["progress"]["global_step"]
        == manifest["optimizer"]["step"]
        == manifest["scheduler"]["step"]
        == 2
    )
    assert manifest["progress"]["data_order"] == [0, 1] and manifest["data"]["item_count"] == 2
    assert set(manifest["rng_states"]) >= {"torch_cpu", "python"}
    assert len(state.loss_history) == 2 and state.adapter
    summary = describe_checkpoint(path)  # the job detail's latest_checkpoint object
    assert summary["resume_checkpoint"] == path.name and summary["complete"] is True
    assert summary["global_step"] == summary["total_steps"] == 2 and summary["next_cursor_in_epoch"] == 2
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_resume_refuses_a_different_run(tiny_model_dir, tmp_path, one_thread):
    groups = fixed_groups(3)
    first = run(train_request(tiny_model_dir, groups, tmp_path, "orig", checkpoint_interval=1), stop_after=1)
    name = first.checkpoints[0].name

    def resume(groups=groups, adapter="orig", out="again", **config):
        request = train_request(
            tiny_model_dir, groups, tmp_path, out, checkpoint_interval=1, resume_checkpoint=name, **config
        )
        request.adapter_name = adapter
        with pytest.raises(CheckpointError) as caught:
            run(request)
        return caught.value

    changed = [dict(g) for g in groups]
    changed[0] = {**groups[0], "completions": [dict(c) for c in groups[0]["completions"]]}
    changed[0]["completions"][0]["reward"] = 0.25
    assert resume(groups=changed).code == "checkpoint_source_mismatch"
    error = resume(learning_rate=2e-3)
    assert error.code == "checkpoint_config_mismatch" and "learning_rate" in error.message
    assert resume(seed=8).code == "checkpoint_config_mismatch"
    assert resume(adapter="other").code == "checkpoint_adapter_mismatch"
    inline = train_request(
        tiny_model_dir,
        groups,
        tmp_path,
        "again",
        checkpoint_interval=1,
        resume_checkpoint=name,
        request_kwargs={"source_kind": "dataset_path"},
    )
    inline.adapter_name = "orig"
    with pytest.raises(CheckpointError) as caught:
        run(inline)
    assert caught.value.code == "checkpoint_source_mismatch"


def test_tampered_checkpoints_are_rejected(tiny_model_dir, tmp_path, one_thread):
    result = run(train_request(tiny_model_dir, fixed_groups(1), tmp_path, "tamper", checkpoint_interval=1))
    [path] = result.checkpoints
    checkpoint.load_checkpoint(path)

    weights = path / "adapter_parameters.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    os.chmod(weights, 0o644)
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256 drifted") as caught:
        checkpoint.load_checkpoint(path)
    assert caught.value.code == "checkpoint_invalid"
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    checkpoint.load_checkpoint(path)

    (path / "extra.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="extra"):
        checkpoint.load_checkpoint(path)
    (path / "extra.bin").unlink()

    manifest = json.loads((path / "checkpoint_manifest.json").read_text())
    manifest["surprise"] = 1
    (path / "checkpoint_manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="unknown"):
        checkpoint.load_checkpoint(path)

    with pytest.raises(CheckpointError) as caught:
        checkpoint.resolve_checkpoint(tmp_path, "../elsewhere.kiln-checkpoint")
    assert caught.value.code == "checkpoint_not_found"
    with pytest.raises(CheckpointError):
        checkpoint.resolve_checkpoint(tmp_path, "/somewhere/else/x.kiln-checkpoint")


def test_checkpoint_names_are_immutable(tiny_model_dir, tmp_path, one_thread):
    run(train_request(tiny_model_dir, fixed_groups(1), tmp_path, "imm", checkpoint_interval=1))
    request = train_request(tiny_model_dir, fixed_groups(1), tmp_path, "imm-b", checkpoint_interval=1)
    request.adapter_name = "imm"  # a second run of the same adapter name and step
    progress = []
    result = run(request, progress=progress)
    assert result.checkpoints == [] and "already exists" in result.checkpoint_errors[0]
    assert [f["checkpoint_error"] for f in progress if "checkpoint_error" in f] == result.checkpoint_errors
    assert result.receipt["checkpoint_errors"] == result.checkpoint_errors
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path, "imm")] == [1]


def test_retention_keeps_the_newest_checkpoints_and_never_the_resume_source(tiny_model_dir, tmp_path, one_thread):
    groups = fixed_groups(5)
    stopped = run(train_request(tiny_model_dir, groups, tmp_path, "ret", checkpoint_interval=1,
                                checkpoint_keep_last=2), stop_after=2)
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path, "ret")] == [1, 2]
    source = stopped.checkpoints[0]  # step 1: a resume names it, so retention must keep it
    resumed = run(train_request(tiny_model_dir, groups, tmp_path, "ret", checkpoint_interval=1,
                                checkpoint_keep_last=2, resume_checkpoint=source.name))
    assert resumed.final_step == 5
    assert [step for step, _ in checkpoint.list_checkpoints(tmp_path, "ret")] == [1, 4, 5]
    assert [p.name for p in resumed.checkpoints] == [p.name for _, p in checkpoint.list_checkpoints(tmp_path, "ret")][1:]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no retired folder is left"


def test_progress_names_the_newest_checkpoint_while_running_and_at_a_cancel(tiny_model_dir, tmp_path, one_thread):
    progress = []
    stopped = run(train_request(tiny_model_dir, fixed_groups(4), tmp_path, "live", checkpoint_interval=1),
                  stop_after=2, progress=progress)
    named = [figures["latest_checkpoint"] for figures in progress if "latest_checkpoint" in figures]
    assert named == [str(p) for p in stopped.checkpoints]  # each one as soon as it is published
    assert named[-1].endswith("live-checkpoint-step-00000002.kiln-checkpoint")  # the cancel's own
