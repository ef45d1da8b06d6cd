"""`OpenEnvRunRequest`: one POST /v1/openenv/runs body, validated once into its normalized form
(reference-spec §1.6, §4.9).

Pure module: no Django, no torch, no network. `normalize(body)` rejects unknown fields (at every
level), resolves the alias `environments`, applies the defaults, normalizes the URLs (§4.1) and
the numbers (ints stay ints, floats become floats), checks every rule of the spec and the
collector's own bounds (`CollectionConfig.check`), and returns a plain dict with a fixed key order.
`request_digest` is the SHA-256 the idempotency comparison uses: two bodies that normalize to the
same request are the same request. Every refusal is a `RunRequestError` naming the field.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Any

from openenv.client.actions import I64_MAX
from openenv.client.credentials import CREDENTIAL_HANDLE, PUBLIC_SLOT
from openenv.client.errors import OpenEnvError, OpenEnvUrlInvalid
from openenv.client.urls import normalize_url
from openenv.collector.config import MAX_GROUPS, CollectionConfig, adapter_name

KINDS = ("rollout", "train")
MAX_URLS = 64
IDEMPOTENCY_KEY = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
ADAPTER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
TRAIN_ONLY = ("output_adapter", "training_config", "post_eval", "environment_eval")
MIN_GATE_GROUPS = 20
FIELDS = (
    "kind", "idempotency_key", "environment_urls", "environments", "credential_ids", "adapter", "groups",
    "group_size", "seed_start", "reset_options", "environment_reset_options", "max_steps", "concurrency",
    "max_action_tokens", "temperature", "thinking", "thinking_budget_tokens", "protocol_error_reward",
    "max_recoverable_errors", "capacity_wait_seconds", "output_adapter", "training_config", "auto_load",
    "post_eval", "environment_eval",
)
EVAL_FIELDS = ("groups", "group_size", "seed_start", "gate")
GATE_FIELDS = ("min_mean_return", "min_mean_improvement")


class RunRequestError(ValueError):
    """`code`: the API code when one other than openenv_invalid_request is the route-wide rule (an
    adapter name the preflight and the adapter routes refuse as invalid_adapter_name)."""

    def __init__(self, field: str, message: str, hint: str = "", code: str = "openenv_invalid_request"):
        super().__init__(f"{field}: {message}")
        self.field, self.message, self.hint, self.code = field, f"{field}: {message}", hint, code


def _unknown(value: dict, allowed, where: str) -> None:
    extra = sorted(set(value) - set(allowed))
    if extra:
        raise RunRequestError(f"{where}{extra[0]}", "unknown field", f"{where or 'the request'} takes only: "
                              + ", ".join(a for a in allowed if a != "environments"))


def _int(body: dict, field: str, default: int, low: int, high: int, where: str = "") -> int:
    value = body.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RunRequestError(where + field, f"must be an integer, not {value!r}"[:200])
    if not low <= value <= high:
        raise RunRequestError(where + field, f"must lie within {low}..{high} (got {value})")
    return value


def _number(body: dict, field: str, default: float | None, where: str = "") -> float:
    value = body.get(field, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise RunRequestError(where + field, f"must be a finite number, not {value!r}"[:200])
    return float(value)


def _bool(body: dict, field: str, default: bool) -> bool:
    value = body.get(field, default)
    if not isinstance(value, bool):
        raise RunRequestError(field, "must be true or false")
    return value


def _object(value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        raise RunRequestError(field, "must be a JSON object")
    return value


def _urls(body: dict) -> list[str]:
    if "environment_urls" in body and "environments" in body:
        raise RunRequestError("environment_urls", "give environment_urls or its alias environments, not both")
    urls = body.get("environment_urls", body.get("environments"))
    if not isinstance(urls, list) or not 1 <= len(urls) <= MAX_URLS:
        raise RunRequestError("environment_urls", f"must be a list of 1 to {MAX_URLS} URLs")
    out = []
    for index, url in enumerate(urls):
        if not isinstance(url, str):
            raise RunRequestError(f"environment_urls[{index}]", "must be a string")
        try:
            out.append(normalize_url(url).base_url)
        except OpenEnvUrlInvalid as exc:
            raise RunRequestError(f"environment_urls[{index}]", exc.message, exc.hint or "") from None
    return out


def _credential_ids(body: dict, count: int) -> list[str | None]:
    handles = body.get("credential_ids", [])
    if handles is None:
        handles = []
    if not isinstance(handles, list):
        raise RunRequestError("credential_ids", "must be a list of handles (or nulls)")
    if handles and len(handles) != count:
        raise RunRequestError("credential_ids", f"{len(handles)} handles for {count} environment URLs",
                              "give none, or one handle (or null) per URL")
    handles = [None if handle == PUBLIC_SLOT else handle for handle in handles]  # "-": a public slot
    for index, handle in enumerate(handles):
        if handle is None:
            continue
        if not isinstance(handle, str) or not CREDENTIAL_HANDLE.match(handle):
            raise RunRequestError(f"credential_ids[{index}]", "must be null (or \"-\") for a public slot, or a "
                                  "handle of 1..64 characters [A-Za-z0-9_-]")
    return handles


def _reset_options(body: dict, count: int) -> tuple[dict, list[dict] | None]:
    shared = _object(body.get("reset_options", {}), "reset_options")
    per = body.get("environment_reset_options")
    if per is None:
        return shared, None
    if not isinstance(per, list) or len(per) != count:
        raise RunRequestError("environment_reset_options", f"must hold one object per environment URL ({count})")
    if shared:
        raise RunRequestError("environment_reset_options", "is exclusive with a non-empty reset_options")
    return shared, [{} if entry is None else _object(entry, f"environment_reset_options[{index}]")
                    for index, entry in enumerate(per)]


def _adapter(value: Any, field: str) -> str:
    if value is None:
        return "base"
    if not isinstance(value, str):
        raise RunRequestError(field, "must be an adapter name, or base")
    name = adapter_name(value)
    if name is None:
        return "base"
    if not ADAPTER_NAME.match(name):
        raise RunRequestError(field, f"{name[:80]!r} is not an adapter name", code="invalid_adapter_name",
                              hint="letters, digits, '.', '_' and '-', starting with a letter or digit")
    return name


def _environment_eval(body: dict, out: dict) -> dict:
    value = _object(body["environment_eval"], "environment_eval")
    _unknown(value, EVAL_FIELDS, "environment_eval.")
    where = "environment_eval."
    groups = _int(value, "groups", 20, 1, MAX_GROUPS, where)
    group_size = _int(value, "group_size", 1, 1, 256, where)
    start = _int(value, "seed_start", out["seed_start"] + out["groups"], 0, I64_MAX, where)
    if start + groups - 1 > I64_MAX:
        raise RunRequestError(where + "seed_start", f"the last eval seed exceeds {I64_MAX}")
    if start < out["seed_start"] + out["groups"] and out["seed_start"] < start + groups:
        raise RunRequestError(where + "seed_start", f"the eval seeds [{start}, {start + groups}) overlap the training "
                              f"seeds [{out['seed_start']}, {out['seed_start'] + out['groups']})")
    if out.get("output_adapter") is None or out["output_adapter"] == out["adapter"]:
        raise RunRequestError("environment_eval", "needs an output_adapter different from adapter")
    result = {"groups": groups, "group_size": group_size, "seed_start": start}
    if value.get("gate") is not None:
        gate = _object(value["gate"], where + "gate")
        _unknown(gate, GATE_FIELDS, where + "gate.")
        if groups < MIN_GATE_GROUPS:
            raise RunRequestError(where + "groups", f"a gate needs at least {MIN_GATE_GROUPS} eval groups")
        if isinstance(out.get("post_eval"), dict) and out["post_eval"].get("min_accuracy") is not None:
            raise RunRequestError(where + "gate", "only one gate may own promotion: drop post_eval.min_accuracy")
        normalized = {}
        if gate.get("min_mean_return") is not None:
            normalized["min_mean_return"] = _number(gate, "min_mean_return", None, where + "gate.")
        improvement = _number(gate, "min_mean_improvement", 0.0, where + "gate.")
        if improvement < 0:
            raise RunRequestError(where + "gate.min_mean_improvement", "must be at least 0")
        normalized["min_mean_improvement"] = improvement
        result["gate"] = normalized
    return result


def normalize(body: Any) -> dict:
    """The normalized request, or RunRequestError."""
    body = _object(body, "request")
    _unknown(body, FIELDS, "")
    kind = body.get("kind")
    if kind not in KINDS:
        raise RunRequestError("kind", f"must be rollout or train, not {kind!r}"[:120])
    out: dict[str, Any] = {"kind": kind}
    key = body.get("idempotency_key")
    if key is not None and (not isinstance(key, str) or not IDEMPOTENCY_KEY.match(key)):
        raise RunRequestError("idempotency_key", "must be 1..128 characters of [A-Za-z0-9._:-]",
                              "an opaque, non-secret key, e.g. experiment:counter:17")
    out["idempotency_key"] = key
    urls = _urls(body)
    out["environment_urls"] = urls
    out["credential_ids"] = _credential_ids(body, len(urls))
    out["adapter"] = _adapter(body.get("adapter", "base"), "adapter")
    out["groups"] = _int(body, "groups", 8, 1, MAX_GROUPS)
    out["group_size"] = _int(body, "group_size", 4, 1, 256)
    out["seed_start"] = _int(body, "seed_start", 0, 0, I64_MAX)
    out["reset_options"], out["environment_reset_options"] = _reset_options(body, len(urls))
    out["max_steps"] = _int(body, "max_steps", 8, 1, 256)
    out["concurrency"] = _int(body, "concurrency", 4, 1, 256)
    out["max_action_tokens"] = _int(body, "max_action_tokens", 256, 1, 4096)
    out["temperature"] = _number(body, "temperature", 1.0)
    out["thinking"] = _bool(body, "thinking", True)
    budget = body.get("thinking_budget_tokens")
    if budget is not None:
        budget = _int(body, "thinking_budget_tokens", 0, 1, out["max_action_tokens"] - 1)
        if not out["thinking"]:
            raise RunRequestError("thinking_budget_tokens", "needs thinking on")
    out["thinking_budget_tokens"] = budget
    out["protocol_error_reward"] = _number(body, "protocol_error_reward", -1.0)
    out["max_recoverable_errors"] = _int(body, "max_recoverable_errors", 3, 0, 64)
    out["capacity_wait_seconds"] = _number(body, "capacity_wait_seconds", 300.0)
    out["auto_load"] = _bool(body, "auto_load", True)
    if out["groups"] < len(urls):
        raise RunRequestError("groups", f"{out['groups']} groups cannot cover {len(urls)} environments; every "
                              "configured endpoint must run")
    if kind == "rollout":
        for field in TRAIN_ONLY:
            if body.get(field) is not None:
                raise RunRequestError(field, "is only for kind train (a rollout run collects episodes only)")
    else:
        if body.get("output_adapter") is None:
            raise RunRequestError("output_adapter", "is required for kind train")
        out["output_adapter"] = _adapter(body["output_adapter"], "output_adapter")
        if out["output_adapter"] == "base":
            raise RunRequestError("output_adapter", "must name the adapter to train, not the base model")
        if body.get("training_config") is not None:
            out["training_config"] = _object(body["training_config"], "training_config")
        if body.get("post_eval") is not None:
            out["post_eval"] = _object(body["post_eval"], "post_eval")
        if body.get("environment_eval") is not None:
            out["environment_eval"] = _environment_eval(body, out)
    try:
        collection_config(out, Path("."))
    except OpenEnvError as exc:
        raise RunRequestError("request", exc.message.removeprefix("request: "), exc.hint or "") from None
    return out


def request_digest(request: dict) -> str:
    """sha256 of the normalized request's compact, key-sorted JSON (seeds may exceed 2^53)."""
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def collection_config(request: dict, run_dir: Path, *, credentials=None, kiln_url: str = "in-cluster",
                      reply_timeout_s: float = 60.0) -> CollectionConfig:
    """The collector's typed configuration for a normalized request, writing into `run_dir`;
    `reply_timeout_s` is how long one environment reply may take (the server's [openenv]
    reply_timeout_secs: an operator's setting, not the run's contract)."""
    run_dir = Path(run_dir)
    return CollectionConfig(
        environment_urls=list(request["environment_urls"]), credentials=credentials, kiln_url=kiln_url,
        adapter=request["adapter"], groups=request["groups"], group_size=request["group_size"],
        seed_start=request["seed_start"], max_steps=request["max_steps"], concurrency=request["concurrency"],
        max_action_tokens=request["max_action_tokens"], temperature=request["temperature"],
        thinking=request["thinking"], thinking_budget_tokens=request["thinking_budget_tokens"],
        protocol_error_reward=request["protocol_error_reward"],
        max_recoverable_errors=request["max_recoverable_errors"],
        capacity_wait_seconds=request["capacity_wait_seconds"],
        reset_options=None if request["environment_reset_options"] is not None else request["reset_options"],
        environment_reset_options=request["environment_reset_options"],
        output_path=run_dir / "rollouts.jsonl", replay_output_path=run_dir / "replay.json",
        summary_output_path=run_dir / "summary.json", request_timeout_s=float(reply_timeout_s)).check()
