"""Tasks, the request template, and rendering one chat-completions body per (task, seed). Pure module.

Imports no Django and no torch: the request contract comes from `adapters.serving.schemas`
(pydantic only), so a body is checked here exactly as the server will check it, before anything
is sent.

Placeholders (`{{name}}`, spaces inside the braces allowed) are substituted inside string values
of the template, anywhere in the body (never in keys):

- `{{prompt}}` is the task's `prompt` field; `{{task.FIELD}}` any task field (`{{task.a.b}}` walks
  nested objects); `{{seed}}` the seed of this request; `{{adapter_label}}` `base` or the adapter
  name; `{{thinking_enabled}}` the --thinking value.
- A placeholder that is the whole string keeps the value's JSON type (`"{{task.max_tokens}}"`
  renders the number 64, `"{{thinking_enabled}}"` a boolean). Inside a longer string a string
  value is inserted as is and any other value as compact JSON (`true`, `64`, `{"a":1}`).
- An unknown placeholder, or a task field the template names but the task lacks, is an error
  naming the task.

The command owns `seed`, `adapter`, `n` (1), `stream` (false), `rollout_provenance` (true),
`chat_template_kwargs.enable_thinking` (--thinking), `thinking_budget_tokens`
(--thinking-budget-tokens) and `thinking_budget_ms` (--thinking-budget-ms): a template may
repeat the value the command will send, but any
other value is refused, as are tools. Messages are normalised to `{role, content[, name,
tool_call_id, reasoning_content]}` with text content (text parts are joined), the same shape
the server samples from and the GRPO admission keeps, so the prompt digest is stable end to end.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from core.contracts.groups import JsonTextError, load_json
from core.contracts.sampling import MAX_SEED, MAX_TOKENS_CAP
from evaluations.generation.errors import RolloutError

PLACEHOLDER = re.compile(r"\{\{\s*([^{}]*?)\s*\}\}")
BASE_LABELS = (None, "", "base")
MESSAGE_ROLES = ("system", "user", "assistant", "tool")
OPTIONAL_MESSAGE_KEYS = ("name", "tool_call_id", "reasoning_content")


@dataclass(frozen=True)
class Task:
    id: str
    fields: dict
    line: int


@dataclass(frozen=True)
class RenderOptions:
    adapter: str  # "base" or an adapter name
    thinking: bool
    thinking_budget_tokens: int | None = None
    thinking_budget_ms: int | None = None  # wall-clock reasoning budget

    @property
    def is_base(self) -> bool:
        return self.adapter in BASE_LABELS

    @property
    def budgets(self) -> dict[str, int]:
        """The request fields of the budgets set: {"thinking_budget_tokens": N, "thinking_budget_ms": M}."""
        return {name: value for name, value in (("thinking_budget_tokens", self.thinking_budget_tokens),
                                                ("thinking_budget_ms", self.thinking_budget_ms)) if value is not None}

    def check_budgets(self) -> None:
        if self.budgets and not self.thinking:
            flags = " and ".join("--" + name.replace("_", "-") for name in self.budgets)
            raise RolloutError("thinking_budget_needs_thinking", f"{flags} needs --thinking true")


# -- inputs -----------------------------------------------------------------------------------


def _read_text(path: Path) -> str:
    """The file as text; a leading UTF-8 BOM (Windows editors write one) is dropped, as the server
    does for dataset files and uploads."""
    return Path(path).read_text(encoding="utf-8-sig")


def load_tasks(path: Path) -> list[Task]:
    """One JSON object a line; each needs a unique `id` (string or integer). Blank lines are skipped.
    NaN and Infinity are refused here: the scorer's payload must be valid JSON."""
    try:
        text = _read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise RolloutError("tasks_unreadable", f"cannot read tasks file {path}: {exc}") from None
    tasks, seen = [], {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = load_json(line)
        except JsonTextError as exc:
            raise RolloutError("tasks_invalid", f"{path}:{number}: {exc}") from None
        if not isinstance(value, dict):
            raise RolloutError("tasks_invalid", f"{path}:{number}: a task must be a JSON object")
        task_id = value.get("id")
        if isinstance(task_id, bool) or not isinstance(task_id, str | int) or task_id == "":
            raise RolloutError("tasks_invalid", f"{path}:{number}: a task needs an `id` (non-empty string or integer)")
        task_id = str(task_id)
        if task_id in seen:
            raise RolloutError("tasks_invalid", f"{path}:{number}: duplicate task id {task_id!r} "
                               f"(first on line {seen[task_id]})")
        seen[task_id] = number
        tasks.append(Task(task_id, value, number))
    if not tasks:
        raise RolloutError("tasks_invalid", f"{path} holds no tasks")
    return tasks


def load_template(path: Path) -> dict:
    try:
        text = _read_text(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise RolloutError("template_unreadable", f"cannot read request template {path}: {exc}") from None
    try:
        template = load_json(text)
    except JsonTextError as exc:
        raise RolloutError("template_invalid", f"{path}: {exc}") from None
    if not isinstance(template, dict):
        raise RolloutError("template_invalid", f"{path}: the request template must be a JSON object")
    if "messages" not in template:
        raise RolloutError("template_invalid", f"{path}: the request template needs `messages`")
    return template


# -- substitution -----------------------------------------------------------------------------


_MISSING = object()


def _lookup(name: str, task: Task, seed: int, options: RenderOptions):
    if name == "prompt":
        value = task.fields.get("prompt", _MISSING)
        if value is _MISSING:
            raise RolloutError("template_field_missing", "the template uses {{prompt}} but the task has no "
                               "`prompt` field", task_id=task.id)
        return value
    if name == "seed":
        return seed
    if name == "adapter_label":
        return "base" if options.is_base else options.adapter
    if name == "thinking_enabled":
        return options.thinking
    if name.startswith("task.") and len(name) > 5:
        value = task.fields
        for part in name[5:].split("."):
            if not isinstance(value, dict) or part not in value:
                raise RolloutError("template_field_missing", f"the template uses {{{{{name}}}}} but the task has "
                                   f"no field {name[5:]!r}", task_id=task.id)
            value = value[part]
        return value
    raise RolloutError("template_placeholder_unknown", f"unknown placeholder {{{{{name}}}}} (known: prompt, "
                       "task.FIELD, seed, adapter_label, thinking_enabled)", task_id=task.id)


def _substitute(value, task: Task, seed: int, options: RenderOptions):
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole:
            return _lookup(whole.group(1), task, seed, options)

        def one(match):
            found = _lookup(match.group(1), task, seed, options)
            return found if isinstance(found, str) else json.dumps(found, separators=(",", ":"), ensure_ascii=False)

        return PLACEHOLDER.sub(one, value)
    if isinstance(value, list):
        return [_substitute(v, task, seed, options) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, task, seed, options) for k, v in value.items()}
    return value


def substitute(template: dict, task: Task, *, seed: int, options: RenderOptions) -> dict:
    """The template with every placeholder replaced (no owned-field handling)."""
    return _substitute(template, task, seed, options)


# -- owned fields and messages ----------------------------------------------------------------


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _refuse(task: Task, message: str):
    return RolloutError("template_owned_field", message, task_id=task.id,
                        hint="remove the field from the request template; rollout-generate sets it")


def _check_owned(body: dict, task: Task, seed: int, options: RenderOptions) -> None:
    if "n" in body and not (_is_int(body["n"]) and body["n"] == 1):
        raise _refuse(task, f"the template sets n to {body['n']!r}; rollout-generate sends n=1 (one request per seed)")
    if "stream" in body and body["stream"] is not False:
        raise _refuse(task, f"the template sets stream to {body['stream']!r}; rollout-generate sends stream=false")
    if "rollout_provenance" in body and body["rollout_provenance"] is not True:
        raise _refuse(task, f"the template sets rollout_provenance to {body['rollout_provenance']!r}; "
                      "rollout-generate always requests provenance")
    if "seed" in body and not (_is_int(body["seed"]) and body["seed"] == seed):
        raise _refuse(task, f"the template sets seed to {body['seed']!r}, but this request's seed is {seed} "
                      "(use --seed-start/--seeds, or \"{{seed}}\")")
    if "adapter" in body:
        same = body["adapter"] in BASE_LABELS if options.is_base else body["adapter"] == options.adapter
        if not same:
            raise _refuse(task, f"the template sets adapter to {body['adapter']!r}, but --adapter is {options.adapter!r}")
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        if not isinstance(kwargs, dict):
            raise _refuse(task, "chat_template_kwargs must be an object")
        extra = sorted(set(kwargs) - {"enable_thinking"})
        if extra:
            raise _refuse(task, f"chat_template_kwargs {', '.join(extra)} are not supported (only enable_thinking, "
                          "which --thinking sets)")
        if "enable_thinking" in kwargs and kwargs["enable_thinking"] is not options.thinking:
            raise _refuse(task, f"the template sets chat_template_kwargs.enable_thinking to "
                          f"{kwargs['enable_thinking']!r}, but --thinking is {str(options.thinking).lower()}")
    for name in ("thinking_budget_tokens", "thinking_budget_ms"):
        if name in body and body[name] != getattr(options, name):
            raise _refuse(task, f"the template sets {name} to {body[name]!r}; use --{name.replace('_', '-')}")
    for key in ("tools", "functions"):
        if body.get(key):
            raise RolloutError("template_tools_refused", f"the template asks for {key}; rollout-generate does not "
                               "support tool calls (use kiln openenv for tool-using environments)", task_id=task.id)
    if body.get("tool_choice") not in (None, "none") or body.get("function_call") not in (None, "none"):
        raise RolloutError("template_tools_refused", "the template sets tool_choice; rollout-generate does not "
                           "support tool calls", task_id=task.id)


def normalize_message(message, task: Task, index: int) -> dict:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise RolloutError("template_invalid", f"{where} must be an object with role and content", task_id=task.id)
    if message.get("tool_calls"):
        raise RolloutError("template_tools_refused", f"{where} carries tool_calls; tool calls are not supported",
                           task_id=task.id)
    unknown = sorted(set(message) - {"role", "content", "tool_calls", *OPTIONAL_MESSAGE_KEYS})
    if unknown:
        raise RolloutError("template_invalid", f"{where} has unsupported fields: {', '.join(unknown)}", task_id=task.id)
    role = message.get("role")
    if role not in MESSAGE_ROLES:
        raise RolloutError("template_invalid", f"{where}.role must be one of {', '.join(MESSAGE_ROLES)}",
                           task_id=task.id)
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type", "text") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise RolloutError("template_invalid", f"{where}.content parts must be text parts", task_id=task.id)
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise RolloutError("template_invalid", f"{where}.content must render to text (got {type(content).__name__}"
                           "); check the placeholder's task field", task_id=task.id)
    out = {"role": role, "content": content}
    for key in OPTIONAL_MESSAGE_KEYS:
        if message.get(key) is not None:
            if not isinstance(message[key], str):
                raise RolloutError("template_invalid", f"{where}.{key} must be a string", task_id=task.id)
            out[key] = message[key]
    return out


def render_request(template: dict, task: Task, *, seed: int, options: RenderOptions) -> dict:
    """The exact /v1/chat/completions body for one (task, seed), validated as the server will."""
    if not _is_int(seed) or not 0 <= seed <= MAX_SEED:
        raise RolloutError("seed_invalid", f"seed {seed!r} is outside 0..{MAX_SEED}", task_id=task.id)
    options.check_budgets()
    body = substitute(template, task, seed=seed, options=options)
    _check_owned(body, task, seed, options)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RolloutError("template_invalid", "messages must render to a non-empty list", task_id=task.id)
    body["messages"] = [normalize_message(m, task, i) for i, m in enumerate(messages)]
    body.pop("tool_choice", None)
    body.pop("tools", None)
    body.update({"n": 1, "stream": False, "seed": seed, "adapter": "base" if options.is_base else options.adapter,
                 "rollout_provenance": True, "chat_template_kwargs": {"enable_thinking": options.thinking}})
    body.pop("thinking_budget_tokens", None)
    body.pop("thinking_budget_ms", None)
    body.update(options.budgets)
    parse_request(body, task)
    return body


def parse_request(body: dict, task: Task):
    """The server's own ChatCompletionRequest for `body`; a refusal names the task."""
    from pydantic import ValidationError

    from adapters.serving.schemas import ChatCompletionRequest

    try:
        parsed = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        raise RolloutError("request_invalid", f"the rendered request is not a valid chat completion ({problems})",
                           task_id=task.id) from None
    if (parsed.effective_max_tokens or 0) > MAX_TOKENS_CAP:
        raise RolloutError("request_invalid", f"max_tokens {parsed.effective_max_tokens} exceeds the server cap "
                           f"{MAX_TOKENS_CAP}", task_id=task.id)
    return parsed


def template_warnings(template: dict) -> list[str]:
    """A line for each top-level key of the template that is no chat-completions field: the server ignores
    unknown fields (as OpenAI's routes do), so a misspelt `max_token` sampled 256 tokens unsaid (QA)."""
    import difflib

    from adapters.serving.schemas import ChatCompletionRequest

    known = sorted(ChatCompletionRequest.model_fields)
    warnings = []
    for key in sorted(k for k in template if k not in ChatCompletionRequest.model_fields):
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.75)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        warnings.append(f"the request template's {key[:60]!r} is not a chat completions field: the server ignores "
                        f"it{guess}")
    return warnings
