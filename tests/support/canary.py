"""A stand-in for the GPU worker's answers to the serving canary, for in-process tests without a model.

The canary (adapters.canary) asks the worker for greedy completions with rollout provenance. This
answers as a worker serving the registry's bytes would (finite log-probs, the behavior policy naming
the adapter's content digest), or with the faults a real worker shows: an adapter that does not load,
NaN log-probs, other bytes served, no worker at all. Integration tests use the real worker instead.

    def test_x(canary_worker):             # the fixture in tests/conftest.py
        canary_worker.fail_load.add("bad")
        drain_activations()                # run queued adapter.activate jobs in this process
"""

from __future__ import annotations

from adapters.models import Adapter
from core.errors import KilnError


class StandInWorker:
    def __init__(self):
        self.fail_load: set[str] = set()  # adapter_load_failed for these names
        self.nan_for: set[str] = set()  # a NaN log-prob
        self.empty_for: set[str] = set()  # empty replies (a collapsed adapter)
        self.wrong_bytes_for: set[str] = set()  # the behavior policy names other bytes
        self.unavailable = False  # no GPU worker: inference_unavailable
        self.unavailable_for_calls = 0  # the next N calls: inference_unavailable (a worker restarting)
        self.calls: list[dict] = []

    def __call__(self, body: dict, timeout: float) -> dict:
        self.calls.append(body)
        name = body.get("adapter")
        if self.unavailable or self.unavailable_for_calls > 0:
            self.unavailable_for_calls = max(0, self.unavailable_for_calls - 1)
            raise KilnError("inference_unavailable", "no GPU worker is serving the infer queue", status=503)
        if name in self.fail_load:
            raise KilnError("adapter_load_failed", f"adapter {name!r}: a weight has the wrong shape", status=500)
        row = Adapter.objects.filter(name=name).first()
        digest = "sha256:" + "f" * 64 if name in self.wrong_bytes_for else (row.content_sha256 if row else None)
        logprob = float("nan") if name in self.nan_for else -0.25
        provenance = {"action_tokens": [{"sequence_index": 3, "token_id": 7, "source": "sampled",
                                         "behavior_logprob": logprob}],
                      "behavior_policy": {"adapter": {"name": name, "content_sha256": digest}}}
        content = "" if name in self.empty_for else "ready"
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                             "finish_reason": "stop", "rollout_provenance": provenance}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}


def drain_activations() -> None:
    """Run the queued adapter.activate jobs (control queue) in this process, to their end."""
    from core.jobs.runner import run_queued_jobs

    run_queued_jobs("control")
