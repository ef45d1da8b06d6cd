"""GRPO training for GET /metrics (core.metrics): what completed runs trained, counted in the
transaction that publishes the adapter and its train receipt (training.runner), from the receipt's own
numbers. A failed or cancelled run counts nothing here (the jobs gauge shows it, and its failure
receipt what it did). No label names an adapter or a dataset."""

from __future__ import annotations

from core.metrics.families import register
from core.metrics.services import counter_add

GROUP_DISPOSITIONS = ("trained", "filtered")


def register_families() -> None:
    register("kiln_training_optimizer_steps_total", "counter",
             "Optimizer steps of GRPO runs that completed and published their adapter.")
    register("kiln_training_groups_total", "counter", "Groups read by completed GRPO runs: trained, or filtered "
             "out (no reward variance, a reward filter).", disposition=GROUP_DISPOSITIONS)
    register("kiln_training_completions_trained_total", "counter", "Completions completed GRPO runs trained on.")


def count_completed_run(receipt: dict) -> None:
    data = receipt.get("data") or {}
    counter_add("kiln_training_optimizer_steps_total", int((receipt.get("progress") or {}).get("global_step") or 0))
    counter_add("kiln_training_groups_total", int(data.get("groups_trained") or 0), disposition="trained")
    counter_add("kiln_training_groups_total", int(data.get("groups_filtered") or 0), disposition="filtered")
    counter_add("kiln_training_completions_trained_total", int(data.get("completions_trained") or 0))
