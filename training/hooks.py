"""Job lifecycle hooks for training jobs (run in the web or a worker process; no torch)."""

from __future__ import annotations

from adapters.services import adapter_release


def release_output_adapter(job) -> None:
    """A failed or cancelled run published nothing: free its output name for a new attempt."""
    name = job.payload.get("adapter_name")
    if name:
        adapter_release(name=name)
