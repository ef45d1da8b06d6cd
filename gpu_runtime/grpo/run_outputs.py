"""What a GRPO run leaves behind: checkpoints, the receipt, the published adapter. Imports no Django.

`RunOutputs` is a mixin of the trainer's run object (`trainer._Run`): it snapshots device state
under the GPU writer and writes files outside it, assembles the spec §2.9 receipt from the run's
ledger and identities, writes the failure receipt (cancellation included) and publishes the
adapter atomically with its receipt inside.
"""

from __future__ import annotations

import contextlib
import math
import time
from pathlib import Path

import torch

from core.artifacts import write_json
from gpu_runtime.grpo import adapter_io, checkpoint
from gpu_runtime.grpo.errors import TrainingError
from gpu_runtime.grpo.receipt import REWARD_FILTER_SIDECAR, build_receipt
from gpu_runtime.grpo.run_support import model_block, tokenizer_block
from gpu_runtime.grpo.train_types import DEFAULT_SMOKE_PROMPTS, TrainResult


class RunOutputs:
    def _checkpoint(self) -> None:
        if self.request.checkpoint_root is None:
            self.checkpoint_errors.append("no checkpoint root configured; checkpoint skipped")
            return
        with self.lock.hold():  # device snapshot: copy every tensor to the CPU
            state = checkpoint.CheckpointState(
                adapter=adapter_io.adapter_state(self.peft),
                optimizer=_to_cpu(self.optimizer.state_dict()),
                reference=None if self.stepper.ema_snapshot is None else _to_cpu(self.stepper.ema_snapshot),
                rng=_to_cpu(checkpoint.capture_rng()),
                loss_history=list(self.ledger.loss_history),
            )
        started = time.perf_counter()
        step = self.ledger.global_step
        ledger_state = self.ledger.state_dict()
        ledger_state.pop("loss_history")
        manifest = {
            "effective_config": self.config.to_dict(),
            "precision_policy": self._precision_policy(),
            "progress": {
                "global_step": step,
                "total_steps": self.total_steps,
                "epoch_index": 0,
                "cursor_in_epoch": self.ledger.groups_done,
                "data_order": self.data_order,
            },
            "data": {
                "source_kind": self.request.source_kind,
                "content_sha256": self.source_sha256,
                "item_count": len(self.request.groups),
            },
            "optimizer": {
                "kind": self.config.optimizer.kind,
                "step": step,
                "hyperparameters": dict(
                    self.config.optimizer.to_dict(), learning_rate=self.config.resolved_learning_rate
                ),
                "state_file": checkpoint.OPTIMIZER_FILE,
            },
            "scheduler": {
                "kind": "constant",
                "step": step,
                "state": {"learning_rate": self.config.resolved_learning_rate},
            },
            "auxiliary_state": {
                "base_model_sha256": self.identity["base_model_sha256"],
                "base_weight_shard_manifest": self.identity["weights_manifest"],
                "tokenizer": self.identity["tokenizer"],
                "planning_identity": {
                    "schema": checkpoint.PLANNING_SCHEMA,
                    "total_steps": self.total_steps,
                    "group_sizes": [len(g.completions) for g in self.encoded],
                    "loss_aggregation": self.config.loss_aggregation,
                },
                "route": self.request.source_kind,
                "base_adapter": self.base_adapter,
                "ledger": ledger_state,
            },
        }
        try:
            path = checkpoint.write_checkpoint(
                self.request.checkpoint_root,
                adapter_name=self.request.adapter_name,
                step=step,
                state=state,
                manifest=manifest,
            )
            self.checkpoints.append(path)
            removed = checkpoint.prune_checkpoints(
                self.request.checkpoint_root, self.request.adapter_name, keep_last=self.config.checkpoint_keep_last,
                protect=self.resume[0] if self.resume else None)
            self.checkpoints = [p for p in self.checkpoints if p not in removed]
            # Job detail names the newest checkpoint while the run goes on, and after a cancel.
            self.on_progress({"step": step, "total_steps": self.total_steps,
                              "progress": step / max(self.total_steps, 1), "latest_checkpoint": str(path)})
        except TrainingError as exc:
            self.checkpoint_errors.append(exc.message)
            self.on_progress({"checkpoint_error": exc.message})  # job detail's checkpoint_error, while it runs
        self.timings["checkpoint_ms"] += (time.perf_counter() - started) * 1000.0

    # ---- finish -----------------------------------------------------------------------------

    def _receipt(
        self, status: str, failure: tuple[str, str] | None, output: dict | None, smoke=None, norms=None
    ):
        request = self.request
        runtime = {
            "wall_clock_ms": round((time.perf_counter() - self.started) * 1000.0, 3),
            "training_precision": self._precision_policy() if self.identity else None,
            "execution_provenance": {
                "device": str(getattr(self, "device", request.device)),
                "torch": torch.__version__,
                **_forward_record(getattr(self, "stepper", None)),
                "forward_path": getattr(getattr(self, "stepper", None), "forward_path", None),
                "base_weights": getattr(self, "base_weights", None),
                "kernels": _kernel_record(getattr(self, "stepper", None), getattr(self, "device", None)),
                "inference_config_sha256": (self.identity or {}).get("inference_config_sha256"),
            },
        }
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            runtime["peak_vram_mib"] = round(torch.cuda.max_memory_allocated(self.device) / 2**20, 1)
        extra = dict(
            self.extra,
            checkpoints=[p.name for p in self.checkpoints],
            checkpoint_errors=list(self.checkpoint_errors),
        )
        return build_receipt(
            adapter_name=request.adapter_name,
            status=status,
            failure=failure,
            config=self.config,
            ledger=self.ledger,
            groups_rewards=self.rewards,
            filter_result=self.filter_result,
            model=model_block(request.model_dir, self.identity),
            tokenizer=tokenizer_block(request.model_dir, self.identity),
            adapters={"base": self.base_adapter, "output": output},
            training_data={
                "source": request.source_kind,
                "path": request.source_path,
                "sha256": getattr(self, "source_sha256", None),
                **(request.source_lineage or {}),
            },
            timings=self.timings,
            runtime=runtime,
            fallbacks=self.fallbacks,
            lora_delta_norms=norms or [],
            smoke_test=smoke,
            extra=extra,
            config_sources=request.config_sources,
            server_training_defaults=request.server_training_defaults,
        )

    def _failure_path(self) -> Path:
        out = Path(self.request.output_dir)
        return Path(self.request.failure_receipt_path or out.parent / f"{out.name}.train_receipt.failed.json")

    def _write_failure(self, reason: str, message: str) -> tuple[dict, Path]:
        norms = adapter_io.lora_delta_norms(self.peft) if self.peft is not None else []
        # A nan_loss run's weights may be inf/NaN: null, so that its receipt is still JSON and is written.
        norms = [dict(n, norm=n["norm"] if math.isfinite(n["norm"]) else None) for n in norms]
        receipt = self._receipt("failed", (reason, message), None, norms=norms)
        path = self._failure_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json(path, receipt)
        return receipt, path

    def _fail(self, error: TrainingError) -> None:
        with contextlib.suppress(Exception):  # never mask the original error
            error.receipt, path = self._write_failure(error.failure_reason, error.message)
            error.receipt_path = str(path)

    def _finish_stopped(self) -> TrainResult:
        receipt, path = self._write_failure(
            "cancelled",
            f"cancelled at a group boundary after step {self.ledger.global_step} of {self.total_steps}",
        )
        return TrainResult(
            None,
            receipt,
            path,
            list(self.checkpoints),
            True,
            self.ledger.global_step,
            self.total_steps,
            self.seed,
            list(self.checkpoint_errors),
        )

    def _publish(self) -> TrainResult:
        config = self.config
        with self.lock.hold():
            smoke = None
            if config.adapter_smoke_test:
                prompts = config.adapter_smoke_prompts or DEFAULT_SMOKE_PROMPTS
                smoke = adapter_io.adapter_smoke_test(
                    self.peft, self.tokenizer, prompts, template_kwargs=self.request.template_kwargs
                )
            norms = adapter_io.lora_delta_norms(self.peft)
        staged = adapter_io.StagedAdapter.save(self.peft, self.request.output_dir)
        receipt = self._receipt("success", None, staged.identity, smoke=smoke, norms=norms)
        files = {"train_receipt.json": receipt}
        if self.filter_result.reward_filter_enabled:  # each group's fate, beside the receipt that names it
            receipt["data"]["reward_filter_sidecar"] = REWARD_FILTER_SIDECAR
            files[REWARD_FILTER_SIDECAR] = {
                "schema": "kiln.reward-filter-groups.v1",
                "groups": [vars(d) for d in self.filter_result.decisions],
            }
        path = staged.publish(files)
        return TrainResult(
            path,
            receipt,
            path / "train_receipt.json",
            list(self.checkpoints),
            False,
            self.ledger.global_step,
            self.total_steps,
            self.seed,
            list(self.checkpoint_errors),
        )


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_cpu(v) for v in value)
    return value


def _kernel_record(stepper, device) -> dict | None:
    """The kernel selection (backend, what was asked, why it fell back) and where it applied."""
    if stepper is None:
        if device is None:
            return None
        from gpu_runtime.kernels import selection

        return selection.choose(device).to_record()
    record = stepper.kernels.to_record()
    fused = stepper.kernels.triton
    record["applied"] = {
        # The fused head needs the lean forward's hidden states; the transformers forward keeps logits.
        "linear_logprobs": fused and stepper.lean_policy is not None,
        "token_loss": fused,
    }
    return record


def _forward_record(stepper) -> dict:
    """How the forwards ran: the KL reference's path for the groups that ran one (`reference_path`),
    how many groups reused their recorded behavior log-probs instead (`reference_path` is
    "recorded_behavior" when every group did), and how many steps ran in micro-batches."""
    if stepper is None:
        return {"reference_path": None}
    reused = stepper.reference_reused_groups
    path = stepper.reference_path or ("recorded_behavior" if reused else None)
    # Steps whose completions ran in micro-batches (the step's maths is unchanged; see GroupStepper).
    plan = stepper.lean_policy
    # Whether the lean forward's q|k|v and gate|up ran over oneDNN-packed weights (gpu_runtime.onednn_linear).
    packed = None if plan is None else {"packed": plan.packing_problem is None, "reason": plan.packing_problem}
    return {"reference_path": path, "reference_reused_groups": reused,
            "micro_batched_steps": stepper.micro_batched_steps, "packed_matmul": packed}
