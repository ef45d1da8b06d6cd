"""Smoke tests of the CPU scaling benchmark (benchmarks/grpo_scaling.py): its options and one tiny cell.

They check that the benchmark runs, never how fast: speed is printed by the benchmarks, not asserted.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_support  # noqa: E402
import grpo_scaling  # noqa: E402
from anon_memory import AnonPeak  # noqa: E402


def test_cells_parse_and_reject_unknown_models():
    assert grpo_scaling.parse_cells("tiny:8:32, q25m:32:256") == [("tiny", 8, 32), ("q25m", 32, 256)]
    assert len(grpo_scaling.parse_cells("all")) == 8
    with pytest.raises(Exception, match="MODEL:GROUP:LENGTH"):
        grpo_scaling.parse_cells("gpt2:8:32")


def test_flop_model_is_two_flops_per_weight_per_token_plus_attention_and_head():
    shape = bench_support.Shape(hidden=8, intermediate=16, layers=2, heads=2, kv_heads=1, head_dim=4, vocab=10)
    dense = shape.dense_params()
    assert dense == 2 * (8 * (8 + 8) + 8 * 8 + 3 * 8 * 16)
    one = bench_support.forward_flops(shape, [(1, 0, 0)], rank=0)
    assert one == 2 * dense + 4 * 8 * 1 * 2  # one token attends to itself in both layers
    with_head = bench_support.forward_flops(shape, [(1, 0, 1)], rank=0)
    assert with_head - one == 2 * 8 * 10


def test_quick_run_of_one_tiny_cell_prints_the_table(tmp_path, capsys):
    code = grpo_scaling.main(
        ["--cells", "tiny:2:4", "--sides", "kiln", "--quick", "--repeats", "1", "--models-dir", str(tmp_path),
         "--profile"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "tiny 2 4" in out and "generation" in out and "peak RSS MiB" in out and "peak anon MiB" in out
    assert "tokens trained   kiln 8" in out  # 1 prompt x 2 completions x 4 sampled tokens, all trained
    # Sampled from the base model at temperature 1 and trained against it: the records are the reference.
    assert "forward lean, reference recorded_behavior" in out
    reference_row = next(line for line in out.splitlines() if "reference_forward" in line)
    assert "%" not in reference_row  # no forward ran, so no share of the matmul peak
    # The profiled extra round (after the memory peaks were read) prints both operator tables.
    assert "profile of Kiln's sampling" in out and "profile of Kiln's training" in out and "aten::mm" in out


def test_the_anonymous_memory_peak_sees_an_allocation_that_is_gone():
    import time

    watcher = AnonPeak(interval=0.001)
    before = watcher.mib()
    block = b"\x01" * (160 * 2**20)  # written, so resident
    # The watcher thread samples every millisecond, but on a loaded machine it may not run for a
    # while: wait (up to 10 s) for it to see the block rather than for a fixed time.
    deadline = time.monotonic() + 10
    while watcher.seen_mib() - before < 150 and time.monotonic() < deadline:
        time.sleep(0.01)
    del block
    time.sleep(0.01)
    peak = watcher.stop()
    assert peak - before >= 150
    now = AnonPeak()
    assert peak >= watcher.mib() and now.stop() < peak  # the peak stays; today's use is lower


def test_the_floor_at_peak_is_the_ratio_kiln_would_reach_at_its_full_matmul_peak():
    # Kiln's backward: 830 ms at 65 % of its peak (its FLOPs take 539.5 ms at 100 %); TRL's: 1000 ms.
    kiln = {"generation_ms": 500.0, "reference_forward_ms": 0.3, "policy_forward_ms": 480.0, "backward_ms": 830.0,
            "optimizer_ms": 1.0, "share": {"generation_ms": 0.25, "policy_forward_ms": 0.75, "backward_ms": 0.65}}
    trl = {"generation_ms": 1000.0, "reference_forward_ms": 900.0, "policy_forward_ms": 1000.0, "backward_ms": 1000.0,
           "optimizer_ms": 5.0}
    floors = grpo_scaling.floors_at_peak(kiln, trl)
    assert floors == pytest.approx({"generation": 0.125, "policy_forward": 0.36, "backward": 0.5395})
