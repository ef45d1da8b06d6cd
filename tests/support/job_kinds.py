"""Job kinds that exist only for tests: they step through progress, can be cancelled, can fail.

A step-gated kind waits for a file to appear before each step so a test controls exactly when
progress moves (no sleeps racing the assertions).
"""

from __future__ import annotations

import time
from pathlib import Path

from core.errors import KilnError
from core.jobs.kinds import JobKind, register_job_kind

register_job_kind(JobKind(name="test.steps", queue="gpu", handler="tests.support.job_kinds:run_steps",
                          category="training"))
register_job_kind(JobKind(name="test.control_steps", queue="control",
                          handler="tests.support.job_kinds:run_steps", category="openenv"))
register_job_kind(JobKind(name="test.fail", queue="control", handler="tests.support.job_kinds:run_fail"))
register_job_kind(JobKind(name="test.hooked", queue="control", handler="tests.support.job_kinds:run_steps",
                          on_unsuccessful="tests.support.job_kinds:record_unsuccessful"))
# What `record_unsuccessful` saw: (job id, state, error_code), in order.
UNSUCCESSFUL_SEEN: list[tuple] = []


def record_unsuccessful(job) -> None:
    UNSUCCESSFUL_SEEN.append((job.id, job.state, job.error_code))


def run_steps(ctx) -> dict:
    """payload: steps (int), delay (seconds per step), gate_dir (optional: wait for gate_dir/step-N)."""
    steps = int(ctx.payload.get("steps", 3))
    delay = float(ctx.payload.get("delay", 0.0))
    gate_dir = ctx.payload.get("gate_dir")
    done = 0
    for step in range(1, steps + 1):
        if gate_dir:
            gate = Path(gate_dir) / f"step-{step}"
            while not gate.exists():
                ctx.raise_if_stopped()
                time.sleep(0.05)
        else:
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline:
                ctx.raise_if_stopped()
                time.sleep(min(0.05, delay))
        ctx.raise_if_stopped()
        done = step
        ctx.report_progress(step / steps, f"step {step}/{steps}", metrics={"step": step})
    return {"steps_done": done}


def run_fail(ctx) -> dict:
    raise KilnError("test_failure", ctx.payload.get("message", "this job fails on purpose"))
