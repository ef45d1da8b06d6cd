"""GRPO training jobs: requests, data admission and snapshots, the job handler, API, CLI and pages."""
