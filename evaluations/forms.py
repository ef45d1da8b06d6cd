"""The Evaluations pages' HTML forms turned into the bodies the dataset and suite services take.

Only translation: form text to the JSON values the /v1/eval routes take (numbers stay text when
they are no number, so the service's own validation answers with the field's name), uploads to
bytes, and which form field an error belongs next to. Every rule stays in the services and the pure
contracts (evaluations.datasets.*, evaluations.suites). Web-facing: never imports torch or gpu_runtime.
"""

from __future__ import annotations

import json

from django.conf import settings

from core.errors import KilnError
from evaluations.datasets.split import DEFAULT_SPLIT_CONFIG

UPLOAD_FIELDS = ("name", "format", "description", "file")
SPLIT_FIELDS = ("seed", "train_percent", "validation_percent")
SYNTH_FIELDS = ("suite_name", "source_split", "strategy", "scorer_type", "scorer_options", "head_n")
SUITE_FIELDS = ("suite_json",)


def form_error(message: str, field: str) -> KilnError:
    return KilnError("eval_invalid_request", f"{field}: {message}", status=400, field=field)


def number(raw: str):
    """Form text to the JSON number the API takes ("80" -> 80, "12.5" -> 12.5); other text as given."""
    text = raw.strip()
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text


def checked(post, name: str) -> bool:
    return post.get(name) in ("on", "true", "1")


def upload_bytes(upload, field: str) -> bytes:
    """An uploaded file's bytes, refused before reading when it is over the request limit."""
    limit = settings.KILN.max_request_bytes
    if upload.size is not None and upload.size > limit:
        raise KilnError("request_too_large", f"{field}: the file is {upload.size} bytes; an upload may hold at most "
                        f"{limit}", status=413, field=field, hint="raise KILN_MAX_REQUEST_BYTES, or split the file")
    return upload.read()


# ---- upload ------------------------------------------------------------------------------------

def blank_upload() -> dict:
    return {"name": "", "format": "grpo_groups", "description": ""}


def upload_values(post) -> dict:
    return {name: post.get(name, "") for name in ("name", "format", "description")}


def upload_error_field(error: KilnError) -> str:
    """Upload errors without a field are about the file's content (a line that is not a row)."""
    field = (error.field or "").split(".")[0].split("[")[0]
    return field if field in UPLOAD_FIELDS else "file"


# ---- split -------------------------------------------------------------------------------------

def split_values(post=None, current: dict | None = None) -> dict:
    """The re-split form's text: what was posted, else the dataset's current config."""
    if post is not None:
        return {name: post.get(name, "") for name in SPLIT_FIELDS}
    config = {**DEFAULT_SPLIT_CONFIG, **(current or {})}
    return {name: str(config[name]) for name in SPLIT_FIELDS}


def split_config(values: dict) -> dict:
    """The PUT /v1/eval/datasets/{name}/split body; blank fields keep the defaults."""
    config: dict = {}
    if values["seed"].strip():
        config["seed"] = values["seed"].strip()
    for name in ("train_percent", "validation_percent"):
        if values[name].strip():
            config[name] = number(values[name])
    return config


def split_error_field(error: KilnError) -> str:
    field = error.field or ""
    return field if field in SPLIT_FIELDS else ""


# ---- synthesis ---------------------------------------------------------------------------------

def blank_synth(strategy: str) -> dict:
    return {"suite_name": "", "source_split": "holdout", "strategy": strategy, "scorer_type": "exact",
            "scorer_options": "", "head_n": "", "force": False}


def synth_values(post) -> dict:
    return {**{name: post.get(name, "") for name in SYNTH_FIELDS}, "force": checked(post, "force")}


def synth_body(values: dict) -> dict:
    """The POST /v1/eval/datasets/{name}/synthesize body: the scorer is {"type": <select>, **options}."""
    scorer: dict = {}
    if values["scorer_options"].strip():
        try:
            scorer = json.loads(values["scorer_options"])
        except json.JSONDecodeError as exc:
            raise form_error(f"not valid JSON ({exc})", "scorer_options") from None
        if not isinstance(scorer, dict):
            raise form_error('must be a JSON object such as {"pattern": "^\\\\d+$"}', "scorer_options")
    scorer["type"] = values["scorer_type"]
    body = {"suite_name": values["suite_name"].strip(), "source_split": values["source_split"] or "holdout",
            "scorer": scorer, "force": values["force"]}
    if values["strategy"]:
        body["strategy"] = values["strategy"]
    if values["head_n"].strip():
        body["head_n"] = number(values["head_n"])
    return body


def synth_error_field(error: KilnError) -> str:
    field = error.field or ""
    if field == "name" or error.code == "eval_suite_exists":
        return "suite_name"
    if field == "scorer.type":
        return "scorer_type"
    if field.startswith("scorer"):
        return "scorer_options"
    return field if field in SYNTH_FIELDS else ""


# ---- suite create ------------------------------------------------------------------------------

def suite_body(text: str, upload) -> dict:
    """The POST /v1/eval/suites body from the pasted JSON or the uploaded file (exactly one)."""
    if upload is not None and text.strip():
        raise form_error("paste the suite JSON or choose a file, not both", "suite_json")
    if upload is not None:
        raw = upload_bytes(upload, "suite_json")
    elif text.strip():
        raw = text.encode()
    else:
        raise form_error("paste the suite JSON or choose a file", "suite_json")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise form_error(f"not valid JSON ({exc})", "suite_json") from None
    return body


# ---- run an evaluation (the suite page) --------------------------------------------------------

RUN_FIELDS = ("targets", "temperature", "max_tokens", "seed")
RUN_SLOTS = 8  # evaluations.eval_payloads.MAX_TARGETS: one select per target
BASE = "base"


def blank_run() -> dict:
    return {"targets": [BASE] + [""] * (RUN_SLOTS - 1), "temperature": "0", "max_tokens": "256", "seed": ""}


def run_values(post) -> dict:
    """The form's text as posted; `targets` keeps every slot (blank = unused) so the form shows them again."""
    targets = [value.strip() for value in post.getlist("targets")]
    targets += [""] * (RUN_SLOTS - len(targets))
    return {"targets": targets, **{name: post.get(name, "") for name in ("temperature", "max_tokens", "seed")}}


def run_request(values: dict, *, suite_name: str) -> tuple[str, dict]:
    """(mode, body) for evaluations.eval_services.eval_submit: one chosen target is a `run`, two or
    more (the base model may be chosen more than once) a `compare`; blank generation fields keep
    the defaults."""
    chosen = [t for t in values["targets"] if t]
    if not chosen:
        raise form_error("choose a target: the base model or a published adapter", "targets")
    if len(chosen) > RUN_SLOTS:
        raise form_error(f"a compare takes at most {RUN_SLOTS} targets, not {len(chosen)}", "targets")
    generation: dict = {}
    for name in ("temperature", "max_tokens"):
        if values[name].strip():
            generation[name] = number(values[name])
    if values["seed"].strip():
        generation["seed"] = values["seed"].strip()
    body: dict = {"suite_name": suite_name, "generation": generation}
    adapters = [None if t == BASE else t for t in chosen]
    if len(adapters) == 1:
        return "run", {**body, "adapter": adapters[0]}
    return "compare", {**body, "adapters": adapters}


def run_error_field(error: KilnError) -> str:
    """The run form's field an eval_submit error belongs next to ("" for the form as a whole)."""
    field = error.field or ""
    if field in ("targets", "adapter") or field.startswith("adapters"):
        return "targets"
    name = field.removeprefix("generation.")
    return name if name in ("temperature", "max_tokens", "seed") else ""
