"""Persisted OpenEnv runs (reference-spec §1.6, §4.9-4.12): request, services, the job, downloads, API.

`request` is pure (no Django); the rest is the Django side of the `openenv` app.
"""
