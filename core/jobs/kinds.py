"""Registry of job kinds: which queue runs a kind, and which handler (a dotted path) does the work.

Handlers are named by dotted path so that the web process can register and submit every kind
without importing the handler's module (which may import torch); only workers import them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module

QUEUES = ("gpu", "control")
# A kind with a `tracked_full_code` keeps at most this many jobs tracked: queued or running, or ended
# within the last TRACKED_TERMINAL_TTL_S seconds and not deleted (what its status and queue routes list).
MAX_TRACKED_JOBS = 1024
TRACKED_TERMINAL_TTL_S = 3600
# Queues whose jobs run one at a time per worker process, in FIFO order (the GPU is one device).
EXCLUSIVE_QUEUES = frozenset({"gpu"})


@dataclass(frozen=True)
class JobKind:
    name: str
    queue: str
    handler: str  # "package.module:function" taking (JobContext) and returning a result dict
    category: str = "other"  # training | evaluation | openenv | other: where the UI lists it
    queue_full_code: str = "job_queue_full"
    queue_full_retry_after: int = 30  # seconds, also for tracked_full_code
    # Optional: the 503 code that refuses a submission while MAX_TRACKED_JOBS of this kind are tracked.
    tracked_full_code: str = ""
    # Optional "module:function" called with the job after it ends failed or cancelled (in whichever
    # process ended it), e.g. to release resources a queued job had reserved. Must not import torch.
    on_unsuccessful: str = ""
    # Optional "module:function" taking the job and returning a JobSection (or None): the kind's own
    # part of the job page, rendered by the generic page and its live consumer alike.
    detail_section: str = ""
    # Optional "module:Class": the kind's typed payload, a frozen dataclass with from_dict/to_dict.
    # job_submit stores its to_dict() (a dict given instead is parsed first, so a bad payload never
    # reaches the queue); readers call kind.read_payload(job) instead of picking at the dict.
    payload_type: str = ""
    # Optional ((error code, hint), ...): what to do about this kind's failure where it differs from
    # the generic hint in core.jobs.error_hints (e.g. only a training run resumes from a checkpoint).
    error_hints: tuple[tuple[str, str], ...] = ()
    # The hint for any other failure of this kind, where the generic one ("see the job's events") is
    # less than the kind knows (an OpenEnv run's own status holds the failure's stage and hint).
    default_error_hint: str = ""

    def load_handler(self) -> Callable:
        return _load(self.handler)

    def error_hint(self, code: str) -> str | None:
        return dict(self.error_hints).get(code)

    def run_unsuccessful_hook(self, job) -> None:
        if self.on_unsuccessful:
            _load(self.on_unsuccessful)(job)

    def read_payload(self, job):
        """The job's payload as the kind's typed value (the stored dict when the kind declares none)."""
        return _load(self.payload_type).from_dict(job.payload) if self.payload_type else job.payload

    def stored_payload(self, payload) -> dict:
        """What job_submit stores: the typed value's plain form, checked by a round trip."""
        if not self.payload_type:
            return payload
        cls = _load(self.payload_type)
        value = payload if isinstance(payload, cls) else cls.from_dict(payload)
        return value.to_dict()

    def section(self, job) -> JobSection | None:
        return _load(self.detail_section)(job) if self.detail_section else None


@dataclass(frozen=True)
class JobSection:
    """A kind's part of the job page: a template, the context it reads, and optionally the metrics
    the generic Metrics card shows instead of all of job.metrics (e.g. without curve histories)."""

    template: str
    context: dict
    metrics: dict | None = None
    page_template: str = ""  # below the live part: forms that need the page's CSRF token
    update_template: str = ""  # swapped out-of-band with every live update of the page
    links: tuple[tuple[str, str], ...] = ()  # (label, URL) shown in the page head beside "all jobs"


def _load(path: str) -> Callable:
    module_name, _, attr = path.partition(":")
    return getattr(import_module(module_name), attr)


_KINDS: dict[str, JobKind] = {}


def register_job_kind(kind: JobKind) -> JobKind:
    if kind.queue not in QUEUES:
        raise ValueError(f"job kind {kind.name!r}: queue must be one of {QUEUES}, not {kind.queue!r}")
    existing = _KINDS.get(kind.name)
    if existing and existing != kind:
        raise ValueError(f"job kind {kind.name!r} is already registered differently")
    _KINDS[kind.name] = kind
    return kind


def get_job_kind(name: str) -> JobKind | None:
    return _KINDS.get(name)


def registered_kinds() -> list[JobKind]:
    return sorted(_KINDS.values(), key=lambda k: k.name)


def import_extra_job_modules(modules) -> None:
    """Import modules that register more kinds (KILN_EXTRA_JOB_MODULES), e.g. plugins or test kinds."""
    for module in modules:
        import_module(module)
