"""Dashboard page Training → GRPO (/ui/training/grpo/): the submission form and the training queue.

The view only turns the HTML form into the request body that POST /v1/train/grpo takes (an uploaded
JSONL file becomes `groups`, the advanced JSON is merged into `config`, the "Prove it after training"
section becomes `post_eval`) and hands it to
training.services.grpo_submit, which decides everything; a KilnError is shown next to the field it
names, and nothing is queued. Reads go through selectors (training/fragments.py).
Web-facing: never imports torch, transformers, peft or gpu_runtime (only training.services does,
for the torch-free request contract).
"""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.shortcuts import redirect, render

from adapters.models import AdapterState
from adapters.selectors import adapter_list
from core.contracts.groups import MAX_CORPUS_BYTES, GroupError, check_corpus_size, parse_jsonl
from core.errors import KilnError
from evaluations.suite_selectors import suite_list
from training import fragments as training_fragments
from training.services import grpo_submit

ROUTE = "/ui/training/grpo/"
BEHAVIOR_POLICIES = (
    ("no_importance_correction", "no_importance_correction: ratio fixed at 1 (any scored groups)"),
    ("recorded", "recorded: importance-corrected (needs provenance on every rollout)"),
)
TEXT_FIELDS = ("dataset_path", "output_name", "behavior_policy", "base_adapter", "lora_rank",
               "learning_rate", "kl_coeff", "checkpoint_interval", "seed", "advanced_config",
               "post_eval_suite", "post_eval_data_scope", "post_eval_min_accuracy")
INT_FIELDS = ("lora_rank", "checkpoint_interval")
FLOAT_FIELDS = ("learning_rate", "kl_coeff")
# config.<name> errors are shown next to these form fields; other config fields next to the JSON.
CONFIG_FIELDS = ("output_name", "behavior_policy", "base_adapter", "lora_rank", "learning_rate", "kl_coeff",
                 "checkpoint_interval", "auto_load", "seed")
# The "Prove it after training" section: post_eval.<name> errors are shown next to these fields.
POST_EVAL_FIELDS = ("suite", "data_scope", "min_accuracy", "include_baseline")
DATA_SCOPES = (
    ("held-out", "held-out: the suite must not overlap the training data (the gate may decide activation)"),
    ("train-set-eval", "train-set-eval: diagnostic only, on training data (no gate, no min accuracy)"),
)
PERMISSION_TEXT = ("You lack the submit_job permission, so you cannot start training. "
                   "An administrator can grant it in /admin/ (Users → permissions).")


def _form_error(message: str, field: str) -> KilnError:
    return KilnError("training_invalid_request", message, status=400, field=field)


def form_number(raw: str, kind):
    """Form text to the JSON number the API takes; text that is no number goes on as given, so the
    service's validation answers it with the field's name."""
    try:
        return kind(raw)
    except ValueError:
        return raw


def _groups_from_upload(upload) -> list:
    """One group per non-blank line of the uploaded JSONL, read by the corpus contract (the service
    validates each group). The upload becomes the request's inline `groups`, so it is bounded like
    any request body (KILN_MAX_REQUEST_BYTES, refused with request_too_large as the datasets form
    refuses it); a larger corpus goes by `dataset_path` (streamed, up to MAX_CORPUS_BYTES) or as an
    uploaded dataset."""
    limit = settings.KILN.max_request_bytes
    if upload.size is not None and upload.size > limit:
        raise KilnError("request_too_large", f"jsonl_file: the file is {upload.size} bytes; an upload may hold at "
                        f"most {limit}", status=413, field="jsonl_file",
                        hint=f"raise KILN_MAX_REQUEST_BYTES, or give the file's \"Path on the server\" instead "
                             f"(read in place, up to {MAX_CORPUS_BYTES} bytes)")
    try:
        check_corpus_size(upload.size, "jsonl_file")
        return parse_jsonl(upload.read(), "jsonl_file", require_groups=False)[0]
    except GroupError as exc:
        raise _form_error(f"jsonl_file: {exc.field} {exc.message}" if exc.field.startswith("line ")
                          else f"jsonl_file: {exc.message}", "jsonl_file") from None


def post_eval_from_form(values: dict) -> dict | None:
    """The request's `post_eval` from a form's post-eval section (the GRPO and OpenEnv forms share the
    field names), or None when it is left blank. Its rules
    (suite required, min_accuracy in [0, 1] and refused with train-set-eval) are PostEvalConfig's."""
    suite = values["post_eval_suite"].strip()
    scope = values["post_eval_data_scope"].strip() or "held-out"
    minimum = values["post_eval_min_accuracy"].strip()
    if not (suite or minimum or values["post_eval_include_baseline"] or scope != "held-out"):
        return None
    post_eval: dict = {"suite": suite, "data_scope": scope, "include_baseline": values["post_eval_include_baseline"]}
    if minimum:
        post_eval["min_accuracy"] = form_number(minimum, float)
    return post_eval


def _request_body(values: dict, files) -> dict:
    """The POST /v1/train/grpo body this form describes."""
    config: dict = {}
    if values["advanced_config"].strip():
        try:
            config = json.loads(values["advanced_config"])
        except json.JSONDecodeError as exc:
            raise _form_error(f"config (advanced JSON): not valid JSON ({exc})", "advanced_config") from None
        if not isinstance(config, dict):
            raise _form_error("config (advanced JSON): must be a JSON object such as {\"is_level\": \"sequence\"}",
                              "advanced_config")
    # The fields above the JSON win over the same keys inside it; blank fields keep the defaults.
    for name in ("output_name", "behavior_policy", "base_adapter"):
        if values[name].strip():
            config[name] = values[name].strip()
    seed = values["seed"].strip()
    if seed:
        # A u64 seed goes on as the decimal string the API takes (JSON numbers stop at 2**53); any other
        # text is read as a number where it is one ("-5"), so the API's own bound answers it.
        config["seed"] = seed if seed.isascii() and seed.isdigit() else form_number(seed, int)
    for name in INT_FIELDS:
        if values[name].strip():
            config[name] = form_number(values[name].strip(), int)
    if values["lora_rank"].strip() and "lora_alpha" not in config and isinstance(config.get("lora_rank"), int):
        # The default alpha/rank ratio (2), as `kiln train grpo --lora-rank` keeps it: the default alpha
        # (32) over a rank below 16 passes the LoRA scale limit and was refused (unsafe_lora_scale).
        config["lora_alpha"] = 2 * config["lora_rank"]
    for name in FLOAT_FIELDS:
        if values[name].strip():
            config[name] = form_number(values[name].strip(), float)
    config["auto_load"] = values["auto_load"]
    body: dict = {"config": config}
    post_eval = post_eval_from_form(values)
    if post_eval is not None:
        body["post_eval"] = post_eval
    upload = files.get("jsonl_file")
    if upload is not None:
        body["groups"] = _groups_from_upload(upload)
    if values["dataset_path"].strip():
        body["dataset_path"] = values["dataset_path"].strip()
    return body


def error_field(error: KilnError) -> str:
    """The form field an error belongs next to ("" for the form as a whole)."""
    field = error.field or ""
    if error.code in ("invalid_adapter_name", "adapter_revision_conflict") or error.message.startswith("output_name:"):
        return "output_name"
    if field in ("source", "dataset_split"):
        return "source"
    if field.startswith(("groups", "agentic_groups", "rollouts", "jsonl_file")):
        return "jsonl_file"
    if field.startswith("dataset_path"):
        return "dataset_path"
    if field == "advanced_config":
        return field
    if field.startswith("post_eval"):
        name = field.removeprefix("post_eval").lstrip(".").split(".")[0].split("[")[0]
        return f"post_eval_{name}" if name in POST_EVAL_FIELDS else "post_eval"
    if field.startswith("config"):
        name = field.removeprefix("config").lstrip(".").split(".")[0].split("[")[0]
        return name if name in CONFIG_FIELDS else "advanced_config"
    return ""


def _published_adapters():
    return [adapter for adapter in adapter_list() if adapter.state == AdapterState.PUBLISHED]


def _render(request, *, values: dict, error: KilnError | None = None, forbidden: str = "", status: int = 200):
    context = {
        "values": values,
        "error": error,
        "error_field": error_field(error) if error else "",
        "forbidden": forbidden,
        "behavior_policies": BEHAVIOR_POLICIES,
        "base_adapters": _published_adapters(),
        "suites": list(suite_list()),
        "data_scopes": DATA_SCOPES,
        "can_submit": request.user.has_perm("jobs.submit_job"),
        # Said before the form is filled: a submission would be refused with 503 mock_mode.
        "no_model": settings.KILN.model_path is None,
        "placeholders": _placeholders(),
        **training_fragments.queue_context(),
    }
    return render(request, "ui/training_grpo.html", context, status=status)


def _placeholders() -> dict:
    """What a blank field gets: the server's [training.defaults] where it sets one (the demo's learning
    rate 3e-5), else the built-in default."""
    defaults = settings.KILN.training_defaults or {}
    shown = {"lora_rank": "16", "learning_rate": "auto (optimizer default)", "kl_coeff": "0.1",
             "checkpoint_interval": "no checkpoints"}
    for name in shown:
        if defaults.get(name) is not None:
            shown[name] = f"{defaults[name]:g} (server default)" if isinstance(defaults[name], float) else \
                f"{defaults[name]} (server default)"
    return shown


def _blank_values() -> dict:
    return {**{name: "" for name in TEXT_FIELDS}, "behavior_policy": "no_importance_correction", "auto_load": True,
            "post_eval_data_scope": "held-out", "post_eval_include_baseline": False}


@login_required
def grpo_page(request):
    if request.method != "POST":
        return _render(request, values=_blank_values())
    values = {**{name: request.POST.get(name, "") for name in TEXT_FIELDS},
              "auto_load": request.POST.get("auto_load") in ("on", "true", "1"),
              "post_eval_include_baseline": request.POST.get("post_eval_include_baseline") in ("on", "true", "1")}
    if not request.user.has_perm("jobs.submit_job"):
        return _render(request, values=values, forbidden=PERMISSION_TEXT, status=403)
    try:
        job, _seed = grpo_submit(body=_request_body(values, request.FILES), user=request.user, route=ROUTE)
    except KilnError as exc:
        return _render(request, values=values, error=exc, status=exc.status)
    return redirect("ui:job_detail", job_id=job.uuid)
