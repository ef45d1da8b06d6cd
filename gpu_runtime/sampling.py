"""Per-request sampling controls and the logits -> behaviour distribution -> token math. Imports no Django.

Order of operations (vLLM's, and the one recorded in provenance):
  penalties (repetition over prompt+output, presence/frequency over output)
  -> temperature -> top-k -> top-p (on the top-k renormalised mass) -> min-p -> log-softmax.
The result is the exact distribution a token is drawn from, so its log-prob is the behaviour
log-prob. Every operation is row-wise: a row's distribution does not depend on which other
requests share the batch. Temperature 0 means greedy: a one-hot distribution at the arg-max
(log-prob 0). A token is drawn by inverting the float64 CDF (vocabulary order) at one uniform
number from the request's own torch.Generator, so one random number is used per sampled token
whatever the batch holds.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import torch

from core.contracts.sampling import sampling_problem


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables
    min_p: float = 0.0
    max_tokens: int = 256
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self):
        object.__setattr__(self, "stop", tuple(self.stop or ()))

    def validate(self) -> None:
        """Raise ValueError for a control outside the bounds every entry point shares
        (core.contracts.sampling: the chat route, rollout-generate and the provenance record)."""
        problem = sampling_problem(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, min_p=self.min_p,
            max_tokens=self.max_tokens, repetition_penalty=self.repetition_penalty,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty, stop=self.stop,
        )
        if problem:
            raise ValueError(problem)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @property
    def draws_from_the_model(self) -> bool:
        """Temperature 1, no filter, no penalty: the distribution sampled is the model's own."""
        return (self.temperature == 1.0 and self.top_k == 0 and self.top_p == 1.0 and self.min_p == 0.0
                and not self.uses_penalties)

    def to_record(self) -> dict:
        """The `sampling` object of kiln.rollout-provenance.v1 (without thinking_budget)."""
        record = asdict(self)
        record["stop"] = list(self.stop)
        for key in (
            "temperature",
            "top_p",
            "min_p",
            "repetition_penalty",
            "presence_penalty",
            "frequency_penalty",
        ):
            record[key] = float(record[key])
        return record


class PenaltyState:
    """Token statistics one request's penalties need: counts in the output, presence in prompt+output."""

    def __init__(self, prompt_ids: list[int], vocab_size: int, device: torch.device):
        self.output_counts = torch.zeros(vocab_size, dtype=torch.float32, device=device)
        self.seen = torch.zeros(vocab_size, dtype=torch.bool, device=device)
        if prompt_ids:
            self.seen[torch.tensor(prompt_ids, device=device)] = True

    def add(self, token_id: int) -> None:
        self.output_counts[token_id] += 1
        self.seen[token_id] = True


def apply_penalties(logits: torch.Tensor, params: SamplingParams, state: PenaltyState) -> torch.Tensor:
    """Penalise one row of logits [V] (returns a new tensor).

    repetition (CTRL/HF): a seen token's logit is divided by the penalty when positive and
    multiplied by it when negative; frequency: minus penalty * count in the output; presence:
    minus penalty if the token occurred in the output at all.
    """
    out = logits.clone()
    if params.repetition_penalty != 1.0:
        penalised = torch.where(out > 0, out / params.repetition_penalty, out * params.repetition_penalty)
        out = torch.where(state.seen, penalised, out)
    if params.frequency_penalty != 0.0:
        out = out - params.frequency_penalty * state.output_counts
    if params.presence_penalty != 0.0:
        out = out - params.presence_penalty * (state.output_counts > 0).to(out.dtype)
    return out


def behavior_logprobs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Turn already-penalised logits [B, V] into the log-probs [B, V] of the distributions sampled from.

    Filtered tokens get -inf. Greedy rows (temperature 0) are one-hot at the arg-max.
    """
    logits = logits.float()
    batch, vocab = logits.shape
    device = logits.device
    scaled = logits
    if any(p.temperature not in (0.0, 1.0) for p in params):
        temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=device)
        scaled = logits / temps[:, None]

    want_top_k = any(p.top_k > 0 and p.top_k < vocab for p in params)
    want_top_p = any(p.top_p < 1.0 for p in params)
    if want_top_k or want_top_p:
        # Stable sort: ties keep vocabulary order, so top_k=1 picks what argmax picks.
        sorted_vals, sorted_idx = torch.sort(scaled, dim=-1, descending=True, stable=True)
        remove = torch.zeros_like(sorted_vals, dtype=torch.bool)
        if want_top_k:
            ks = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params], device=device)
            remove |= torch.arange(vocab, device=device)[None, :] >= ks[:, None]
        if want_top_p:
            probs = torch.softmax(sorted_vals.masked_fill(remove, -math.inf), dim=-1)
            mass_before = probs.cumsum(dim=-1) - probs
            top_ps = torch.tensor([p.top_p for p in params], device=device)
            # Rows with top_p == 1 are left alone: float rounding must not shave their tail.
            active = (top_ps < 1.0)[:, None]
            remove |= active & (mass_before >= top_ps[:, None])
            # The most likely token always stays: a top_p below float32's range (1e-200 rounds
            # to 0) must mean "greedy within the filter", not an empty distribution (NaN).
            remove[:, 0] = False
        mask = torch.zeros_like(remove).scatter(-1, sorted_idx, remove)
        scaled = scaled.masked_fill(mask, -math.inf)
    if any(p.min_p > 0 for p in params):
        probs = torch.softmax(scaled, dim=-1)
        min_ps = torch.tensor([p.min_p for p in params], device=device)
        threshold = min_ps[:, None] * probs.max(dim=-1, keepdim=True).values
        scaled = scaled.masked_fill(probs < threshold, -math.inf)
    logprobs = torch.log_softmax(scaled, dim=-1)

    greedy_rows = [i for i, p in enumerate(params) if p.greedy]
    if greedy_rows:
        rows = torch.tensor(greedy_rows, device=device)
        best = logits[rows].argmax(dim=-1)
        onehot = torch.full((len(greedy_rows), vocab), -math.inf, device=device)
        onehot[torch.arange(len(greedy_rows), device=device), best] = 0.0
        logprobs[rows] = onehot
    return logprobs


def draw_tokens(logprobs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: for each row, the first token whose cumulative probability exceeds u * total.

    `uniforms` is float64 in [0, 1). Zero-probability tokens add nothing to the CDF, so they can
    never be chosen; the target is kept strictly below the total to guard the top edge.
    """
    probs = logprobs.double().exp()
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1]
    target = torch.minimum(uniforms.to(cdf) * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target[:, None], right=True).squeeze(1).clamp(max=cdf.shape[-1] - 1)
