"""Job lifecycle hooks for training jobs (run in the web or a worker process; no torch)."""

from __future__ import annotations

from adapters.services import adapter_release
from training.payloads import GrpoJobPayload


def release_output_adapter(job) -> None:
    """A failed or cancelled run published nothing: free its output name for a new attempt."""
    adapter_release(name=GrpoJobPayload.of(job).adapter_name)
