"""The serving canary: before an adapter becomes the active one, the GPU worker must serve it.

    record = canary_run(adapter)      # {"passed": True, "outputs": [...], ...} or passed False + reasons

For each fixed prompt the GPU worker generates greedily with the adapter (the same in-cluster route
the evaluations use, `adapters.serving.sync_client`) and returns the rollout provenance. The canary
passes when every prompt was answered, every sampled token's log-probability is finite, the
worker's behavior policy names the adapter with the registry's content digest (so the bytes that
serve are the bytes that were evaluated), and not every reply is empty (a collapsed policy). The
outputs are recorded, so an auditor sees what it said.

A refusal that is the adapter's fault (it does not load, generation fails on it, its log-probs are
not finite, the worker served other bytes) fails the canary: the caller quarantines the adapter. A
refusal of the infrastructure (no GPU worker, the model is loading, a timeout) raises
CanaryUnavailable: nothing is said about the adapter, and nothing changes.

Web-safe: imports no torch (the GPU worker does the generating).
"""

from __future__ import annotations

import math
import os
import time

from django.utils import timezone

from core.canonical import json_digest
from core.errors import KilnError

SCHEMA = "kiln.serving-canary.v1"
PROMPTS = ("What is 2 + 3?", "Name one primary colour.", "Reply with the word ready.")
MAX_TOKENS = 16
SEED = 0
# Codes of /v1/chat/completions that say the adapter itself cannot be served.
ADAPTER_FAULTS = frozenset(
    {"adapter_not_found", "adapter_load_failed", "adapter_content_mismatch", "generation_failed", "invalid_request"}
)
DEFAULT_TIMEOUT_SECONDS = 120.0


class CanaryUnavailable(KilnError):
    """The canary could not run (no GPU worker, model loading, timeout): the adapter is not judged."""


def canary_timeout() -> float:
    """Seconds one canary prompt may take, queueing included (KILN_CANARY_TIMEOUT_SECONDS)."""
    raw = os.environ.get("KILN_CANARY_TIMEOUT_SECONDS", "")
    try:
        value = float(raw) if raw else DEFAULT_TIMEOUT_SECONDS
    except ValueError:
        value = DEFAULT_TIMEOUT_SECONDS
    return value if math.isfinite(value) and value > 0 else DEFAULT_TIMEOUT_SECONDS


def _body(adapter: str, prompt: str) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], "adapter": adapter, "temperature": 0.0,
            "seed": SEED, "max_tokens": MAX_TOKENS, "rollout_provenance": True,
            "chat_template_kwargs": {"enable_thinking": False}}


def _complete(body: dict, timeout: float) -> dict:
    # Looked up at call time, so tests that stand in an in-process GPU host for the worker reach it.
    from adapters.serving import sync_client

    # An adapter change, which maintenance admits (spec: it drains to training and adapter changes).
    return sync_client.chat_completion_sync(body, timeout=timeout, activity="adapter_change")


def _judge(prompt: str, response: dict, content_sha256: str) -> tuple[dict, list[str]]:
    choice = (response.get("choices") or [{}])[0]
    provenance = choice.get("rollout_provenance") or {}
    logprobs = [a.get("behavior_logprob") for a in provenance.get("action_tokens") or []
                if a.get("source") == "sampled"]
    finite = all(isinstance(v, int | float) and math.isfinite(v) for v in logprobs)
    served = ((provenance.get("behavior_policy") or {}).get("adapter") or {}).get("content_sha256")
    output = {"prompt": prompt, "content": (choice.get("message") or {}).get("content") or "",
              "finish_reason": choice.get("finish_reason"), "sampled_tokens": len(logprobs),
              "logprobs_finite": finite, "min_logprob": min(logprobs) if logprobs and finite else None,
              "served_content_sha256": served}
    reasons = []
    if not finite:
        reasons.append(f"{prompt!r}: a sampled token's log-probability is not finite")
    if content_sha256 and served != content_sha256:
        reasons.append(f"{prompt!r}: the worker served {served or 'no adapter'}, the registry holds {content_sha256}")
    return output, reasons


# Codes that say no GPU worker serves yet (one restarting after a crash, its model loading).
NOT_SERVING_YET = frozenset({"inference_unavailable", "model_loading", "server_shutting_down"})
WORKER_POLL_SECONDS = 2.0


def _complete_once_served(body: dict, timeout: float, wait_for_worker: float) -> dict:
    """`_complete`, asked again every WORKER_POLL_SECONDS while no worker serves, for up to
    `wait_for_worker` seconds (0: once)."""
    deadline = time.monotonic() + wait_for_worker
    while True:
        try:
            return _complete(body, timeout)
        except KilnError as exc:
            if exc.code not in NOT_SERVING_YET or time.monotonic() + WORKER_POLL_SECONDS > deadline:
                raise
        time.sleep(WORKER_POLL_SECONDS)


def canary_run(*, name: str, content_sha256: str, timeout: float | None = None, wait_for_worker: float = 0.0) -> dict:
    """Run the canary on the adapter `name` (expected bytes `content_sha256`). Raises CanaryUnavailable.
    `wait_for_worker`: how long a queued activation waits for a GPU worker to serve (a request's own
    load answers at once)."""
    timeout = timeout or canary_timeout()
    outputs, reasons = [], []
    for prompt in PROMPTS:
        try:
            response = _complete_once_served(_body(name, prompt), timeout, wait_for_worker)
        except KilnError as exc:
            if exc.code not in ADAPTER_FAULTS:
                raise CanaryUnavailable(exc.code, f"the serving canary could not run: {exc.message}",
                                        status=503, hint=exc.hint or "check /health: is a GPU worker serving?") \
                    from None
            outputs.append({"prompt": prompt, "error": {"code": exc.code, "message": exc.message}})
            reasons.append(f"{prompt!r}: {exc.code}: {exc.message}")
            break  # an adapter that does not load will not load for the next prompt either
        output, problems = _judge(prompt, response, content_sha256)
        outputs.append(output)
        reasons.extend(problems)
    answered = [o for o in outputs if "error" not in o]
    if answered and len(answered) == len(PROMPTS) and not any(o["content"].strip() for o in answered):
        # Every prompt answered with nothing (the end token at once): a collapsed policy, whatever its
        # training figures say. One empty reply can be the model's choice; three are not.
        reasons.append(f"the adapter answered none of the {len(PROMPTS)} prompts (empty replies): a collapsed policy")
    record = {"schema": SCHEMA, "adapter": name, "content_sha256": content_sha256, "passed": not reasons,
              "reasons": reasons, "prompts": list(PROMPTS), "max_tokens": MAX_TOKENS, "seed": SEED,
              "outputs": outputs, "at": timezone.now().isoformat()}
    record["sha256"] = json_digest({k: v for k, v in record.items() if k != "at"})
    return record
