"""Submit recorded-policy rollout generation (`rollouts.generate`): sample, then score, on the server.

`rollouts_submit` makes every refusal `kiln rollout-generate` makes before its first request, with
the same pure modules (`evaluations.generation`): the tasks and the request template are pinned as
read-only files under KILN_HOME/rollouts/inputs/<id>/, loaded with `load_tasks`/`load_template`,
and every (task, seed) body is rendered and checked by `plan_requests`; then the job is queued on
the control queue (evaluations/rollout_jobs.py runs it). A refusal leaves nothing behind.

Training on the output is the training app's (`training.rollout_services.rollouts_train_submit`).

Imports no torch. Web modules reach `core.contracts.provenance` (pure) through
`evaluations.generation.validation`.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from adapters.selectors import adapter_published_path
from core.artifacts import write_file
from core.canonical import sha256_digest
from core.errors import KilnError
from core.jobs.services import job_submit
from core.model_weights import require_model_weights
from evaluations.generation.errors import RolloutError
from evaluations.generation.generate import plan_requests
from evaluations.generation.template import MAX_SEED, RenderOptions, load_tasks, load_template
from evaluations.payloads import RolloutsJobPayload
from evaluations.rollout_selectors import (
    ROLLOUTS_KIND,
    rollouts_root,
)
from evaluations.selectors import scorer_get

MAX_TASKS_BYTES = 8 << 20
MAX_TEMPLATE_BYTES = 256 << 10
MAX_SEEDS = 64
MAX_CONCURRENCY = 16
MAX_REQUESTS = 4096
ROUTE = "/ui/training/rollouts/"
TASKS_CODES = ("tasks_",)
THINKING_CODES = ("thinking_budget_needs_thinking",)


def _invalid(message: str, field: str, hint: str = "", code: str = "rollouts_invalid_request") -> KilnError:
    return KilnError(code, f"{field}: {message}", hint=hint, status=400, field=field)


def _int(value, field: str, *, low: int, high: int) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise _invalid(f"{value!r} is not an integer", field) from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _invalid("must be an integer", field)
    if not low <= value <= high:
        raise _invalid(f"must lie within {low}..{high} (got {value})", field)
    return value


def _adapter(value) -> str:
    name = (value or "").strip() if isinstance(value, str) else ""
    if name in ("", "base"):
        return "base"
    if adapter_published_path(name=name) is None:
        raise _invalid(f"no published adapter named {name!r}", "adapter",
                       "choose 'base' or an adapter that finished training")
    return name


def _template_text(upload: bytes | None, text: str) -> bytes:
    text = text or ""
    if upload and text.strip():
        raise _invalid("give the request template once: upload request.json or paste it, not both",
                       "request_template")
    data = upload if upload else text.encode()
    if not data.strip():
        raise _invalid("a request template is required (a chat-completions body with {{prompt}})",
                       "request_template")
    if len(data) > MAX_TEMPLATE_BYTES:
        raise _invalid(f"the template is larger than {MAX_TEMPLATE_BYTES} bytes", "request_template")
    return data


def _field_for(error: RolloutError) -> str:
    if error.code.startswith(TASKS_CODES):
        return "tasks"
    if error.code in THINKING_CODES:
        return "thinking_budget_tokens"
    return "request_template"


def _pin(directory: Path, name: str, data: bytes) -> Path:
    return write_file(directory / name, data, mode=0o444, exclusive=True)


def rollouts_submit(*, tasks: bytes | None, tasks_filename: str = "tasks.jsonl", template_upload: bytes | None = None,
                    template_text: str = "", template_filename: str = "request.json", scorer: str,
                    adapter: str = "base", seeds=1, seed_start=0, thinking: bool = False,
                    thinking_budget_tokens=None, concurrency=4, user=None, route: str = ROUTE):
    """Validate a generation request in full and queue it; returns the job. Raises KilnError."""
    require_model_weights(needed_for="to sample rollouts from")  # refused now, not after a job's retries
    adapter_name = _adapter(adapter)
    registered = scorer_get(name=(scorer or "").strip()) if isinstance(scorer, str) else None
    if registered is None:
        raise _invalid(f"no registered scorer named {scorer!r}" if scorer else "choose a registered scorer", "scorer",
                       "register the scorer script first (Register a scorer)")
    seeds = _int(seeds, "seeds", low=1, high=MAX_SEEDS)
    seed_start = _int(seed_start, "seed_start", low=0, high=MAX_SEED)
    if seed_start + seeds - 1 > MAX_SEED:
        raise _invalid(f"the last seed {seed_start + seeds - 1} exceeds {MAX_SEED}", "seed_start")
    concurrency = _int(concurrency, "concurrency", low=1, high=MAX_CONCURRENCY)
    budget = None
    if thinking_budget_tokens not in (None, ""):
        budget = _int(thinking_budget_tokens, "thinking_budget_tokens", low=1, high=1 << 20)
        if not thinking:
            raise _invalid("a thinking budget needs thinking on", "thinking_budget_tokens")
    if not tasks or not tasks.strip():
        raise _invalid("upload a tasks.jsonl file (one JSON object with a unique id per line)", "tasks")
    if len(tasks) > MAX_TASKS_BYTES:
        raise _invalid(f"the file is larger than {MAX_TASKS_BYTES} bytes", "tasks")
    template_bytes = _template_text(template_upload, template_text)
    options = RenderOptions(adapter=adapter_name, thinking=bool(thinking), thinking_budget_tokens=budget)

    inputs = rollouts_root() / "inputs" / uuid.uuid4().hex
    inputs.mkdir(parents=True)
    try:
        tasks_path = _pin(inputs, "tasks.jsonl", tasks)
        template_path = _pin(inputs, "request.json", template_bytes)
        names = {str(tasks_path): tasks_filename or "tasks.jsonl", str(template_path): template_filename or "request.json"}
        try:
            loaded_tasks = load_tasks(tasks_path)
            template = load_template(template_path)
            seed_list = list(range(seed_start, seed_start + seeds))
            if len(loaded_tasks) * seeds > MAX_REQUESTS:
                raise _invalid(f"{len(loaded_tasks)} tasks × {seeds} seeds is {len(loaded_tasks) * seeds} requests; "
                               f"at most {MAX_REQUESTS} per run", "seeds", "split the tasks over several runs")
            plan_requests(template, loaded_tasks, seed_list, options)  # every refusal before anything is queued
        except RolloutError as exc:
            message = exc.message
            for pinned, shown in names.items():
                message = message.replace(pinned, shown)
            field = _field_for(exc)
            raise KilnError(exc.code, f"{field}: {message}", hint=exc.hint, status=400, field=field) from None
        payload = RolloutsJobPayload(
            route=route, adapter=adapter_name, thinking=bool(thinking), thinking_budget_tokens=budget,
            seed_start=seed_start, seed_count=seeds, concurrency=concurrency, requests=len(loaded_tasks) * seeds,
            scorer={"name": registered.name, "filename": registered.filename, "sha256": registered.sha256},
            inputs={
                "dir": str(inputs),
                "tasks": {"path": str(tasks_path), "filename": names[str(tasks_path)],
                          "sha256": sha256_digest(tasks), "count": len(loaded_tasks)},
                "request_template": {"path": str(template_path), "filename": names[str(template_path)],
                                     "sha256": sha256_digest(template_bytes)},
            },
        )
        title = f"Rollouts · {len(loaded_tasks)} task{'s' if len(loaded_tasks) != 1 else ''} × {seeds} seed" \
                f"{'s' if seeds != 1 else ''} · {adapter_name} · {registered.name}"
        return job_submit(kind=ROLLOUTS_KIND, payload=payload, title=title, user=user)
    except BaseException:
        shutil.rmtree(inputs, ignore_errors=True)
        raise
