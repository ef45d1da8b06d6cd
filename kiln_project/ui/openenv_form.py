"""Training → OpenEnv's run form: the HTML form's fields to the POST /v1/openenv/runs body, and back.

Presentation only: `form_values` reads the posted fields (environment rows are aligned lists),
`request_body` turns them into the `OpenEnvRunRequest` body the API takes (blank fields are left
out so the request's own defaults apply; text that is no number goes on as given, so the
request's validation answers it with the field's name), and `error_field` places an error from
the submit service next to the form field it names. No rule about runs is decided here: every
rule is `openenv.runs.request.normalize`'s and the run services'. Imports no Django model, no
torch.
"""

from __future__ import annotations

import json
import re
import uuid

from core.errors import KilnError
from training.views import form_number, post_eval_from_form

KEY_PREFIX = "ui:"
# Plain request fields that are one text input each: (name, type).
NUMBER_FIELDS = (
    ("groups", int), ("group_size", int), ("seed_start", int), ("max_steps", int), ("concurrency", int),
    ("max_action_tokens", int), ("temperature", float), ("thinking_budget_tokens", int),
    ("protocol_error_reward", float), ("max_recoverable_errors", int), ("capacity_wait_seconds", float),
)
# GRPO overrides offered as fields (Kiln owns output_name, base_adapter, auto_load, behavior_policy).
TRAINING_FIELDS = (("lora_rank", int), ("learning_rate", float), ("kl_coeff", float),
                   ("checkpoint_interval", int), ("seed", int))
EVAL_FIELDS = (("groups", int), ("group_size", int), ("seed_start", int))
GATE_FIELDS = (("min_mean_return", float), ("min_mean_improvement", float))
TEXT_FIELDS = (
    "kind", "idempotency_key", "adapter", "reset_options", "output_adapter", "training_config_json",
    *(name for name, _ in NUMBER_FIELDS), *(f"tc_{name}" for name, _ in TRAINING_FIELDS),
    "post_eval_suite", "post_eval_data_scope", "post_eval_min_accuracy",
    *(f"ee_{name}" for name, _ in EVAL_FIELDS), *(f"gate_{name}" for name, _ in GATE_FIELDS),
)
CHECKBOXES = ("thinking", "auto_load", "post_eval_include_baseline", "environment_eval", "gate")
DEFAULTS = {"kind": "rollout", "adapter": "base", "groups": "8", "group_size": "4", "seed_start": "0",
            "max_steps": "8", "concurrency": "4", "max_action_tokens": "256", "temperature": "1.0",
            "protocol_error_reward": "-1.0", "max_recoverable_errors": "3", "capacity_wait_seconds": "300",
            "post_eval_data_scope": "held-out", "ee_groups": "20", "ee_group_size": "1"}
INDEXED = re.compile(r"^(environment_urls|credential_ids|environment_reset_options)\[(\d+)\]")
ROW_FIELD = {"environment_urls": "environment_url", "credential_ids": "credential_id",
             "environment_reset_options": "environment_reset_options"}


def new_idempotency_key() -> str:
    """A fresh key for one rendering of the form: the same page submitted twice is one run."""
    return KEY_PREFIX + uuid.uuid4().hex


def blank_values() -> dict:
    values = {name: DEFAULTS.get(name, "") for name in TEXT_FIELDS}
    values.update(thinking=True, auto_load=True, post_eval_include_baseline=False, environment_eval=False,
                  gate=False, rows=[{"url": "", "credential": "", "reset": ""}])
    return values


def form_values(post) -> dict:
    """The posted form as the template shows it again (rows: one dict per environment row)."""
    values = {name: post.get(name, "") for name in TEXT_FIELDS}
    values.update({name: post.get(name) in ("on", "true", "1") for name in CHECKBOXES})
    urls, handles = post.getlist("environment_url"), post.getlist("credential_id")
    resets = post.getlist("environment_reset_options")
    count = max(len(urls), len(handles), len(resets), 1)

    def at(items, index):
        return items[index] if index < len(items) else ""

    rows = [{"url": at(urls, i), "credential": at(handles, i), "reset": at(resets, i)} for i in range(count)]
    # Rows left wholly blank are dropped, so an error's index names the row shown at that index.
    values["rows"] = [row for row in rows if any(v.strip() for v in row.values())] or rows[:1]
    return values


def _invalid(field: str, message: str, hint: str = "") -> KilnError:
    return KilnError("openenv_invalid_request", f"request: {field}: {message}", status=400, field=field,
                     hint=hint or "see OpenEnvRunRequest in /v1/openapi.json")


def _json_object(text: str, field: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid(field, f"not valid JSON ({exc})", 'a JSON object such as {"target": 4}') from None


def _numbers(values: dict, fields, prefix: str = "") -> dict:
    out = {}
    for name, kind in fields:
        raw = values[prefix + name].strip()
        if raw:
            out[name] = form_number(raw, kind)
    return out


def _environment_eval(values: dict) -> dict | None:
    """The `environment_eval` block, only when its checkbox is on (or the gate's, which needs the
    evaluation): numbers typed into the section while both are off are not sent, so a rollout's form
    never carries a block that only kind train takes. The gate sub-block goes with the gate checkbox."""
    if not (values["environment_eval"] or values["gate"]):
        return None
    evaluation = _numbers(values, EVAL_FIELDS, "ee_")
    if values["gate"]:
        evaluation["gate"] = _numbers(values, GATE_FIELDS, "gate_")
    return evaluation


def _training_config(values: dict) -> dict | None:
    config: dict = {}
    if values["training_config_json"].strip():
        config = _json_object(values["training_config_json"], "training_config")
        if not isinstance(config, dict):
            raise _invalid("training_config", "must be a JSON object such as {\"is_level\": \"sequence\"}")
    fields = _numbers(values, TRAINING_FIELDS, "tc_")
    config.update(fields)  # the fields win over the same keys in the JSON
    if "lora_rank" in fields and isinstance(fields["lora_rank"], int):
        config.setdefault("lora_alpha", 2 * fields["lora_rank"])  # as the CLI's --lora-rank: alpha/rank stays 2
    return config or None


def request_body(values: dict) -> dict:
    """The POST /v1/openenv/runs body this form describes."""
    rows = values["rows"]
    body: dict = {"kind": values["kind"].strip() or "rollout",
                  "environment_urls": [row["url"].strip() for row in rows]}
    if values["idempotency_key"].strip():
        body["idempotency_key"] = values["idempotency_key"].strip()
    if any(row["credential"].strip() for row in rows):
        body["credential_ids"] = [row["credential"].strip() or None for row in rows]
    if values["adapter"].strip():
        body["adapter"] = values["adapter"].strip()
    body.update(_numbers(values, NUMBER_FIELDS))
    if values["reset_options"].strip():
        body["reset_options"] = _json_object(values["reset_options"], "reset_options")
    if any(row["reset"].strip() for row in rows):
        body["environment_reset_options"] = [
            _json_object(row["reset"], f"environment_reset_options[{index}]") if row["reset"].strip() else {}
            for index, row in enumerate(rows)]
    body["thinking"] = values["thinking"]
    body["auto_load"] = values["auto_load"]
    if values["output_adapter"].strip():
        body["output_adapter"] = values["output_adapter"].strip()
    for field, value in (("training_config", _training_config(values)), ("post_eval", post_eval_from_form(values)),
                         ("environment_eval", _environment_eval(values))):
        if value is not None:
            body[field] = value
    return body


def error_field(error: KilnError, values: dict) -> str:
    """The form field an error belongs next to ("" for the form as a whole)."""
    field = error.field or ""
    indexed = INDEXED.match(field)
    if indexed:
        return f"{ROW_FIELD[indexed.group(1)]}-{indexed.group(2)}"
    if error.code in ("openenv_credential_not_found", "openenv_credential_invalid"):
        for index, row in enumerate(values["rows"]):
            if row["credential"].strip():
                return f"credential_id-{index}"
    if error.code == "openenv_remote_environment_refused" or field == "environment_urls":
        return "environment_url-0"
    if field.startswith("environment_eval"):
        parts = field.split(".")
        if len(parts) == 3 and parts[1] == "gate":
            return f"gate_{parts[2]}"
        if len(parts) == 2 and parts[1] in dict(EVAL_FIELDS):
            return f"ee_{parts[1]}"
        return "environment_eval"
    if field.startswith("training_config"):
        name = field.removeprefix("training_config").lstrip(".").split(".")[0].split("[")[0]
        return f"tc_{name}" if name in dict(TRAINING_FIELDS) else "training_config_json"
    if field.startswith("post_eval"):
        name = field.removeprefix("post_eval").lstrip(".").split(".")[0]
        return f"post_eval_{name}" if name in ("suite", "data_scope", "min_accuracy") else "post_eval_suite"
    if field in TEXT_FIELDS:
        return field
    if field in ("credential_ids", "environment_reset_options"):
        return f"{ROW_FIELD[field]}-0"
    return ""
