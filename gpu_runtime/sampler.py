"""The batching sampler: continuous batching over a KV cache, per-request controls and provenance. Imports no Django.

Scheduling. Requests are grouped into cohorts by adapter (one cohort per loaded adapter
revision, one for the base model), so a forward pass never mixes adapters. Each `step()`:
  1. admits submitted requests (render + tokenize, resolve and load the adapter);
  2. prefills waiting requests within a token budget, one forward pass per adapter (prompts
     left-padded to a common width; identical prompts, such as a GRPO group's samples, share
     one row), samples each one's first token, and appends the new KV rows to the adapter's
     cohort (left-padding whichever side is shorter);
  3. runs one decode forward per cohort, feeding every row its last token, and samples the next.
A request submitted while a long one decodes therefore joins at the next step, never waiting for
the long one to finish. Finished rows leave the cohort at once and padding columns no row needs
are trimmed. Explicit position ids and attention over each row's own columns make a row's math
independent of its neighbours; sampling is row-wise and draws from each request's own
torch.Generator, so a seed gives the same tokens alone or in any batch. Bit for bit where every
matmul runs over oneDNN-packed weights (float32 on the CPU, `packed_linear`; `packing_problem`
says why not elsewhere): there each row's logits equal its logits alone, whatever the batch
holds. Elsewhere (GPU, reduced precision, models too large to stack, the transformers forward)
batched matmuls may round a row differently with the batch, so a token drawn where two tokens'
cumulative probabilities meet the uniform can differ.

Forward passes take the lean path (`gpu_runtime.lean_decoder`, over a `kv_cache.LeanCache`) when
the model and the cohort's adapter have a supported shape, and the transformers forward (over a
DynamicCache) otherwise; `forward_path` says which the base model takes.

Drive it with `run_forever(stop_event)` on a dedicated thread (the GPU worker does), or call
`generate(requests)`, which steps the loop itself when no runner thread is active.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent import futures
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import torch
from transformers.cache_utils import DynamicCache

from gpu_runtime import kv_cache, lean_decoder, packed_linear
from gpu_runtime.adapters import AdapterManager, AdapterResolver
from gpu_runtime.admission import admit_request
from gpu_runtime.kernels import selection
from gpu_runtime.sample_types import (
    SOURCE_FORCED,
    SOURCE_SAMPLED,
    SampleRequest,
    SampleRequestError,
    SampleResult,
)
from gpu_runtime.sampling import apply_penalties, behavior_logprobs, draw_tokens
from gpu_runtime.sequence import THINK_CLOSE, THINK_OPEN, DecodeSequence, ThinkingTokens


@dataclass
class SampleHandle:
    request_id: str
    future: Future

    def result(self, timeout: float | None = None) -> SampleResult:
        return self.future.result(timeout)

    def cancel(self) -> bool:
        """Cancel the request; the sampler drops it at its next step."""
        return self.future.cancel()

    def done(self) -> bool:
        return self.future.done()


@dataclass
class _Cohort:
    key: str | None
    cache: DynamicCache | kv_cache.LeanCache
    mask: torch.Tensor  # [rows, columns] 1 = real token, aligned with the cache columns
    seqs: list[DecodeSequence] = field(default_factory=list)


class Sampler:
    def __init__(
        self,
        loaded_model,
        adapter_resolver: AdapterResolver | None = None,
        *,
        max_batch_size: int = 32,
        max_prefill_tokens: int = 8192,
        max_loaded_adapters: int = 8,
    ):
        self._loaded = loaded_model
        self._model = loaded_model.model
        self._tokenizer = loaded_model.tokenizer
        self._device = loaded_model.device
        self._adapters = AdapterManager(loaded_model, adapter_resolver, max_loaded=max_loaded_adapters)
        self.max_batch_size = max_batch_size
        self.max_prefill_tokens = max_prefill_tokens
        self._thinking = _thinking_tokens(self._tokenizer)
        pad = self._tokenizer.pad_token_id
        self._pad_id = pad if pad is not None else 0  # any real id: padded columns are masked out
        self._incoming: queue.SimpleQueue = queue.SimpleQueue()
        self._waiting: list[DecodeSequence] = []
        self._cohorts: dict[str | None, _Cohort] = {}
        self._wakeup = threading.Event()
        self._step_lock = threading.Lock()
        self._runner_active = False
        self._plans: dict[str | None, lean_decoder.Plan | None] = {}  # adapter key -> plan (None: HF)
        self._plans_version = -1
        reason = lean_decoder.unsupported_reason(self._model)
        self.forward_path = "lean" if reason is None else "transformers"
        self.lean_unsupported_reason = reason
        # Why the matmuls run on plain F.linear rather than oneDNN-packed weights (`packed_linear`),
        # so that rows are batch-invariant only up to rounding, or None when they are packed (and
        # bitwise batch-invariant); each plan built updates it.
        self.packing_problem: str | None = "the transformers forward serves this model"
        if reason is None:
            self.packing_problem = packed_linear.packing_problem(lean_decoder.plan_for(self._model, merge_lora=True))
        # The sampling step (filters + draw) runs as one Triton kernel on CUDA, else in torch.
        self.kernels = selection.choose(self._device)

    # -- public API ---------------------------------------------------------------------------

    def submit(self, request: SampleRequest) -> SampleHandle:
        """Queue a request (thread-safe); the returned handle's future resolves to a SampleResult."""
        future: Future = Future()
        self._incoming.put((request, future, time.perf_counter()))
        self._wakeup.set()
        return SampleHandle(request.request_id, future)

    def generate(self, requests: list[SampleRequest], timeout: float | None = None) -> list[SampleResult]:
        """Submit `requests` together and wait for all results (raises the first request's error)."""
        handles = [self.submit(r) for r in requests]
        deadline = None if timeout is None else time.monotonic() + timeout
        while not all(h.done() for h in handles):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError("sampler.generate timed out")
            if self._runner_active:
                futures.wait([h.future for h in handles], timeout=remaining)
            elif not self.step():
                time.sleep(0.001)  # another thread holds the loop; let it progress
        return [h.result() for h in handles]

    def run_forever(self, stop_event: threading.Event, idle_wait_s: float = 0.05) -> None:
        """Step until `stop_event` is set; requests still in flight then fail with sampler_stopped."""
        self._runner_active = True
        try:
            while not stop_event.is_set():
                self._wakeup.clear()
                if not self.step():
                    self._wakeup.wait(idle_wait_s)
        finally:
            self._runner_active = False
            self.fail_all(
                SampleRequestError("sampler_stopped", "The sampler stopped before this request finished.")
            )

    @property
    def busy(self) -> bool:
        return bool(self._cohorts or self._waiting or not self._incoming.empty())

    def step(self) -> bool:
        """One scheduling iteration; returns False when there was nothing to do."""
        with self._step_lock, torch.inference_mode():
            self._drop_cancelled()
            admitted = self._admit()
            prefilled = self._prefill_waiting()
            decoded = False
            for cohort in list(self._cohorts.values()):
                self._decode(cohort)
                decoded = True
            return admitted or prefilled or decoded

    def resident_adapters(self) -> list[str]:
        return self._adapters.resident_names()

    def fail_all(self, error: Exception) -> None:
        with self._step_lock:
            while True:
                try:
                    _, future, _ = self._incoming.get_nowait()
                except queue.Empty:
                    break
                _set_exception(future, error)
            for seq in self._waiting + [s for c in self._cohorts.values() for s in c.seqs]:
                _set_exception(seq.future, error)
            self._waiting.clear()
            self._cohorts.clear()

    # -- admission ----------------------------------------------------------------------------

    def _admit(self) -> bool:
        admitted = False
        in_use = {seq.adapter_key for seq in self._waiting} | set(self._cohorts)
        while True:
            try:
                request, future, created_at = self._incoming.get_nowait()
            except queue.Empty:
                return admitted
            admitted = True
            if future.cancelled():
                continue
            try:
                self._waiting.append(
                    admit_request(
                        request,
                        future,
                        created_at,
                        loaded=self._loaded,
                        adapters=self._adapters,
                        thinking=self._thinking,
                        in_use=in_use,
                    )
                )
                in_use.add(self._waiting[-1].adapter_key)
            except SampleRequestError as exc:
                _set_exception(future, exc)
            except Exception as exc:  # noqa: BLE001 - never let one bad request stop the loop
                _set_exception(future, SampleRequestError("invalid_request", str(exc)))

    # -- prefill and decode -------------------------------------------------------------------

    def _prefill_waiting(self) -> bool:
        """Prefill waiting requests, oldest first, within the token budget and cohort sizes.

        One forward pass per adapter: prompts are left-padded to a common width, and identical
        prompts (a GRPO group's samples) share a single row that is copied afterwards.
        """
        budget = self.max_prefill_tokens
        groups: dict[str | None, list[DecodeSequence]] = {}
        still_waiting = []
        for seq in self._waiting:
            cohort = self._cohorts.get(seq.adapter_key)
            taken = (len(cohort.seqs) if cohort else 0) + len(groups.get(seq.adapter_key, ()))
            if taken >= self.max_batch_size or (groups and len(seq.prompt_ids) > budget):
                still_waiting.append(seq)
                continue
            budget -= len(seq.prompt_ids)
            groups.setdefault(seq.adapter_key, []).append(seq)
        self._waiting = still_waiting
        for key, seqs in groups.items():
            self._prefill(key, seqs)
        return bool(groups)

    def _prefill(self, key: str | None, seqs: list[DecodeSequence]) -> None:
        try:
            self._adapters.activate(key)
            unique: dict[tuple[int, ...], int] = {}
            rows = [unique.setdefault(tuple(s.prompt_ids), len(unique)) for s in seqs]
            prompts = list(unique)
            width = max(len(p) for p in prompts)
            ids = torch.tensor(
                [[self._pad_id] * (width - len(p)) + list(p) for p in prompts], device=self._device
            )
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self._device)
            padded = any(len(p) < width for p in prompts)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            plan = self._plan(key)
            if isinstance(plan, packed_linear.PackedPlan):  # each row over its own columns: batch-invariant
                starts = [width - len(p) for p in prompts]
                hidden, kv = lean_decoder.forward(plan, ids, positions=positions, starts=starts)
                cache = kv_cache.LeanCache(kv)
                logits = packed_linear.lm_logits(plan, hidden[:, -1, :])
            elif plan is not None:
                attend = _prefill_attention(mask) if padded else None
                hidden, kv = lean_decoder.forward(plan, ids, positions=positions, mask=attend)
                cache = kv_cache.LeanCache(kv)
                logits = lean_decoder.lm_logits(plan, hidden[:, -1, :])
            else:
                cache = DynamicCache(config=self._model.config)
                out = self._model(
                    input_ids=ids,
                    attention_mask=mask if padded else None,
                    position_ids=positions,
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                kv_cache.check_supported(cache)
                logits = out.logits[:, -1, :]
            if rows != list(range(len(prompts))):
                logits = logits.index_select(0, torch.tensor(rows, device=logits.device))
                mask = kv_cache.keep_rows(cache, mask, rows)
            now = time.perf_counter()
            for seq in seqs:
                seq.prefilled_at = now
            self._choose(seqs, logits)
        except Exception as exc:  # noqa: BLE001 - fail these requests, keep serving the others
            error = SampleRequestError("generation_failed", f"Prefill failed: {exc}")
            for seq in seqs:
                _set_exception(seq.future, error)
            return
        live = [i for i, s in enumerate(seqs) if not s.finished]
        for seq in seqs:
            if seq.finished:
                _set_result(seq)
        if not live:
            return
        if len(live) < len(seqs):
            mask = kv_cache.keep_rows(cache, mask, live)
        seqs = [seqs[i] for i in live]
        cohort = self._cohorts.get(key)
        if cohort is None:
            self._cohorts[key] = _Cohort(key, cache, mask, seqs)
        else:
            cohort.mask = kv_cache.append_rows(cohort.cache, cohort.mask, cache, mask)
            cohort.seqs.extend(seqs)

    def _decode(self, cohort: _Cohort) -> None:
        seqs = cohort.seqs
        try:
            self._adapters.activate(cohort.key)
            ids = torch.tensor([[s.completion[-1]] for s in seqs], device=self._device)
            positions = torch.tensor([[s.position] for s in seqs], device=self._device)
            mask = torch.cat(
                [cohort.mask, torch.ones((len(seqs), 1), dtype=cohort.mask.dtype, device=self._device)], 1
            )
            if isinstance(cohort.cache, kv_cache.LeanCache):
                plan = self._plan(cohort.key)
                if isinstance(plan, packed_linear.PackedPlan):
                    hidden, _ = lean_decoder.forward(
                        plan, ids, positions=positions, starts=_first_real_columns(mask), cache=cohort.cache
                    )
                else:
                    hidden, _ = lean_decoder.forward(
                        plan, ids, positions=positions, mask=mask.bool()[:, None, None, :], cache=cohort.cache
                    )
                logits = packed_linear.lm_logits(plan, hidden[:, -1, :])
            else:
                out = self._model(
                    input_ids=ids, attention_mask=mask, position_ids=positions, cache=cohort.cache, use_cache=True
                )
                logits = out.logits[:, -1, :]
            cohort.mask = mask
            self._choose(seqs, logits)
        except Exception as exc:  # noqa: BLE001 - e.g. out of memory: fail the cohort, not the worker
            error = SampleRequestError("generation_failed", f"Decoding failed: {exc}")
            for seq in seqs:
                _set_exception(seq.future, error)
            del self._cohorts[cohort.key]
            return
        keep = [i for i, s in enumerate(seqs) if not s.finished]
        for seq in seqs:
            if seq.finished:
                _set_result(seq)
        if not keep:
            del self._cohorts[cohort.key]
        elif len(keep) < len(seqs):
            cohort.mask = kv_cache.keep_rows(cohort.cache, cohort.mask, keep)
            cohort.seqs = [seqs[i] for i in keep]

    def _plan(self, key: str | None) -> lean_decoder.Plan | None:
        """The lean plan for adapter `key` (activated by the caller), or None for the HF forward."""
        if self.forward_path != "lean":
            return None
        if self._plans_version != self._adapters.version:
            self._plans.clear()
            self._plans_version = self._adapters.version
        if key not in self._plans:
            try:
                plan = lean_decoder.plan_for(self._adapters.model, merge_lora=True)
                self._plans[key], self.packing_problem = packed_linear.packed_plan(plan)
            except lean_decoder.LeanUnsupported:
                self._plans[key] = None  # e.g. a DoRA adapter: the transformers forward serves it
        return self._plans[key]

    def _choose(self, seqs: list[DecodeSequence], logits: torch.Tensor) -> None:
        """Pick each row's next token (forced or drawn) and record it with its behaviour log-prob."""
        logits = logits.float()
        if any(s.penalties is not None for s in seqs):
            logits = logits.clone()
            for row, seq in enumerate(seqs):
                if seq.penalties is not None:
                    logits[row] = apply_penalties(logits[row], seq.params, seq.penalties)
        forced = [s.forced_next() for s in seqs]
        uniforms = [
            0.0 if f is not None or s.params.greedy else s.uniform()
            for s, f in zip(seqs, forced, strict=True)
        ]
        if self.kernels.triton:
            # Each request's own uniforms: a seed gives the same tokens on either path.
            from gpu_runtime.kernels.sampling import sample

            token_t, chosen_t = sample(
                logits,
                [s.params for s in seqs],
                uniforms=torch.tensor(uniforms, dtype=torch.float64, device=logits.device),
                forced=forced,
            )
            for seq, token, logprob, f in zip(seqs, token_t.tolist(), chosen_t.tolist(), forced, strict=True):
                seq.accept(token, logprob, SOURCE_FORCED if f is not None else SOURCE_SAMPLED)
            return
        logprobs = behavior_logprobs(logits, [s.params for s in seqs])
        drawn = draw_tokens(logprobs, torch.tensor(uniforms, dtype=torch.float64, device=logprobs.device))
        tokens = drawn
        if any(f is not None for f in forced):
            is_forced = torch.tensor([f is not None for f in forced], device=logprobs.device)
            forced_ids = torch.tensor([f if f is not None else 0 for f in forced], device=logprobs.device)
            tokens = torch.where(is_forced, forced_ids, drawn)
        chosen = logprobs.gather(1, tokens[:, None]).squeeze(1)
        for seq, token, logprob, f in zip(seqs, tokens.tolist(), chosen.tolist(), forced, strict=True):
            seq.accept(token, logprob, SOURCE_FORCED if f is not None else SOURCE_SAMPLED)

    def _drop_cancelled(self) -> None:
        self._waiting = [s for s in self._waiting if not s.future.cancelled()]
        for key, cohort in list(self._cohorts.items()):
            keep = [i for i, s in enumerate(cohort.seqs) if not s.future.cancelled()]
            if not keep:
                del self._cohorts[key]
            elif len(keep) < len(cohort.seqs):
                cohort.mask = kv_cache.keep_rows(cohort.cache, cohort.mask, keep)
                cohort.seqs = [cohort.seqs[i] for i in keep]


def _first_real_columns(mask: torch.Tensor) -> list[int]:
    """Each row's first real column. A row's real columns are a suffix of the cohort's: prompts are
    left-padded, decoding appends on the right, and row surgery left-pads or drops leading columns."""
    return (mask.shape[1] - mask.sum(1)).tolist()


def _prefill_attention(mask: torch.Tensor) -> torch.Tensor:
    """(rows, 1, T, T) bool for left-padded prompts: causal over real tokens. A padding position
    attends to itself only, so no query row is empty (an empty row would give NaN)."""
    width = mask.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=mask.device).tril()
    eye = torch.eye(width, dtype=torch.bool, device=mask.device)
    return ((causal & mask.bool()[:, None, :]) | eye)[:, None]


def _thinking_tokens(tokenizer) -> ThinkingTokens:
    vocab = tokenizer.get_vocab()
    open_id, close_id = vocab.get(THINK_OPEN), vocab.get(THINK_CLOSE)
    close_sequence = (
        tuple(tokenizer.encode(THINK_CLOSE + "\n\n", add_special_tokens=False))
        if close_id is not None
        else ()
    )
    return ThinkingTokens(open_id, close_id, vocab.get("<|im_start|>"), close_sequence)


def _set_result(seq: DecodeSequence) -> None:
    try:
        seq.future.set_result(seq.result())
    except InvalidStateError:  # cancelled meanwhile
        pass


def _set_exception(future: Future, error: Exception) -> None:
    try:
        future.set_exception(error)
    except InvalidStateError:
        pass


__all__ = ["Sampler", "SampleHandle", "SampleRequest", "SampleResult", "SampleRequestError"]
