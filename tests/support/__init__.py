"""Helpers for Kiln's tests: test-only job kinds and a real multi-process stack."""
