"""The `training.grpo` job handler. Runs in the GPU worker (it imports torch via gpu_runtime).

It reads the pinned snapshot, runs gpu_runtime's GRPO loop with the job's callbacks, publishes
the adapter in the registry, and returns what GET /v1/train/jobs/{id} shows. Progress goes into
job.metrics (scalars plus loss/reward/KL histories for the live curves).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, transaction

from adapters.selectors import adapter_published_path
from adapters.services import adapter_publish, adapters_root
from adapters.serving.runtime_host import resident_base
from core.errors import KilnError
from core.jobs.runner import JobCancelled
from core.model_weights import require_model_weights
from core.models import ReceiptKind
from core.receipts import receipt_record
from training.metrics import count_completed_run
from training.payloads import GrpoJobPayload
from training.selectors import checkpoint_manifest_sha256

HISTORY_KEYS = {"loss": "loss_history", "reward_mean": "reward_history", "kl_mean": "kl_history"}
# The live curves keep at most this many points: past it every other point goes (the newest always
# stays), so a long run's row stays small. The receipt keeps the full loss history.
MAX_HISTORY_POINTS = 500
log = logging.getLogger(__name__)


def downsampled(history: list) -> list:
    """At most MAX_HISTORY_POINTS: every other point dropped (the last kept) until it fits, so a
    resumed run's restored history of any length is bounded too."""
    while len(history) > MAX_HISTORY_POINTS:
        history = history[:-1:2] + history[-1:]
    return history


def _finite(value):
    """JSON columns refuse NaN/Infinity: a non-finite figure is stored as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class ProgressRecorder:
    def __init__(self, ctx):
        self.ctx = ctx
        self.metrics: dict = {name: [] for name in HISTORY_KEYS.values()}
        self.started = time.monotonic()

    def __call__(self, figures: dict) -> None:
        if "restored_loss_history" in figures:  # a resumed run: its steps before the checkpoint
            self._restore(figures["restored_loss_history"])
            return
        if "checkpoint_error" in figures:  # not a step: kept for the job detail, the run goes on
            self.metrics["checkpoint_error"] = str(figures["checkpoint_error"])
            self.ctx.report_progress(self.metrics.get("progress") or 0.0, "checkpoint failed", metrics=self.metrics)
            return
        step = figures.get("step")
        for key, history in HISTORY_KEYS.items():
            if key in figures:
                point = _loss_point(step, figures, round(time.monotonic() - self.started, 3)) if key == "loss" \
                    else {"step": step, key: _finite(figures[key])}
                self.metrics[history] = downsampled(self.metrics[history] + [point])
        scalars = {k: _finite(v) for k, v in figures.items() if isinstance(v, int | float | str | type(None))}
        self.metrics.update(scalars)
        message = f"step {step}/{figures.get('total_steps')}"
        if isinstance(scalars.get("loss"), float):
            message += f" loss {scalars['loss']:.4f}"
        self.ctx.report_progress(figures.get("progress", 0.0), message, metrics=self.metrics)

    def _restore(self, points: list[dict]) -> None:
        """The loss and KL curves of a resumed run's steps before its checkpoint (per step, from the
        checkpoint's ledger; the reward curve is per group and starts at the resume)."""
        self.metrics["loss_history"] = downsampled([_loss_point(p.get("step"), p, p.get("elapsed_secs"))
                                                    for p in points])
        self.metrics["kl_history"] = downsampled([{"step": p.get("step"), "kl_mean": _finite(p.get("kl_mean"))}
                                                  for p in points if p.get("kl_mean") is not None])


def _loss_point(step, figures: dict, elapsed_secs) -> dict:
    """One point of the job detail's loss_history[]: {step, loss, epoch, progress, elapsed_secs}."""
    return {"step": step, "loss": _finite(figures.get("loss")), "epoch": figures.get("epoch", 0),
            "progress": _finite(figures.get("progress")), "elapsed_secs": elapsed_secs}


def _record_failure_receipt(path: Path, name: str, job) -> None:
    """The receipt a failed run left on disk, as a row too (the file stays the portable copy)."""
    try:
        body = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return  # failed before the trainer wrote one
    try:
        with transaction.atomic():
            receipt_record(kind=ReceiptKind.TRAIN_FAILURE, subject=name, body=body, job=job)
    except DatabaseError as exc:  # e.g. its disk is full: the job's own error must still be the one recorded
        log.warning("could not record the failure receipt of job %s as a row (%s); its file stays at %s",
                    job.uuid, exc, path)


# What a named-dataset submission (or an OpenEnv run's corpus lineage) adds to the receipt's
# training_data (reference-spec §1.1, §2.9).
LINEAGE_KEYS = ("dataset", "split", "dataset_corpus_sha256", "split_manifest_sha256", "openenv")


def _check_resumed_checkpoint_unchanged(payload: GrpoJobPayload) -> None:
    """The queue holds the checkpoint's manifest digest from admission (reference-spec §3.2): a folder
    replaced under the same name while the job waited is refused here; the trainer then re-validates
    every file against the manifest."""
    pinned, name = payload.resume_manifest_sha256, payload.config.resume_checkpoint
    if pinned and (now := checkpoint_manifest_sha256(name=name)) != pinned:
        raise KilnError("checkpoint_invalid", f"checkpoint {name} changed after the job was admitted: its manifest "
                        f"was {pinned}, now {now or 'missing'}")


def run_grpo_job(ctx) -> dict:
    from gpu_runtime.grpo.errors import TrainingError
    from gpu_runtime.grpo.trainer import TrainRequest, train_grpo
    from gpu_runtime.writer_lock import gpu_writer

    payload = GrpoJobPayload.of(ctx.job)
    # Admission refused this already; a worker started with other settings than the web process gets here.
    require_model_weights()
    name, config = payload.adapter_name, payload.config
    snapshot = Path(payload.snapshot_path)
    groups = [json.loads(line) for line in snapshot.read_bytes().splitlines() if line.strip()]
    base_dir = adapter_published_path(name=config.base_adapter) if config.base_adapter else None
    if config.base_adapter and base_dir is None:
        raise KilnError("base_adapter_missing", f"base adapter {config.base_adapter!r} is no longer published")
    _check_resumed_checkpoint_unchanged(payload)
    output_dir = adapters_root() / name
    data = payload.training_data
    request = TrainRequest(
        model_dir=settings.KILN.model_path, groups=groups, config=config, output_dir=output_dir,
        adapter_name=name, base_adapter_dir=base_dir, base_adapter_name=config.base_adapter,
        checkpoint_root=adapters_root(), source_sha256=data["admitted_corpus_sha256"],
        source_kind=data["source"], source_path=data.get("path"), device="auto",
        source_lineage={key: data[key] for key in LINEAGE_KEYS if data.get(key) is not None} or None,
        failure_receipt_path=settings.KILN.layout.failure_receipt(ctx.job_id),
        config_sources=dict(payload.config_sources) or None,
        server_training_defaults=dict(payload.server_training_defaults),
        shared_base=resident_base(),  # the sampler's weights: no second copy of the base model
    )
    request.failure_receipt_path.parent.mkdir(parents=True, exist_ok=True)
    recorder = ProgressRecorder(ctx)
    try:
        result = train_grpo(request, on_progress=recorder, should_stop=ctx.should_stop, gpu_writer=gpu_writer)
    except TrainingError as exc:
        _record_failure_receipt(request.failure_receipt_path, name, ctx.job)
        raise KilnError(exc.code, exc.message, hint=exc.hint or "") from None
    checkpoints = [str(p) for p in result.checkpoints]
    summary = {"adapter_name": name, "receipt_path": str(result.receipt_path), "checkpoints": checkpoints,
               "latest_checkpoint": checkpoints[-1] if checkpoints else None, "final_step": result.final_step,
               "total_steps": result.total_steps, "effective_seed": str(result.effective_seed)}
    if result.stopped:
        ctx.log("cancelled at a group boundary", {"checkpoint": summary["latest_checkpoint"]})
        raise JobCancelled()
    from gpu_runtime.identity import adapter_files, file_manifest, manifest_digest

    receipt = result.receipt
    smoke_passed = bool((receipt.get("adapter_smoke_test") or {}).get("passed", True))
    content_digest = manifest_digest(file_manifest(result.adapter_path, adapter_files(result.adapter_path)))
    _write_manifest(result.adapter_path, name=name, content_sha256=content_digest, receipt=receipt, job=ctx.job,
                    payload=payload)
    try:
        with transaction.atomic():  # the adapter row and its receipt row appear together
            ctx.begin_publishing()  # a cancel that came while the last step ran stops it here
            adapter, activation, post_eval_job = _publish(ctx, payload, result, content_digest, smoke_passed)
    except JobCancelled:
        # Never registered, so never served: releasing the reservation removes the folder
        # (adapters.services.adapter_release); the checkpoints stay, a resume point.
        ctx.log("cancelled after the last step, before publication: nothing was published",
                {"checkpoint": summary["latest_checkpoint"]})
        raise
    return {**summary, "adapter_path": str(result.adapter_path), "loaded": adapter.loaded, **activation,
            "post_eval_job_id": str(post_eval_job.uuid) if post_eval_job else None}


def _publish(ctx, payload: GrpoJobPayload, result, content_digest: str, smoke_passed: bool):
    """Register the trained adapter with its receipt, then queue what follows it (activation, the
    gate's evaluation); the caller's transaction makes all of it appear at once or not at all."""
    name, config, receipt = payload.adapter_name, payload.config, result.receipt
    gate_pending = payload.gate_pending
    adapter = adapter_publish(
        name=name, path=result.adapter_path,
        content_sha256=content_digest,
        base_model_sha256=(receipt.get("model") or {}).get("base_model_sha256", ""),
        loaded=False,  # activation is its own decision, after the serving canary (adapters.activation)
    )
    receipt_record(kind=ReceiptKind.TRAIN, subject=name, body=receipt, job=ctx.job)
    count_completed_run(receipt)  # GET /metrics: with the receipt, or not at all
    activation = _auto_load(ctx.job, name) if config.auto_load and smoke_passed and not gate_pending else {}
    post_eval_job = None
    if payload.post_eval is not None:
        from training.post_eval_jobs import post_eval_submit

        post_eval_job = post_eval_submit(training_job=ctx.job, adapter_name=name, post_eval=payload.post_eval,
                                         suite_hash=payload.post_eval_suite_hash or "",
                                         auto_load=bool(config.auto_load and smoke_passed))
    return adapter, activation, post_eval_job


def _write_manifest(folder: Path, *, name: str, content_sha256: str, receipt: dict, job, payload) -> None:
    """adapter_manifest.json next to the weights, bound to the exact train_receipt.json bytes (§2.9)."""
    from adapters.manifest import MANIFEST_FILE, manifest_bytes
    from core.artifacts import write_file

    data = manifest_bytes(folder, name=name, content_sha256=content_sha256,
                          receipt_bytes=(Path(folder) / "train_receipt.json").read_bytes(),
                          base_model_sha256=(receipt.get("model") or {}).get("base_model_sha256"),
                          base_adapter=payload.config.base_adapter, training_job_id=str(job.uuid),
                          admitted_corpus_sha256=payload.training_data.get("admitted_corpus_sha256"))
    write_file(Path(folder) / MANIFEST_FILE, data, mode=0o644)


def _auto_load(job, name: str) -> dict:
    """auto_load without a gate: queue the serving canary and activation; with the approval policy on,
    or a reward-hacking alarm on the train receipt alone (e.g. KL), propose a promotion instead."""
    from adapters.activation import activation_submit
    from adapters.models import Adapter
    from adapters.promotions import approval_required, promotion_alarms, promotion_evidence, promotion_request

    alarms = promotion_alarms(promotion_evidence(adapter=Adapter.objects.get(name=name)))
    if approval_required() or alarms:
        why = "[promotion] require_approval is on" if not alarms else "flagged: " + "; ".join(alarms)
        promotion = promotion_request(candidate=name, user=job.submitted_by, job=job,
                                      reason=f"auto_load after training ({why})")
        return {"promotion_id": promotion.id}
    activation = activation_submit(name=name, reason="auto_load after training (no gate)", job=job)
    return {"activation_job_id": str(activation.uuid)}
