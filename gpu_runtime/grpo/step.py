"""One GRPO optimizer group on the GPU: reference forward, policy forward, loss, backward, step. Imports no Django.

`GroupStepper.run(group)` does spec §3.1 steps 3-7 for one encoded group and returns the step
records (one per optimizer step: one for `token_level`, one per completion for `per_sample`).

Reference log-probs (only when the KL term reaches the loss):
- `base_per_step`: the base model, i.e. the PEFT model inside `disable_adapter()`;
- `ema`: the LoRA snapshot swapped into the adapter tensors for the forward, then swapped back.
No forward runs for a recorded group sampled from the base model itself at temperature 1 with no
filter or penalty, when training starts from the base and the reference is the base: its recorded
behavior log-probs are the reference's log-probs (a run's first round; receipts count such groups).
With `shared_prefix_reference` the prompt runs once and the completions attend to its keys and
values; where that capability is missing (no cache support, no shared prefix) the exact batched
forward (the same computation as the policy forward) runs instead and the fallback is recorded.

Forwards take the lean path (`gpu_runtime.lean_decoder`: the same weights, no per-call
transformers bookkeeping) when the model has a supported shape, else the transformers forward
(the fallback and its reason go to the receipt). On the lean path the policy forward shares the
group's prompt the same way the reference does, so both forwards have one layout: a fresh
adapter's KL is exactly zero, and the prompt's activations are computed once, not once per
completion (its gradient flows back through the shared keys and values).

On the CPU a token_level step whose activations would pass MICRO_BATCH_ACTIVATIONS runs its
completions in micro-batches (forward, loss over the step's token count, backward), the gradients
accumulating into one optimizer step: the same step, in a fraction of the memory.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from gpu_runtime import lean_decoder
from gpu_runtime.grpo.adapter_io import trainable_parameters
from gpu_runtime.grpo.errors import TrainingError
from gpu_runtime.grpo.flat_optim import FlatAdamW, FlatParameters, FlatSGD, flat_layout_supported
from gpu_runtime.grpo.losses import GrpoBatch, grpo_loss, merge_step_stats
from gpu_runtime.grpo.recorded import behavior_is_reference
from gpu_runtime.grpo.reference import shared_prefix_reference_logprobs
from gpu_runtime.kernels import selection

# The most activations (tokens x hidden size x layers) one policy forward keeps for its backward on
# the CPU. Past this the saved activations are gigabytes of fresh memory that the kernel hands over
# page by page, which cost more than the arithmetic (a q25m 32 x 256 forward: 11-12 s at once, 4.0-4.8 s
# in micro-batches of 4-8 completions; docs/performance.md); the step then runs its completions in
# micro-batches within it, whose activations reuse each other's memory.
MICRO_BATCH_ACTIVATIONS = 2**23

NAN_LOSS_HINT = ("lower config.learning_rate (null picks the optimizer's default for the LoRA scale), and check "
                 "that the rewards are finite and of a sane scale")


def nan_loss(message: str) -> TrainingError:
    """The run's failure when the loss, the gradient or the weights stop being finite (spec §2.9 nan_loss)."""
    return TrainingError("nan_loss", message, failure_reason="nan_loss", hint=NAN_LOSS_HINT)


@dataclass
class GroupTensors:
    ids: torch.Tensor  # (B, T) right-padded
    attention: torch.Tensor  # (B, T)
    lengths: list[int]
    action_mask: torch.Tensor  # (B, T) bool
    env_mask: torch.Tensor | None
    observation_lengths: torch.Tensor | None
    behavior: torch.Tensor | None  # (B, T) recorded log-probs (0 elsewhere)
    advantages: torch.Tensor  # (B,)
    start: int  # first trained position over the group (>= 1)
    # (B,) recorded sampling temperatures the policy and reference log-probs are taken at (None: 1)
    temperatures: torch.Tensor | None = None


def recorded_temperatures(items) -> list[float] | None:
    """Each completion's recorded sampling temperature, or None when every one is 1 (or unrecorded).

    Under `recorded` the ratio is pi_theta / pi_behavior, and the behavior log-probs are those of
    the tempered distribution the sampler drew from; the policy is read at the same temperature, as
    TRL and verl do, so a fresh adapter's ratio on its own samples is exactly 1 instead of being
    clipped as if the data were off-policy. Greedy rows (temperature 0) keep 1: their records are
    one-hot and a zero temperature has no log-probs.
    """
    temps = []
    for item in items:
        sampling = (item.provenance or {}).get("sampling") or {}
        value = float(sampling.get("temperature", 1.0) or 1.0)
        temps.append(value if value > 0 else 1.0)
    return None if all(t == 1.0 for t in temps) else temps


def group_tensors(group, *, device, pad_id: int, recorded: bool, with_env: bool) -> GroupTensors:
    items = group.completions
    width = max(len(c.input_ids) for c in items)
    b = len(items)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attention = torch.zeros((b, width), dtype=torch.long)
    action = torch.zeros((b, width), dtype=torch.bool)
    env = torch.zeros((b, width), dtype=torch.bool)
    behavior = torch.zeros((b, width), dtype=torch.float32) if recorded else None
    temperatures = recorded_temperatures(items) if recorded else None
    for row, item in enumerate(items):
        n = len(item.input_ids)
        ids[row, :n] = torch.tensor(item.input_ids)
        attention[row, :n] = 1
        action[row, item.action_positions] = True
        if item.env_positions:
            env[row, item.env_positions] = True
        if behavior is not None and item.behavior:
            positions = sorted(item.behavior)
            behavior[row, positions] = torch.tensor([item.behavior[p] for p in positions])
    trained = [p for c in items for p in (c.action_positions[:1] + c.env_positions[:1])]
    has_env = bool(env.any()) and with_env
    return GroupTensors(
        ids=ids.to(device),
        attention=attention.to(device),
        lengths=[len(c.input_ids) for c in items],
        action_mask=action.to(device),
        env_mask=env.to(device) if has_env else None,
        observation_lengths=torch.tensor([c.observation_tokens for c in items], device=device)
        if has_env
        else None,
        behavior=behavior.to(device) if behavior is not None else None,
        advantages=torch.tensor(group.advantages, dtype=torch.float32, device=device),
        start=max(1, min(trained)) if trained else 1,
        temperatures=None if temperatures is None else torch.tensor(temperatures, device=device),
    )


def sequence_logprobs(
    model,
    ids: torch.Tensor,
    attention: torch.Tensor,
    start: int,
    *,
    keep_logits: bool = True,
    temperatures: torch.Tensor | None = None,
):
    """(B, T) log p(ids[t] | ids[<t]) for t >= start (0 before), from logits of positions >= start-1
    only (`logits_to_keep`), so the prompt's vocabulary projections are never materialised.
    `temperatures` (B,) divide each row's logits."""
    t = ids.shape[1]
    keep = t - start + 1
    if keep_logits:
        logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=keep).logits
    else:
        logits = model(input_ids=ids, attention_mask=attention).logits[:, start - 1 :]
    logits = logits[:, :-1]
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    if temperatures is not None:
        logits = logits / temperatures.to(logits.dtype)[:, None, None]
    targets = ids[:, start:].unsqueeze(-1)
    selected = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return torch.cat([selected.new_zeros(ids.shape[0], start), selected], dim=1)


@dataclass
class StepRecord:
    stats: dict
    grad_norm: float
    completions: int


@dataclass
class GroupStepper:
    model: object  # PeftModel
    optimizer: torch.optim.Optimizer
    config: object  # GrpoConfig
    pad_id: int
    timings: dict = field(default_factory=dict)
    fallbacks: list = field(default_factory=list)
    ema_snapshot: dict | None = None  # name -> tensor (kl_reference_policy ema)
    keep_logits: bool = True
    reference_path: str | None = None  # "shared_prefix" | "batched" once a reference forward ran
    # The trainer's inference-config digest when a group's recorded behavior log-probs may serve as
    # its reference log-probs (recorded behavior, base-model reference, training from the base, float32);
    # `recorded.behavior_is_reference` then decides group by group.
    behavior_reference_sha256: str | None = None
    reference_reused_groups: int = 0
    micro_batched_steps: int = 0  # optimizer steps whose completions ran in several micro-batches
    forward_path: str = "lean"  # or "transformers"

    def __post_init__(self) -> None:
        self.device = next(self.model.parameters()).device
        # Triton kernels (fused LM-head log-probs, fused token loss) or the torch path.
        self.kernels = selection.choose(self.device)
        self.head = None
        if self.kernels.triton:
            from gpu_runtime.kernels.lm_head import fused_lm_logprobs

            self.head = fused_lm_logprobs
        elif self.kernels.requested == "triton":
            self._fallback("triton_kernels", "torch", self.kernels.fallback_reason)
        self.params = trainable_parameters(self.model)
        self.grad_tensors = [p for _, p in self.params]
        # Plans reference the live tensors: optimizer steps and EMA swaps need no re-planning.
        self.lean_policy = self.lean_base = None
        try:
            self.lean_policy = lean_decoder.plan_for(self.model)
            with self.model.disable_adapter():
                self.lean_base = lean_decoder.plan_for(self.model)
        except lean_decoder.LeanUnsupported as exc:
            self.lean_policy = None
            self.forward_path = "transformers"
            self._fallback("lean_forward", "transformers_forward", str(exc))

    def _prefix(self, ids: torch.Tensor, lengths: list[int]) -> int:
        """Tokens every row shares at the start (0 when prefix sharing is off or impossible)."""
        if not self.config.shared_prefix_reference:
            return 0
        return lean_decoder.shared_prefix(ids, lengths)

    def _time(self, key: str, started: float) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.timings[key] = self.timings.get(key, 0.0) + (time.perf_counter() - started) * 1000.0

    def _fallback(self, capability: str, fallback: str, reason: str) -> None:
        if not any(f["capability"] == capability for f in self.fallbacks):
            self.fallbacks.append({"capability": capability, "fallback": fallback, "reason": reason})

    def _policy_logprobs(self, ids, attention, start, lengths, temperatures=None):
        if self.lean_policy is not None:
            return lean_decoder.sequence_logprobs(
                self.lean_policy,
                ids,
                start,
                prefix=self._prefix(ids, lengths),
                checkpoint_segments=self.config.grad_checkpoint_segments or 0,
                head=self.head,
                temperatures=temperatures,
            )
        if self.keep_logits:
            try:
                return sequence_logprobs(self.model, ids, attention, start, temperatures=temperatures)
            except TypeError as exc:  # a model without logits_to_keep
                self.keep_logits = False
                self._fallback(
                    "logits_to_keep", "full_logits", f"the model forward rejects logits_to_keep: {exc}"
                )
        return sequence_logprobs(self.model, ids, attention, start, keep_logits=False, temperatures=temperatures)

    @contextmanager
    def _reference_policy(self):
        """The KL reference: the base model (adapter disabled) or the EMA snapshot."""
        if self.config.kl_reference_policy.kind != "ema":
            if self.lean_policy is not None:  # the lean base plan already leaves the adapter out
                yield
                return
            with self.model.disable_adapter():
                yield
            return
        saved = [p.detach().clone() for _, p in self.params]
        with torch.no_grad():
            for name, p in self.params:
                p.copy_(self.ema_snapshot[name])
        try:
            yield
        finally:
            with torch.no_grad():
                for (_, p), value in zip(self.params, saved, strict=True):
                    p.copy_(value)

    @torch.no_grad()
    def reference_logprobs(self, tensors: GroupTensors, group=None) -> torch.Tensor:
        started = time.perf_counter()
        if (
            group is not None
            and self.behavior_reference_sha256 is not None
            and behavior_is_reference(group, self.behavior_reference_sha256)
        ):
            # Sampled from the reference itself at temperature 1, unfiltered: the sampler already
            # computed these log-probs, and a forward would recompute them to float rounding.
            self.reference_reused_groups += 1
            out = tensors.behavior * tensors.action_mask
            self._time("reference_forward_ms", started)
            return out
        prefix = self._prefix(tensors.ids, tensors.lengths)
        if self.config.shared_prefix_reference and prefix < 1:
            self._fallback("shared_prefix_reference", "batched_forward", "the group's sequences share no prefix")
        with self._reference_policy():
            out = None
            if self.lean_policy is not None:
                plan = self.lean_policy if self.config.kl_reference_policy.kind == "ema" else self.lean_base
                out = lean_decoder.sequence_logprobs(
                    plan, tensors.ids, tensors.start, prefix=prefix, head=self.head, temperatures=tensors.temperatures
                )
                self.reference_path = "shared_prefix" if prefix else "batched"
            elif prefix and self.reference_path != "batched" and tensors.temperatures is None:
                seqs = [row[:n].tolist() for row, n in zip(tensors.ids, tensors.lengths, strict=True)]
                try:
                    out = shared_prefix_reference_logprobs(self.model, seqs)
                    self.reference_path = "shared_prefix"
                except (AttributeError, KeyError, TypeError, NotImplementedError) as exc:
                    self.reference_path = "batched"
                    self._fallback(
                        "shared_prefix_reference",
                        "batched_forward",
                        f"the model's KV cache cannot be shared: {exc}",
                    )
            if out is None:
                self.reference_path = self.reference_path or "batched"
                out = self._policy_logprobs(
                    tensors.ids, tensors.attention, tensors.start, tensors.lengths, tensors.temperatures
                )
            out = out * tensors.attention  # zero past each end, whichever layout computed it
        self._time("reference_forward_ms", started)
        width = tensors.ids.shape[1]
        if out.shape[1] < width:
            out = torch.nn.functional.pad(out, (0, width - out.shape[1]))
        return out.float()

    def run(self, group) -> list[StepRecord]:
        config = self.config
        tensors = group_tensors(
            group,
            device=self.device,
            pad_id=self.pad_id,
            recorded=config.behavior_policy == "recorded",
            with_env=config.loss.echo_enabled,
        )
        reference = self.reference_logprobs(tensors, group) if config.kl_term_active else None
        if config.loss_aggregation == "per_sample":
            rows = [[i] for i in range(len(tensors.lengths))]
        else:
            rows = [list(range(len(tensors.lengths)))]
        return [self._step(tensors, reference, r) for r in rows]

    def _step(self, tensors: GroupTensors, reference, rows: list[int]) -> StepRecord:
        """One optimizer step over `rows`: forward, loss and backward a micro-batch of completions at
        a time (`_micro_batches`), the gradients accumulating, then one optimizer step."""
        parts = self._micro_batches(tensors, rows)
        self.micro_batched_steps += len(parts) > 1
        self.optimizer.zero_grad(set_to_none=True)
        # Parts divide by the step's action tokens; one part by its own, as an unsplit step does.
        divisor = int(tensors.action_mask[rows].sum()) if len(parts) > 1 else None
        stats_parts = []
        for part in parts:
            loss, stats = self._forward_and_loss(tensors, reference, part, divisor)
            if not torch.isfinite(loss):
                raise nan_loss(f"the loss is {loss.item()} (not finite)")
            started = time.perf_counter()
            loss.backward()
            self._time("backward_ms", started)
            stats_parts.append(stats)
        stats = stats_parts[0] if len(stats_parts) == 1 else merge_step_stats(stats_parts)
        started = time.perf_counter()
        grad_norm = self._grad_norm()
        if grad_norm != grad_norm or grad_norm == float("inf"):
            raise nan_loss("the gradient is not finite")
        self.optimizer.step()  # gradients are cleared before the next backward
        # A step this large (a huge learning rate) leaves inf/NaN weights: the next step's loss would
        # be NaN, and after the last step the run would publish them (their norms are not even JSON).
        if not self._weights_finite():
            raise nan_loss(f"the optimizer step at learning_rate {self.config.resolved_learning_rate:g} made the "
                           "adapter's weights non-finite")
        self._time("optimizer_ms", started)
        return StepRecord(stats=stats, grad_norm=grad_norm, completions=len(rows))

    def _micro_batches(self, tensors: GroupTensors, rows: list[int]) -> list[list[int]]:
        """`rows` split into micro-batches whose activations stay within MICRO_BATCH_ACTIVATIONS
        (tokens x hidden size x layers), as evenly as possible; one part when they fit, off the lean
        forward, on an accelerator (its caching allocator reuses memory) or under per_sample."""
        plan = self.lean_policy
        if (
            plan is None
            or self.device.type != "cpu"
            or self.config.loss_aggregation != "token_level"
            or len(rows) < 2
        ):
            return [rows]
        per_token = plan.embed.shape[1] * len(plan.layers)
        width = max(tensors.lengths[r] for r in rows)
        fits = max(1, MICRO_BATCH_ACTIVATIONS // (per_token * width))
        count = -(-len(rows) // fits)
        size = -(-len(rows) // count)
        return [rows[i : i + size] for i in range(0, len(rows), size)]

    def _forward_and_loss(self, tensors: GroupTensors, reference, rows: list[int], token_total: int | None):
        index = torch.tensor(rows, device=self.device)
        width = max(tensors.lengths[r] for r in rows)

        def pick(t):
            return None if t is None else t.index_select(0, index)[:, :width]

        ids, attention = pick(tensors.ids), pick(tensors.attention)
        started = time.perf_counter()
        temperatures = None if tensors.temperatures is None else tensors.temperatures.index_select(0, index)
        policy = self._policy_logprobs(ids, attention, tensors.start, [tensors.lengths[r] for r in rows], temperatures)
        self._time("policy_forward_ms", started)
        batch = GrpoBatch(
            policy_logprobs=policy,
            action_mask=pick(tensors.action_mask),
            advantages=tensors.advantages.index_select(0, index),
            behavior_logprobs=pick(tensors.behavior),
            reference_logprobs=pick(reference),
            env_mask=pick(tensors.env_mask),
            observation_lengths=None
            if tensors.observation_lengths is None
            else tensors.observation_lengths.index_select(0, index),
            token_total=token_total,
        )
        return grpo_loss(batch, self.config, kernels=self.kernels)

    def _weights_finite(self) -> bool:
        """Whether every trainable tensor is finite, with one host sync (not one per tensor)."""
        flat = getattr(self.optimizer, "flat", None)  # the flat optimizers hold every value in one buffer
        tensors = [flat.values] if flat is not None else self.grad_tensors
        return not tensors or bool(torch.stack([torch.isfinite(t).all() for t in tensors]).all())

    def _grad_norm(self) -> float:
        flat_norm = getattr(self.optimizer, "grad_norm", None)
        if flat_norm is not None:
            return flat_norm()
        grads = [p.grad for p in self.grad_tensors if p.grad is not None]
        return float(torch.nn.utils.get_total_norm(grads, foreach=True)) if grads else 0.0


def build_optimizer(params, config) -> torch.optim.Optimizer:
    """AdamW, SGD or Muon (torch.optim.Muon, Keller's lr adjustment) per GrpoConfig.optimizer."""
    opt = config.optimizer
    lr = config.resolved_learning_rate
    tensors = [p for _, p in params]
    # AdamW and SGD run over one flat buffer of every LoRA tensor (flat_optim.py): a few kernels
    # a step instead of several per tensor. Muon orthogonalises each matrix, so it stays per tensor.
    if opt.kind in ("adam_w", "sgd") and flat_layout_supported(tensors):
        flat = FlatParameters(tensors)
        if opt.kind == "sgd":
            return FlatSGD(flat, lr=lr)
        return FlatAdamW(
            flat, lr=lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, weight_decay=opt.weight_decay
        )
    if opt.kind == "adam_w":
        return torch.optim.AdamW(
            tensors, lr=lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, weight_decay=opt.weight_decay
        )
    if opt.kind == "sgd":
        return torch.optim.SGD(tensors, lr=lr)
    if opt.kind == "muon":
        muon = getattr(torch.optim, "Muon", None)
        if muon is None:
            raise TrainingError(
                "optimizer_unsupported",
                f"optimizer muon needs torch.optim.Muon (torch >= 2.9); this torch is {torch.__version__}. "
                "Use optimizer {kind: adam_w}.",
                failure_reason="unsupported_loss_config",
            )
        bad = [n for n, p in params if p.dim() != 2]
        if bad:
            raise TrainingError(
                "optimizer_unsupported",
                f"muon needs 2-D parameters; {bad[0]} is not",
                failure_reason="unsupported_loss_config",
            )
        return muon(
            tensors,
            lr=lr,
            weight_decay=opt.weight_decay,
            momentum=opt.momentum,
            nesterov=opt.nesterov,
            ns_steps=opt.ns_iters,
        )
    raise TrainingError(
        "optimizer_unsupported", f"unknown optimizer {opt.kind!r}", failure_reason="unsupported_loss_config"
    )

