"""Kiln's kernel: what every app stands on (artifacts, canonical JSON). Imports no app above it."""
