"""Plan, send, validate and score every (task, seed) request. Pure module: no Django, no torch, no HTTP.

The caller supplies the transport and the scorer as callables, so the command wires in KilnClient
and the scorer sandbox while tests use fakes:

- `post(body) -> dict` sends one /v1/chat/completions body and returns the parsed response; an
  exception with `code`/`message` attributes (CliError) is reported as the request's failure;
- `score(payload) -> result` runs the scorer on the payload and returns an object with `reward`,
  `raw_output`, `stderr_tail`, `elapsed_ms`, `sandboxed`, `mechanism` (ScorerResult); an
  exception with `code`/`message`/`stderr_tail` (ScorerError) is the scorer's failure.

Every request body is rendered (and checked as the server would) before the first one is sent.
Requests run on up to `concurrency` daemon threads; the first failure stops the run at once and
is raised as a RolloutError naming the task and seed (requests already in flight are abandoned).
A request the server refused because its GPU worker is gone or restarting (RESENDABLE_CODES) is
sent again after a wait (ResendPolicy): requests are seeded, so the resent answer is the one the
first would have been, and it is validated like any other.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from core.contracts.groups import REWARD_RANGE, reward_in_range
from evaluations.generation.errors import RolloutError, one_line
from evaluations.generation.template import RenderOptions, Task, parse_request, render_request
from evaluations.generation.validation import CheckedRollout, validate_response

STDERR_TAIL_CHARS = 1000
# The server's answers that mean "the GPU worker is gone, stopping or not back yet", not "this
# request is wrong" (adapters/serving: the worker lost mid-request, kiln serve stopping or restarting
# it, no worker or model yet; the API's own 503 when Redis does not answer). Nothing else is resent.
RESENDABLE_CODES = frozenset({"inference_worker_lost", "server_shutting_down", "sampler_stopped",
                              "inference_unavailable", "model_loading", "service_unavailable"})


@dataclass(frozen=True)
class ResendPolicy:
    """How long one request waits, in all, for the GPU worker to come back before its failure ends the
    run; the pauses double from first_delay_s up to max_delay_s, or follow the server's Retry-After."""

    window_s: float = 120.0
    first_delay_s: float = 1.0
    max_delay_s: float = 15.0
    sleep: Callable[[float], None] = time.sleep
    notify: Callable[[str], None] | None = None  # one line per resend, e.g. to stderr


NO_RESEND = ResendPolicy(window_s=0.0)  # the default: a caller opts in (the CLI does)


@dataclass(frozen=True)
class PlannedRequest:
    index: int  # position in output order (task order, then seed order)
    task: Task
    seed: int
    body: dict  # the exact request body
    parsed: object  # the server's ChatCompletionRequest model of it


@dataclass
class ScoredRollout:
    planned: PlannedRequest
    checked: CheckedRollout
    reward: float
    latency_ms: float
    scorer_raw_output: str
    scorer_stderr_tail: str
    scorer_elapsed_ms: float
    sandboxed: bool
    mechanism: str


# Every body is rendered up front, so the plan is bounded before any is: --seeds 100000000 once grew
# past 4 GB without a word (QA). A GRPO group is a task's completions; 1,024 is far past any useful one.
MAX_SEEDS_PER_TASK = 1024
MAX_PLANNED_REQUESTS = 200_000


def check_plan_size(task_count: int, seed_count: int) -> None:
    if seed_count > MAX_SEEDS_PER_TASK:
        raise RolloutError("invalid_argument", f"--seeds {seed_count} is more than {MAX_SEEDS_PER_TASK} completions "
                           "per task", hint="a GRPO group of 4-64 completions is usual; the guide uses --seeds 8")
    if task_count * seed_count > MAX_PLANNED_REQUESTS:
        raise RolloutError("invalid_argument", f"{task_count} tasks x {seed_count} seeds is {task_count * seed_count} "
                           f"requests, more than {MAX_PLANNED_REQUESTS} in one run",
                           hint="split the tasks file and run the command once per part")


def plan_requests(template: dict, tasks: list[Task], seeds: list[int], options: RenderOptions) -> list[PlannedRequest]:
    """Render every body up front; a group shares one prompt, so messages may not vary with the seed."""
    check_plan_size(len(tasks), len(seeds))
    planned = []
    for task in tasks:
        messages = None
        for seed in seeds:
            body = render_request(template, task, seed=seed, options=options)
            if messages is None:
                messages = body["messages"]
            elif body["messages"] != messages:
                raise RolloutError("template_invalid", "the rendered messages differ between seeds; a GRPO group "
                                   "shares one prompt, so do not use {{seed}} inside messages", task_id=task.id,
                                   seed=seed)
            planned.append(PlannedRequest(len(planned), task, seed, body, parse_request(body, task)))
    return planned


def _request_failure(exc: Exception, item: PlannedRequest, tries: int = 1, waited: float = 0.0) -> RolloutError:
    code = getattr(exc, "code", None) or "request_failed"
    message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
    if tries > 1:
        message += f" (sent {tries} times, waiting {waited:.0f} s for the GPU worker)"
    return RolloutError(code, f"chat completion request failed: {message}", task_id=item.task.id, seed=item.seed,
                        hint=getattr(exc, "hint", "") or "")


def _retry_after(exc: Exception) -> float | None:
    value = getattr(exc, "retry_after", None)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0 else None


def _post_resending(item: PlannedRequest, post: Callable, resend: ResendPolicy) -> tuple[dict, float]:
    """(post(item.body), when the answered try started), sent again while the server answers a
    RESENDABLE_CODES refusal, until resend.window_s of waiting is spent; then (or for any other
    failure) a RolloutError."""
    tries, waited, delay = 0, 0.0, resend.first_delay_s
    while True:
        tries += 1
        started = time.perf_counter()
        try:
            return post(item.body), started
        except RolloutError:
            raise
        except Exception as exc:  # noqa: BLE001 - every transport failure names the task and seed
            code = getattr(exc, "code", None)
            pause = min(max(_retry_after(exc) or delay, 0.0), resend.window_s - waited)
            if code not in RESENDABLE_CODES or pause <= 0:
                raise _request_failure(exc, item, tries, waited) from None
            if resend.notify is not None:
                resend.notify(f"task {item.task.id}, seed {item.seed}: {code}; sending it again in {pause:.0f} s "
                              f"(waited {waited:.0f} of {resend.window_s:.0f} s)")
            resend.sleep(pause)
            waited += pause
            delay = min(delay * 2, resend.max_delay_s)


def _scorer_failure(exc: Exception, item: PlannedRequest) -> RolloutError:
    code = getattr(exc, "code", None) or "scorer_failed"
    message = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
    tail = one_line(getattr(exc, "stderr_tail", "") or "", STDERR_TAIL_CHARS)
    text = f"scorer failed ({code}): {message}" + (f"; scorer stderr tail: {tail}" if tail else "; scorer stderr: (empty)")
    return RolloutError(code, text, task_id=item.task.id, seed=item.seed)


def run_one(item: PlannedRequest, *, post: Callable, score: Callable, options: RenderOptions,
            resend: ResendPolicy = NO_RESEND) -> ScoredRollout:
    response, started = _post_resending(item, post, resend)  # the latency of the answered try
    latency_ms = round((time.perf_counter() - started) * 1000, 3)
    checked = validate_response(response, task=item.task, seed=item.seed, body=item.body, parsed=item.parsed,
                                options=options)
    payload = {
        "task": item.task.fields,
        "request": item.body,
        "response": response,
        "content": checked.content,
        "usage": response.get("usage"),
        "adapter": "base" if options.is_base else options.adapter,
        "seed": item.seed,
        "latency": round(latency_ms / 1000, 6),  # seconds: the guide names the field `latency`
        "latency_ms": latency_ms,
    }
    try:
        result = score(payload)
    except Exception as exc:  # noqa: BLE001 - ScorerError and anything else the sandbox raises
        raise _scorer_failure(exc, item) from None
    reward = getattr(result, "reward", None)
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not reward_in_range(reward):
        raise RolloutError("scorer_output_invalid", f"the scorer returned reward {reward!r}; it must be a number, "
                           f"{REWARD_RANGE}", task_id=item.task.id, seed=item.seed)
    return ScoredRollout(
        planned=item, checked=checked, reward=float(reward), latency_ms=latency_ms,
        scorer_raw_output=str(getattr(result, "raw_output", "")),
        scorer_stderr_tail=str(getattr(result, "stderr_tail", "") or "")[-STDERR_TAIL_CHARS:],
        scorer_elapsed_ms=float(getattr(result, "elapsed_ms", 0.0) or 0.0),
        sandboxed=bool(getattr(result, "sandboxed", False)), mechanism=str(getattr(result, "mechanism", "")),
    )


def run_requests(planned: list[PlannedRequest], *, post: Callable, score: Callable, options: RenderOptions,
                 concurrency: int = 4, on_progress: Callable[[int, int, str], None] | None = None,
                 resend: ResendPolicy = NO_RESEND) -> list[ScoredRollout]:
    """Every planned request, in plan order; raises the first failure (a RolloutError)."""
    if concurrency < 1:
        raise RolloutError("invalid_argument", "--concurrency must be at least 1")
    work: queue.SimpleQueue = queue.SimpleQueue()
    for item in planned:
        work.put(item)
    finished: queue.SimpleQueue = queue.SimpleQueue()
    stop = threading.Event()

    def worker():
        while not stop.is_set():
            try:
                item = work.get_nowait()
            except queue.Empty:
                return
            try:
                finished.put((item, run_one(item, post=post, score=score, options=options, resend=resend), None))
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                finished.put((item, None, exc))

    for number in range(min(concurrency, len(planned))):
        threading.Thread(target=worker, name=f"kiln-rollout-{number}", daemon=True).start()
    results: list[ScoredRollout | None] = [None] * len(planned)
    try:
        for done in range(1, len(planned) + 1):
            item, result, error = finished.get()
            if error is not None:
                if isinstance(error, RolloutError):
                    raise error
                raise RolloutError("internal_error", f"{type(error).__name__}: {error}", task_id=item.task.id,
                                   seed=item.seed) from error
            results[item.index] = result
            if on_progress is not None:
                on_progress(done, len(planned), f"{item.task.id} seed {item.seed}")
    finally:
        stop.set()
    return results  # type: ignore[return-value]
