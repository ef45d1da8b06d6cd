"""The adapters app's families for GET /metrics (core.metrics), with no label naming an adapter:

- promotions by state (a gauge read from the rows), so a team can alert on candidates waiting for an
  approver;
- the chat completions the GPU worker answered (`kiln_inference_*`): requests by outcome, prompt and
  completion tokens, and the seconds they took. Counted in memory by the worker (a CounterBuffer) and
  written every few seconds, so an inference request costs no database write.
"""

from __future__ import annotations

from core.metrics.families import register
from core.metrics.gauges import register_gauge
from core.metrics.services import CounterBuffer

INFERENCE_OUTCOMES = ("completed", "failed", "abandoned")
INFERENCE = CounterBuffer()


def _promotions_by_state() -> dict[tuple[str, ...], float]:
    from django.db.models import Count

    from adapters.models import Promotion

    return {(row["state"],): row["n"] for row in Promotion.objects.values("state").annotate(n=Count("id"))}


def register_families() -> None:
    from adapters.models import PromotionState

    register_gauge("kiln_promotions", "Adapter promotions by state (pending ones wait for an approver).",
                   _promotions_by_state, state=tuple(PromotionState.values))
    register("kiln_inference_requests_total", "counter", "Chat completion requests the GPU worker answered, by "
             "outcome (abandoned: the client left before the answer).", outcome=INFERENCE_OUTCOMES)
    register("kiln_inference_prompt_tokens_total", "counter", "Prompt tokens of completed chat completions.")
    register("kiln_inference_completion_tokens_total", "counter",
             "Tokens generated for completed chat completions (every choice).")
    register("kiln_inference_request_seconds_total", "counter",
             "Seconds the GPU worker spent on chat completion requests, from receipt to answer.")


def count_inference(outcome: str, seconds: float, usage: dict | None = None) -> None:
    INFERENCE.add("kiln_inference_requests_total", outcome=outcome)
    INFERENCE.add("kiln_inference_request_seconds_total", max(0.0, seconds))
    if usage:
        INFERENCE.add("kiln_inference_prompt_tokens_total", int(usage.get("prompt_tokens") or 0))
        INFERENCE.add("kiln_inference_completion_tokens_total", int(usage.get("completion_tokens") or 0))
