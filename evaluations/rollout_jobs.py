"""The `rollouts.generate` job (control queue): `kiln rollout-generate`, run by the server.

The same pure pipeline as the CLI (kiln_project/cli/rollout_cmd.py), with the same checks:
`load_tasks`/`load_template` on the pinned inputs, `plan_requests`, `run_requests` (every response
validated against its request and its kiln.rollout-provenance.v1 record), `check_consistency`,
`build_groups`/`corpus_bytes`/`build_summary`, and `publish_together`. Only the wiring differs:

- transport: `adapters.serving.sync_client.chat_completion_sync` (the `infer` actor and its
  Redis event list; no HTTP, so the job needs no server URL);
- scorer: the registered scorer (evaluations registry; its sha256 re-checked) through
  `evaluations.sandbox.run_scorer`, always sandboxed;
- output: `<KILN_HOME>/rollouts/<job uuid>/rollouts.jsonl` + `summary.json`, published together
  and atomically only when everything validated; a failure or a cancellation publishes nothing.

Progress is reported per scored request. Runs in the control worker; imports no torch.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

from adapters.serving.selectors import wait_for_inference_ready
from core.canonical import sha256_digest
from core.errors import KilnError
from evaluations.generation.corpus import build_groups, build_summary, corpus_bytes
from evaluations.generation.errors import RolloutError
from evaluations.generation.generate import plan_requests, run_requests
from evaluations.generation.publish import check_targets, publish_together
from evaluations.generation.template import RenderOptions, load_tasks, load_template
from evaluations.generation.validation import check_consistency
from evaluations.payloads import RolloutsJobPayload
from evaluations.rollout_selectors import ROLLOUTS_FILE, SUMMARY_FILE, rollouts_job_dir

REQUEST_TIMEOUT_S = 900.0  # as the CLI: up to 300 s for a busy GPU worker, then decoding
PROGRESS_EVERY_REQUEST_UP_TO = 200  # larger runs report at most every PROGRESS_INTERVAL_S
PROGRESS_INTERVAL_S = 0.5
NO_CONTRAST_IDS_IN_RESULT = 100


def _error(exc: RolloutError) -> KilnError:
    return KilnError(exc.code, exc.message + (f" ({exc.hint})" if exc.hint else ""), hint=exc.hint)


def _checked_input(entry: dict, what: str) -> Path:
    path = Path(entry["path"])
    try:
        digest = sha256_digest(path.read_bytes())
    except OSError as exc:
        raise KilnError("rollouts_input_missing", f"the pinned {what} {path} cannot be read: {exc}") from None
    if digest != entry.get("sha256"):
        raise KilnError("rollouts_input_changed", f"the pinned {what} {path} changed after submission "
                        f"({entry.get('sha256')} -> {digest})")
    return path


def _registered_scorer(entry: dict) -> Path:
    from evaluations.selectors import scorer_get, scorer_path

    scorer = scorer_get(name=entry.get("name", ""))
    if scorer is None:
        raise KilnError("scorer_not_found", f"no registered scorer named {entry.get('name')!r}")
    path = scorer_path(scorer=scorer)
    try:
        digest = sha256_digest(path.read_bytes())
    except OSError as exc:
        raise KilnError("scorer_not_found", f"the scorer file {path} cannot be read: {exc}") from None
    if digest != entry.get("sha256") or digest != scorer.sha256:
        raise KilnError("scorer_changed", f"scorer {scorer.name!r} is not the file registered ({scorer.sha256}); "
                        f"its file now hashes to {digest}")
    return path


class _Wiring:
    """The transport, scorer and progress callables handed to run_requests, with cancellation."""

    def __init__(self, ctx, scorer: Path, total: int):
        from evaluations.sandbox import ScorerLimits

        self.ctx, self.scorer, self.total = ctx, scorer, total
        self.limits = ScorerLimits()
        self.stopped = threading.Event()
        self.home_thread = threading.current_thread()
        self.lock = threading.Lock()
        self.rewards: list[float] = []
        self.last_report = 0.0

    def post(self, body: dict) -> dict:
        from django.db import connections

        from adapters.serving.sync_client import chat_completion_sync

        if self.stopped.is_set():
            raise RolloutError("job_cancelled", "the job was asked to stop")
        try:
            return chat_completion_sync(body, timeout=REQUEST_TIMEOUT_S)
        finally:
            if threading.current_thread() is not self.home_thread:
                connections.close_all()  # readiness reads opened this thread's own connection

    def score(self, payload: dict):
        from evaluations.sandbox import run_scorer

        if self.stopped.is_set():
            raise RolloutError("job_cancelled", "the job was asked to stop")
        result = run_scorer(self.scorer, payload, limits=self.limits, unsandboxed=False, cwd=None)
        reward = getattr(result, "reward", None)
        if isinstance(reward, int | float) and not isinstance(reward, bool):
            with self.lock:
                self.rewards.append(float(reward))
        return result

    def progress(self, done: int, total: int, label: str) -> None:
        """Called on the job's own thread after each scored request."""
        if self.ctx.should_stop():
            self.stopped.set()
            from core.jobs.runner import JobCancelled

            raise JobCancelled()
        now = time.monotonic()
        if total > PROGRESS_EVERY_REQUEST_UP_TO and done < total and now - self.last_report < PROGRESS_INTERVAL_S:
            return
        self.last_report = now
        with self.lock:
            rewards = list(self.rewards)
        metrics = {"requests_done": done, "requests_total": total}
        if rewards:
            metrics["mean_reward"] = sum(rewards) / len(rewards)
        self.ctx.report_progress(0.02 + 0.95 * done / total, f"{done}/{total} scored · {label}", metrics=metrics)


def _run_info(ctx, payload: RolloutsJobPayload, options: RenderOptions, seeds: list[int], scorer: Path,
              output: Path, tasks_count: int) -> dict:
    inputs = payload.inputs
    return {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "job": {"id": ctx.job_id, "kind": "rollouts.generate", "route": payload.route},
        "transport": "in-cluster: the infer queue (adapters.serving.sync_client)",
        "adapter": "base" if options.is_base else options.adapter,
        "thinking": {"enabled": options.thinking, "budget_tokens": options.thinking_budget_tokens},
        "seeds": {"start": seeds[0], "count": len(seeds), "last": seeds[-1]},
        "concurrency": payload.concurrency,
        "inputs": {
            "tasks": {"path": inputs["tasks"]["path"], "filename": inputs["tasks"].get("filename"),
                      "sha256": inputs["tasks"]["sha256"], "count": tasks_count},
            "request_template": {"path": inputs["request_template"]["path"],
                                 "filename": inputs["request_template"].get("filename"),
                                 "sha256": inputs["request_template"]["sha256"]},
        },
        "scorer": {"name": payload.scorer["name"], "path": str(scorer), "sha256": payload.scorer["sha256"]},
        "output": {"path": str(output)},
    }


def _result(summary: dict, output: Path, summary_path: Path) -> dict:
    stats = summary["stats"]
    return {
        "rollouts_path": str(output),
        "summary_path": str(summary_path),
        "output": summary["output"],
        "adapter": summary["adapter"],
        "adapter_identity": summary.get("adapter_identity"),
        "scorer": {k: summary["scorer"].get(k) for k in ("name", "sha256", "sandboxed", "mechanisms")},
        "stats": {
            **{k: stats[k] for k in ("count", "mean_reward", "min_reward", "max_reward", "stdev_reward",
                                     "reward_histogram", "groups", "groups_without_contrast", "prompt_tokens",
                                     "completion_tokens", "finish_reasons", "latency_ms")},
            "groups_without_contrast_ids": stats["groups_without_contrast_ids"][:NO_CONTRAST_IDS_IN_RESULT],
        },
    }


def run_rollouts_job(ctx) -> dict:
    """Generate, validate, score and publish recorded-policy rollouts; returns the file paths and stats."""
    payload = RolloutsJobPayload.of(ctx.job)
    try:
        options = RenderOptions(adapter=payload.adapter, thinking=payload.thinking,
                                thinking_budget_tokens=payload.thinking_budget_tokens)
        seeds = payload.seeds
        directory = rollouts_job_dir(job_id=ctx.job_id)
        directory.mkdir(parents=True, exist_ok=True)
        output, summary_path = check_targets([directory / ROLLOUTS_FILE, directory / SUMMARY_FILE])
        scorer = _registered_scorer(payload.scorer)
        tasks = load_tasks(_checked_input(payload.inputs["tasks"], "tasks file"))
        template = load_template(_checked_input(payload.inputs["request_template"], "request template"))
        planned = plan_requests(template, tasks, seeds, options)
        wait_for_inference_ready(ctx)
        ctx.report_progress(0.02, f"0/{len(planned)} scored · sending requests",
                            metrics={"requests_done": 0, "requests_total": len(planned)})
        wiring = _Wiring(ctx, scorer, len(planned))
        try:
            scored = run_requests(planned, post=wiring.post, score=wiring.score, options=options,
                                  concurrency=payload.concurrency, on_progress=wiring.progress)
        finally:
            wiring.stopped.set()  # requests still in flight after a failure send nothing new
        identity = check_consistency([r.checked for r in scored], {t.id: t for t in tasks})
        groups, group_rows = build_groups(scored)
        data = corpus_bytes(groups)
        run = _run_info(ctx, payload, options, seeds, scorer, output, len(tasks))
        summary = build_summary(scored=scored, group_rows=group_rows, identity=identity, corpus=data, run=run,
                                unsandboxed_requested=False)
        summary_bytes = (json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode()
        ctx.raise_if_stopped()  # a cancelled job publishes nothing
        ctx.report_progress(0.98, "publishing rollouts.jsonl and summary.json")
        publish_together([(output, data), (summary_path, summary_bytes)])
    except RolloutError as exc:
        if ctx.should_stop():
            from core.jobs.runner import JobCancelled

            raise JobCancelled() from None
        raise _error(exc) from None
    stats = summary["stats"]
    ctx.log(f"published {summary['output']['groups']} groups ({summary['output']['rollouts']} rollouts): reward mean "
            f"{stats['mean_reward']:.4g}, min {stats['min_reward']:.4g}, max {stats['max_reward']:.4g}; "
            f"{stats['groups_without_contrast']} of {stats['groups']} groups without reward contrast")
    return _result(summary, output, summary_path)
