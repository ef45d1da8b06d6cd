"""The sealed `kiln.openenv-training-contract.v1` (reference-spec §1.6, §2.8). Pure: no Django, no torch.

`effective_config(...)` is the request's GrpoConfig with Kiln's four overrides and every default
filled in (`GrpoConfig.to_dict()`): `output_name = output_adapter`, `base_adapter` = null for the
base model else the behavior adapter (the warm start is the policy that collected), `auto_load`,
and `behavior_policy = no_importance_correction` (multi-turn episodes have no append-stable
probability trace; the corpus is proven on-policy instead). Unknown keys are dropped, as GrpoConfig
ignores them. The server's `[training.defaults]` fill what the request leaves out before the
contract is sealed (the caller, openenv.training.preflight, merges them with
`training.config_defaults`, as every GRPO route does); `config_sources(...)` says afterwards which
field came from where, for the train receipt. `contract(...)` binds that config, the post-eval and the behavior policy identity;
`contract_sha256` is its RFC 8785 digest (`core.canonical`). Restart, collection, submission and
every surface use the sealed contract: current defaults are never re-applied.
"""

from __future__ import annotations

from core.canonical import json_digest
from core.contracts.grpo_config import GrpoConfig

CONTRACT_SCHEMA = "kiln.openenv-training-contract.v1"
PREFLIGHT_SCHEMA = "kiln.openenv-training-preflight.v1"
BEHAVIOR_POLICY = "no_importance_correction"
KILN_OWNED = ("output_name", "base_adapter", "auto_load", "behavior_policy")


class ContractInvalid(ValueError):
    pass


def effective_config(training_config: dict | None, *, adapter: str | None, output_adapter: str,
                     auto_load: bool) -> dict:
    """The effective GRPO config (GrpoConfigError names a bad field of the request's config)."""
    config = dict(training_config or {})
    config.update(output_name=output_adapter, base_adapter=adapter, auto_load=auto_load,
                  behavior_policy=BEHAVIOR_POLICY)
    return GrpoConfig.from_dict(config).to_dict()


def overrides(training_config: dict | None, effective: dict) -> dict:
    """What Kiln replaced: {field: {requested, effective}} for each Kiln-owned field the caller set."""
    given = training_config or {}
    return {key: {"requested": given[key], "effective": effective[key]}
            for key in KILN_OWNED if key in given and given[key] != effective[key]}


def config_sources(training_config: dict | None, effective: dict) -> tuple[dict[str, str], dict]:
    """({field: "request"|"server_defaults"|"default"}, {field: value} taken from the server's defaults)
    for a sealed effective config. The request's fields and Kiln's own are "request"; a field the
    request left out is "server_defaults" where the sealed value is not GrpoConfig's built-in one
    (the server's table was merged in at preflight), else "default"."""
    given = set(training_config or {}) | set(KILN_OWNED)
    if "reference_policy" in given:
        given.add("kl_reference_policy")
    built_in = GrpoConfig.from_dict({}).to_dict()
    sources, from_server = {}, {}
    for key, value in effective.items():
        if key in given:
            sources[key] = "request"
        elif value != built_in.get(key):
            sources[key] = "server_defaults"
            from_server[key] = value
        else:
            sources[key] = "default"
    return sources, from_server


def contract(*, effective: dict, post_eval: dict | None, behavior_policy: dict | None) -> dict:
    out = {"schema": CONTRACT_SCHEMA, "effective_config": effective}
    if post_eval is not None:
        out["post_eval"] = post_eval
    if behavior_policy is not None:
        out["behavior_policy"] = behavior_policy
    return out


def contract_sha256(value: dict) -> str:
    return json_digest(value)


def check_contract(value, digest: str) -> dict:
    """The sealed contract, re-checked against its digest and its own invariants."""
    if not isinstance(value, dict) or value.get("schema") != CONTRACT_SCHEMA:
        raise ContractInvalid("the run carries no kiln.openenv-training-contract.v1")
    if contract_sha256(value) != digest:
        raise ContractInvalid(f"the sealed training contract no longer hashes to {digest}")
    config = value.get("effective_config")
    if not isinstance(config, dict) or config.get("behavior_policy") != BEHAVIOR_POLICY:
        raise ContractInvalid("the contract's effective_config must use no_importance_correction")
    try:
        GrpoConfig.from_dict(config)
    except ValueError as exc:
        raise ContractInvalid(f"the contract's effective_config is invalid: {exc}") from None
    return value
