"""Kiln's model runtime: torch/transformers/peft code run by the GPU worker.

Imports no Django (import-linter enforces it). Takes plain dataclasses in, reports through
callbacks (on_progress, should_stop), returns plain results; runs and is tested without a DB.
"""
