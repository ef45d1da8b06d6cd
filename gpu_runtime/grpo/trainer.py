"""The GRPO training loop behind POST /v1/train/grpo: `train_grpo(TrainRequest) -> TrainResult`. Imports no Django.

One call trains one LoRA adapter on scored groups and publishes it atomically with its
`train_receipt.json`. Stages (GPU-writer ownership in brackets):
  prepare   tokenizer + identities, group checks, reward filters, recorded-provenance checks,
            tokenization, checkpoint verification, weights read into CPU memory  (no writer)
  setup     model to the device, attach LoRA (seeded), warm start, optimizer, behavior
            replay, restore a checkpoint                                  [writer]
  loop      per optimizer group: reference forward, policy forward, loss, backward, step
                                                                          [writer, once per group]
            progress callback, cancellation check                         (no writer)
            checkpoint every N groups and on cancellation: tensor snapshot [writer], files (no writer)
  finish    adapter smoke test + LoRA norms [writer]; save, receipt, atomic rename (no writer)
Every run that gets past request parsing writes a receipt: inside the adapter on success,
at `failure_receipt_path` otherwise (cancellation included; `TrainResult.stopped` is then True).
Errors are `TrainingError`s with stable codes; the failure receipt is attached to them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch

from core.contracts.grpo_config import resolve_effective_seed
from core.errors import DISK_FULL_CODE, DISK_FULL_HINT, is_disk_full, space_exhausted_error
from gpu_runtime import lean_decoder
from gpu_runtime.grpo import adapter_io, checkpoint
from gpu_runtime.grpo.advantages import filter_groups, filter_kwargs
from gpu_runtime.grpo.encoding import check_groups, encode_groups, group_rewards
from gpu_runtime.grpo.errors import StopRequested, TrainingError
from gpu_runtime.grpo.receipt import RunLedger
from gpu_runtime.grpo.recorded import replay_behavior_logprobs, verify_recorded_groups
from gpu_runtime.grpo.run_outputs import RunOutputs
from gpu_runtime.grpo.run_support import (
    WriterLock,
    dataset_sha256,
    load_tokenizer_and_identity,
    resolve_device,
)
from gpu_runtime.grpo.step import GroupStepper, build_optimizer
from gpu_runtime.grpo.train_types import TrainRequest, TrainResult

__all__ = ["TrainRequest", "TrainResult", "train_grpo"]


def train_grpo(
    request: TrainRequest,
    *,
    on_progress: Callable[[dict], None],
    should_stop: Callable[[], bool],
    gpu_writer: Callable[[], AbstractContextManager] | None = None,
) -> TrainResult:
    return _Run(request, on_progress, should_stop, gpu_writer).execute()


class _Run(RunOutputs):
    def __init__(self, request: TrainRequest, on_progress, should_stop, gpu_writer):
        self.request = request
        self.on_progress = on_progress
        self.should_stop = should_stop
        self.timings: dict[str, Any] = {
            key: 0.0
            for key in (
                "tokenize_ms",
                "mask_build_ms",
                "reference_forward_ms",
                "policy_forward_ms",
                "backward_ms",
                "optimizer_ms",
                "checkpoint_ms",
            )
        }
        self.lock = WriterLock(gpu_writer, self.timings)
        self.config = request.config
        self.ledger = RunLedger()
        self.fallbacks: list[dict] = []
        self.checkpoints: list[Path] = []
        self.checkpoint_errors: list[str] = []
        self.started = time.perf_counter()
        self.identity: dict | None = None
        self.tokenizer = None
        self.rewards = None
        self.filter_result = None
        self.encoded: list = []
        self.total_steps = 0  # known once the corpus is encoded (a stop may come before)
        self.peft = None
        self.extra: dict[str, Any] = {}
        self.base_adapter = None
        self.resume = None
        self.cpu_model = None
        self.base_weights: str | None = None  # shared_with_sampler | read_from_disk
        self.shared_base_unusable: str | None = None  # why request.shared_base cannot be used, if so

    # ---- driver -----------------------------------------------------------------------------

    def execute(self) -> TrainResult:
        try:
            self._prepare()
            # Reading and encoding a large corpus takes minutes: a stop (cancel, kiln serve shutting
            # down) that came meanwhile ends the run here, within the worker's shutdown grace.
            if self.should_stop():
                return self._finish_stopped()
            with self.lock.hold():
                self._setup()
            if self._loop():
                return self._finish_stopped()
            return self._publish_or_disk_full()
        except StopRequested:  # seen inside the corpus checks, the encoding or the behavior replay
            return self._finish_stopped()
        except TrainingError as exc:
            self._fail(exc)
            raise
        except torch.OutOfMemoryError as exc:
            error = TrainingError("oom", f"out of memory: {exc}", failure_reason="oom")
            self._fail(error)
            raise error from exc
        except Exception as exc:  # noqa: BLE001 - every failure leaves a receipt
            if is_disk_full(exc):
                error = TrainingError(DISK_FULL_CODE, f"the disk is full: {type(exc).__name__}: {exc}",
                                      failure_reason="disk_full", hint=DISK_FULL_HINT)
            else:
                error = TrainingError("training_error", f"{type(exc).__name__}: {exc}")
            self._fail(error)
            raise error from exc

    def _publish_or_disk_full(self) -> TrainResult:
        """Publish; a failed write on a nearly full disk is the disk being full (a short write need
        not say so), so the job gets the disk-full code and hint, not training_error."""
        try:
            return self._publish()
        except (OSError, RuntimeError) as exc:
            if isinstance(exc, torch.OutOfMemoryError):
                raise  # the device's memory, not the disk
            full = space_exhausted_error(exc, Path(self.request.output_dir).parent)
            if full is not None:
                raise full from exc
            raise

    # ---- prepare (no writer) ----------------------------------------------------------------

    def _prepare(self) -> None:
        request = self.request
        self.config = self.config.with_seed(resolve_effective_seed(self.config))
        self.seed = self.config.seed
        self.device, self.dtype = resolve_device(request.device, self.fallbacks)
        if Path(request.output_dir).exists():
            raise TrainingError("adapter_already_exists", f"{request.output_dir} already exists")
        shared = request.shared_base
        self.shared_base_unusable = shared.unusable_for(request.model_dir, self.device, self.dtype) if shared else None
        known_identity = request.model_identity
        if known_identity is None and shared is not None and self.shared_base_unusable is None:
            known_identity = shared.identity  # hashed when the sampler loaded these very tensors
        self.tokenizer, self.identity = load_tokenizer_and_identity(
            request.model_dir, self.device, self.dtype, known_identity=known_identity
        )
        if request.base_adapter_dir is not None:
            if not (Path(request.base_adapter_dir) / "adapter_config.json").is_file():
                raise TrainingError(
                    "base_adapter_missing",
                    f"base adapter {request.base_adapter_dir} does not exist",
                    failure_reason="base_adapter_missing",
                )
            self.base_adapter = {
                "name": request.base_adapter_name,
                **adapter_io.adapter_identity(request.base_adapter_dir),
            }
        check_groups(request.groups)
        self.source_sha256 = request.source_sha256 or dataset_sha256(request.groups)
        self.rewards = group_rewards(request.groups)
        self.filter_result = filter_groups(self.rewards, **filter_kwargs(self.config))
        if self.filter_result.failure_message:
            raise TrainingError(
                "zero_groups", self.filter_result.failure_message, failure_reason="zero_groups"
            )
        kept = list(self.filter_result.kept_indices)
        if not kept and not self.filter_result.skip_training:
            raise TrainingError(
                "zero_groups",
                f"all {len(self.rewards)} group(s) were filtered (dynamic sampling dropped "
                f"{self.filter_result.dynamic_groups_filtered} with all-equal rewards)",
                failure_reason="zero_groups",
            )
        if self.config.behavior_policy == "recorded":
            base = (
                None
                if self.base_adapter is None
                else {"content_sha256": self.base_adapter["adapter_model_sha256"]}
            )
            summary = verify_recorded_groups(
                request.groups, self.tokenizer, self.identity, base, template_kwargs=request.template_kwargs,
                should_stop=self.should_stop,
            )
            self.extra["recorded_admission"] = summary.to_dict()
        self.encoded = encode_groups(
            request.groups,
            kept,
            self.tokenizer,
            self.config,
            template_kwargs=request.template_kwargs,
            timings=self.timings,
            should_stop=self.should_stop,
        )
        per_sample = self.config.loss_aggregation == "per_sample"
        self.total_steps = sum(len(g.completions) if per_sample else 1 for g in self.encoded)
        self.data_order = kept
        self.interval = request.checkpoint_interval or self.config.checkpoint_interval
        resume_dir = request.resume_checkpoint_dir
        if resume_dir is None and self.config.resume_checkpoint:
            if request.checkpoint_root is None:
                raise TrainingError("checkpoint_not_found", "resume_checkpoint needs a checkpoint root")
            resume_dir = checkpoint.resolve_checkpoint(request.checkpoint_root, self.config.resume_checkpoint)
        if resume_dir is not None:
            manifest, state = checkpoint.load_checkpoint(resume_dir)
            checkpoint.check_resumable(
                manifest,
                adapter_name=request.adapter_name,
                source_kind=request.source_kind,
                content_sha256=self.source_sha256,
                effective_config=self.config.to_dict(),
                base_model_sha256=self.identity["base_model_sha256"],
                tokenizer=self.identity["tokenizer"],
                precision_policy=self._precision_policy(),
                data_order=self.data_order,
            )
            self.resume = (Path(resume_dir), manifest, state)
        self.cpu_model = self._read_weights()  # file I/O stays outside the GPU writer

    def _read_weights(self):
        shared = self.request.shared_base
        if shared is not None:
            if self.shared_base_unusable is None:
                self.base_weights = "shared_with_sampler"
                return shared.fresh_model()
            self.fallbacks.append({"capability": "shared_base_weights", "fallback": "read_from_disk",
                                   "reason": self.shared_base_unusable})
        self.base_weights = "read_from_disk"
        return self._weights_from_disk()

    def _weights_from_disk(self):
        from transformers import AutoModelForCausalLM

        from gpu_runtime.model_loading import ATTN_IMPLEMENTATION

        try:
            return AutoModelForCausalLM.from_pretrained(
                self.request.model_dir,
                local_files_only=True,
                dtype=self.dtype,
                attn_implementation=ATTN_IMPLEMENTATION,
            )
        except Exception as exc:  # noqa: BLE001 - corrupt weights, unknown architecture
            raise TrainingError(
                "model_load_failed", f"model {self.request.model_dir} failed to load: {exc}"
            ) from exc

    def _precision_policy(self) -> dict:
        return {
            "parameter_dtype": "float32",
            "optimizer_state_dtype": "float32",
            "activation_dtype": str(self.dtype).removeprefix("torch."),
            "gradient_dtype": "float32",
            "stochastic_rounding": False,
        }

    # ---- setup [writer] ---------------------------------------------------------------------

    def _setup(self) -> None:
        request, config = self.request, self.config
        torch.manual_seed(self.seed % (1 << 63))
        model, self.cpu_model = self.cpu_model.to(self.device), None
        model.eval()  # no dropout anywhere: a step is a function of the seed and the data
        if config.grad_checkpoint_segments and lean_decoder.unsupported_reason(model) is not None:
            # The lean forward checkpoints in the requested segments; transformers cannot.
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
            self.fallbacks.append(
                {
                    "capability": "grad_checkpoint_segments",
                    "fallback": "per_layer_checkpointing",
                    "reason": "transformers checkpoints every decoder layer; segment counts are not honoured",
                }
            )
        self.peft = adapter_io.attach_lora(
            model, rank=config.lora_rank, alpha=config.lora_alpha, target_modules=request.lora_target_modules
        )
        if request.base_adapter_dir is not None:
            adapter_io.load_base_adapter(
                self.peft,
                request.base_adapter_dir,
                rank=config.lora_rank,
                alpha=config.lora_alpha,
                target_modules=request.lora_target_modules,
            )
        params = adapter_io.trainable_parameters(self.peft)
        self.optimizer = build_optimizer(params, config)
        ema = adapter_io.adapter_state(self.peft) if config.kl_reference_policy.kind == "ema" else None
        if config.behavior_policy == "recorded" and request.replay_recorded_behavior:
            with torch.no_grad():  # the initial policy is the behavior policy: replay it now
                self.extra["recorded_behavior_replay"] = replay_behavior_logprobs(
                    self.peft, self.encoded, self.identity["inference_config_sha256"], should_stop=self.should_stop
                )
        if self.resume is not None:
            path, manifest, state = self.resume
            adapter_io.restore_adapter_state(self.peft, state.adapter)
            self.optimizer.load_state_dict(state.optimizer)
            if ema is not None:
                ema = {k: v.to(self.device) for k, v in state.reference.items()}
            checkpoint.restore_rng(state.rng)
            ledger_state = dict(manifest["auxiliary_state"]["ledger"], loss_history=state.loss_history)
            self.ledger = RunLedger.from_state(ledger_state)
            self.extra["resumed_from"] = {
                "checkpoint": path.name,
                "checkpoint_id": manifest["checkpoint_id"],
                "global_step": manifest["progress"]["global_step"],
            }
            # the job's live curves start from the restored history, as the receipt's does
            self.on_progress({"restored_loss_history": list(self.ledger.loss_history)})
        elif ema is not None:
            ema = {k: v.to(self.device) for k, v in ema.items()}
        self.stepper = GroupStepper(
            self.peft,
            self.optimizer,
            config,
            pad_id=self._pad_id(),
            timings=self.timings,
            fallbacks=self.fallbacks,
            ema_snapshot=ema,
            behavior_reference_sha256=self._behavior_reference_sha256(),
        )

    def _behavior_reference_sha256(self) -> str | None:
        """The inference digest under which recorded behavior log-probs may stand in for the KL
        reference's (see `GroupStepper`): only when the behavior policy is the reference itself."""
        config = self.config
        eligible = (
            config.behavior_policy == "recorded"
            and config.kl_reference_policy.kind == "base_per_step"
            and self.request.base_adapter_dir is None
            and self.dtype == torch.float32
        )
        return self.identity["inference_config_sha256"] if eligible else None

    def _pad_id(self) -> int:
        tok = self.tokenizer
        return int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    # ---- loop -------------------------------------------------------------------------------

    def _loop(self) -> bool:
        """Train the remaining groups; True when cancelled with groups left."""
        config = self.config
        if self.encoded and self.ledger.groups_done < len(self.encoded) and self.should_stop():
            return True
        for position in range(self.ledger.groups_done, len(self.encoded)):
            group = self.encoded[position]
            before = self.ledger.global_step
            with self.lock.hold(), torch.autograd.set_detect_anomaly(config.detect_anomaly):
                records = self.stepper.run(group)
                self._refresh_ema(before, before + len(records))
            figures = self.ledger.observe_group(
                group, records, elapsed_secs=time.perf_counter() - self.started, total_steps=self.total_steps
            )
            done = self.ledger.groups_done
            self.on_progress(
                {
                    "step": self.ledger.global_step,
                    "total_steps": self.total_steps,
                    "progress": self.ledger.global_step / max(self.total_steps, 1),
                    "groups_done": done,
                    "groups_total": len(self.encoded),
                    "group_index": group.index,
                    "kept_groups": len(self.encoded),
                    "filtered_groups": len(self.rewards) - len(self.encoded),
                    "elapsed_secs": round(time.perf_counter() - self.started, 3),
                    **figures,
                }
            )
            remaining = done < len(self.encoded)
            stop = remaining and self.should_stop()
            if (self.interval and done % self.interval == 0) or stop:
                self._checkpoint()
            if stop:
                return True
        return False

    def _refresh_ema(self, before: int, after: int) -> None:
        policy = self.config.kl_reference_policy
        if policy.kind != "ema" or after // policy.refresh_every == before // policy.refresh_every:
            return
        with torch.no_grad():
            for name, p in adapter_io.trainable_parameters(self.peft):
                snap = self.stepper.ema_snapshot[name]
                snap.mul_(policy.decay).add_(p.detach(), alpha=1.0 - policy.decay)
