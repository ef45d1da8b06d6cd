"""The server's GRPO training defaults (`[training.defaults]` in kiln.toml, or KILN_TRAINING_DEFAULTS).

Pure Python: imports neither torch nor Django (kiln_project.config checks the table with it at
startup). The effective config of a submission is built in three layers, in one place
(`apply_training_defaults`, called by training.services for every route):

    GrpoConfig's built-in defaults  <-  the server's [training.defaults]  <-  the request's config

A key the request sets wins; else the server's default; else the built-in one. The merge is per
top-level key: a nested object the request gives (`optimizer`, `kl_reference_policy`, `loss`)
replaces the server's whole. One coupling: a server `learning_rate` was chosen for the server's
optimizer, so it does not apply when the request names an optimizer of another kind (that run
gets the built-in default learning rate of its own optimizer).

Per-run identity fields (the output name, the starting adapter, the checkpoint to resume, the
seed) cannot be defaulted: a table that names one is refused at startup.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from core.contracts.grpo_config import GrpoConfig
from core.contracts.grpo_values import GrpoConfigError

# Fields that name one run: a server-wide default would make every run collide or replay another.
IDENTITY_FIELDS = ("output_name", "base_adapter", "resume_checkpoint", "seed")
SOURCE_REQUEST, SOURCE_SERVER, SOURCE_DEFAULT = "request", "server_defaults", "default"


def config_fields() -> tuple[str, ...]:
    """The top-level GrpoConfig keys, in the receipt's (spec) order."""
    return tuple(f.name for f in dataclasses.fields(GrpoConfig) if f.name != "ignored_keys")


def check_training_defaults(table: Any) -> dict:
    """Validate a defaults table; return it as a plain dict. Raises GrpoConfigError naming the key."""
    if not isinstance(table, dict):
        raise GrpoConfigError("training.defaults", f"must be a table (a JSON object), got {type(table).__name__}")
    known = set(config_fields())
    for key in table:
        if key in IDENTITY_FIELDS:
            raise GrpoConfigError(key, "names one run and cannot be a server default; set it per request")
        if key not in known:
            hint = " (use kl_reference_policy)" if key == "reference_policy" else ""
            raise GrpoConfigError(key, f"is not a GRPO config field{hint}")
    GrpoConfig.from_dict(dict(table))  # every value (and their combination) must be valid on its own
    return dict(table)


def _optimizer_kind(value: Any) -> str | None:
    return value.get("kind") if isinstance(value, dict) else None


def apply_training_defaults(config: Any, defaults: dict) -> tuple[Any, dict[str, str]]:
    """(the merged request config, {field: "request"|"server_defaults"|"default"} for every field).

    `config` is the request's `config` object as sent (None: none); anything that is not an object
    is passed through untouched for GrpoConfig to refuse. Unknown request keys stay in the result
    (GrpoConfig records them as ignored)."""
    request = {} if config is None else config
    if not isinstance(request, dict):
        return config, {}
    merged = dict(request)
    if "reference_policy" in request:  # the request's alias counts as its kl_reference_policy
        given = set(request) | {"kl_reference_policy"}
    else:
        given = set(request)
    applied: set[str] = set()
    for key, value in defaults.items():
        if key in given:
            continue
        if key == "learning_rate" and "optimizer" in request:
            if _optimizer_kind(request["optimizer"]) != _optimizer_kind(defaults.get("optimizer", {"kind": "muon"})):
                continue  # the server's rate belongs to another optimizer
        merged[key] = value
        applied.add(key)
    sources = {key: SOURCE_REQUEST if key in given else SOURCE_SERVER if key in applied else SOURCE_DEFAULT
               for key in config_fields()}
    return merged, sources
