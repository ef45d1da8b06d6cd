"""Gate decisions for GET /metrics (core.metrics): `kiln_gate_decisions_total{gate, outcome}`.

Counted in the transaction that records the decision's receipt, by the two gates: the held-out
post-eval gate (training.post_eval_jobs, outcomes evaluations.gate.GATE_OUTCOMES) and the OpenEnv
environment gate (openenv.environment_promotion, outcomes openenv.environment_gate.OUTCOMES). This
module sits below both apps, so it names the union of their outcomes itself (a test holds them equal)."""

from __future__ import annotations

import logging

from core.metrics.families import register
from core.metrics.services import counter_add
from evaluations.gate import GATE_OUTCOMES

log = logging.getLogger(__name__)

GATES = ("post_eval", "environment")
OUTCOMES = tuple(dict.fromkeys((*GATE_OUTCOMES, "diagnostic", "rejected")))


def register_families() -> None:
    register("kiln_gate_decisions_total", "counter", "Gate decisions recorded with their receipt, by gate "
             "(held-out post-eval, OpenEnv environment) and outcome.", gate=GATES, outcome=OUTCOMES)


def count_gate_decision(gate: str, outcome: str) -> None:
    """Never fails the decision it counts: an outcome outside the closed set is logged, not counted."""
    if gate not in GATES or outcome not in OUTCOMES:
        log.error("metrics: gate decision %r/%r is outside kiln_gate_decisions_total's labels", gate, outcome)
        return
    counter_add("kiln_gate_decisions_total", gate=gate, outcome=outcome)
