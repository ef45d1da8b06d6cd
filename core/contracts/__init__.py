"""Typed request contracts shared by the web process and the workers. Pure: no Django, no torch.

A request is parsed and validated here once (GRPO config and submission, recorded-policy
provenance) into frozen values that cross the queue as plain data; gpu_runtime and the apps both
import them, so both sides check the same rules with the same bounds.
"""
