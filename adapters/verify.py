"""One verifier for the chain "why is this adapter serving?" (issue 13).

    report = verify_adapter("math-r002")
    report.ok, report.first_broken      # the first broken link (a LinkResult) or None
    report.to_dict()                    # GET /v1/adapters/{name}/verify, `kiln adapters verify NAME --json`

It walks, in order, and recomputes every digest it meets (links are named `area.what`):

- `adapter.row`: the registry row is published and names its folder;
- `adapter.bytes`: the adapter's files (`core.content_identity.adapter_files`) hash to the row's
  `content_sha256`;
- `training.job`: the producing `training.grpo` job exists and completed;
- `train_receipt.row`: the `train` receipt row of that job exists and its `sha256` is the digest
  of its stored body (a row edited behind the model's back breaks here);
- `train_receipt.file`: `train_receipt.json` beside the weights hashes to the row's `sha256`;
- `train_receipt.output`: the receipt's `adapters.output` digest and byte count are the files';
- `corpus.snapshot`: the pinned snapshot of the admitted corpus hashes to the job payload's
  `training_data.admitted_corpus_sha256` and to the receipt's `training_data.sha256` (the
  dataset lineage digests of a named dataset agree too). A missing snapshot is a broken link, not
  "unavailable": the job pinned it so that this question can be answered;
- `corpus.provenance`: every `kiln.rollout-provenance.v1` record in the corpus validates and
  still binds its completion (`scored_payload_sha256`) and prompt (`prompt_messages_sha256`);
  with `behavior_policy: recorded` the whole corpus passes `check_recorded_corpus`;
- `base_adapter`: the parent (`base_adapter`) is verified the same way (bounded depth) and its
  content is the one the receipt trained from;
- `post_eval.job`, `post_eval.eval_results` (the eval job's `results.json` hashes to the sha256
  in its result), `post_eval.gate_receipt` (the `post_eval_gate` row's digest and its evidence
  is the job's), and `post_eval.gate_decision` (registered by `training.verify_links`: the
  decision recomputed from the results file with `paired_wilson_v1`);
- `activation`: an active adapter is justified by the newest `activation` receipt row bound to it
  (by its training job or its content digest; every activation row's digest checked): a promoted
  gate of this post-eval, or a load by hand (recorded with who, and the content it activated);
  with neither a row nor a gate, by `auto_load` in the train receipt's config;
- `receipts.rows`: every other receipt row about this adapter still hashes to its digest.

The links live in `adapters/verify_links.py`; this module is the walker and the registry.

Each link is one function registered with `register_link`; an app above this one adds links
that need its code (a module `<app>/verify_links.py`, discovered at the first verification) so
this module never imports an app above it. A promotion or approval link is one more function
registered `after="activation"` (`promotion`: the approval rows of the promotion that activated it).

An uploaded adapter (`adapters.selectors.adapter_origin`) was trained on another machine: the links
only that machine can check (its job row, receipt row, corpus snapshot, lineage) are `checked: false`
("not checkable here"), never broken and never passed; its bytes, the manifest and receipt it carried
(when it carried them) and anything recorded here about it are still checked.

A link that does not apply is ok with a detail saying why; every
link runs even after one broke (the report names them all), and `first_broken` is the first in
walking order. Imports no torch and no gpu_runtime: the web process runs it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from django.conf import settings

from adapters.models import Adapter, AdapterState
from core.canonical import json_digest
from core.content_identity import adapter_files, file_manifest, manifest_digest
from core.models import Receipt, ReceiptKind

MAX_DEPTH = 8  # base_adapter links followed at most
TRAIN_KIND = "training.grpo"
POST_EVAL_KIND = "training.post_eval"


@dataclass
class LinkResult:
    link: str
    ok: bool
    detail: str
    expected: Any = None
    actual: Any = None
    checked: bool = True  # False: it can only be checked on the machine that trained the adapter

    def to_dict(self) -> dict:
        return {"link": self.link, "ok": self.ok, "checked": self.checked, "detail": self.detail,
                "expected": self.expected, "actual": self.actual}


@dataclass
class VerifyReport:
    adapter: str
    links: list[LinkResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(link.ok for link in self.links)

    @property
    def first_broken(self) -> LinkResult | None:
        return next((link for link in self.links if not link.ok), None)

    def to_dict(self) -> dict:
        broken = self.first_broken
        return {"schema": "kiln.adapter-verification.v1", "adapter": self.adapter, "ok": self.ok,
                "first_broken": broken.link if broken else None, "links": [link.to_dict() for link in self.links]}


def ok(link: str, detail: str, expected=None, actual=None) -> LinkResult:
    return LinkResult(link, True, detail, expected, actual)


def broken(link: str, detail: str, expected=None, actual=None) -> LinkResult:
    return LinkResult(link, False, detail, expected, actual)


def unchecked(link: str, detail: str) -> LinkResult:
    """Not broken, not verified: the evidence lives on the machine that trained an uploaded adapter."""
    return LinkResult(link, True, f"not checkable here: {detail}", checked=False)


def uploaded_elsewhere(chain: Chain, what: str) -> str:
    """Why an uploaded adapter's link is not checkable here (unchecked's detail)."""
    carried = "carried receipt" if chain.carried_receipt else "carries no receipt: a plain PEFT adapter"
    return f"uploaded ({carried}); {what}"


def digest_check(link: str, what: str, expected, actual) -> LinkResult:
    if expected == actual:
        return ok(link, f"{what} matches {actual}", expected, actual)
    return broken(link, f"{what} is {actual}, expected {expected}", expected, actual)


def row_intact(row: Receipt) -> bool:
    """A receipt row's stored sha256 is still the digest of its stored body."""
    try:
        return json_digest(row.body) == row.sha256
    except Exception:  # a body that is not canonical JSON any more (NaN, a non-JSON value)
        return False


class Chain:
    """What the links read, loaded once and shared: the adapter, its jobs and receipt rows."""

    def __init__(self, adapter: Adapter | None, name: str, *, depth: int = 0, seen: tuple[str, ...] = ()):
        self.adapter, self.name, self.depth, self.seen = adapter, name, depth, seen + (name,)

    @property
    def folder(self) -> Path | None:
        return Path(self.adapter.path) if self.adapter and self.adapter.path else None

    @cached_property
    def content_sha256(self) -> str | None:
        """The digest recomputed from the files on disk (None: no adapter files there)."""
        folder = self.folder
        if folder is None or not folder.is_dir():
            return None
        files = adapter_files(folder)
        return manifest_digest(file_manifest(folder, files)) if files else None

    @cached_property
    def origin(self) -> dict:
        """{"uploaded", "manifest_sha256"}: how this row was published (adapters.selectors.adapter_origin)."""
        from adapters.selectors import adapter_origin

        return adapter_origin(adapter=self.adapter) if self.adapter else {"uploaded": False, "manifest_sha256": None}

    @property
    def uploaded(self) -> bool:
        return self.origin["uploaded"]

    @cached_property
    def carried_receipt(self) -> dict:
        """An upload's train_receipt.json as carried in its folder ({} without one; the manifest link
        checks its bytes against the carried manifest's receipt_hash)."""
        try:
            body = json.loads((self.folder / "train_receipt.json").read_bytes())
        except (OSError, ValueError, TypeError):
            return {}
        return body if isinstance(body, dict) else {}

    @cached_property
    def training_job(self):
        job = self.adapter.training_job if self.adapter else None
        return job if job is not None and job.kind == TRAIN_KIND else None

    @cached_property
    def train_row(self) -> Receipt | None:
        if self.training_job is None:
            return None
        return (Receipt.objects.filter(kind=ReceiptKind.TRAIN, subject=self.name, job=self.training_job)
                .order_by("-created_at", "-id").first())

    @cached_property
    def receipt(self) -> dict:
        """The train receipt as recorded in its row ({} without one)."""
        return self.train_row.body if self.train_row is not None and isinstance(self.train_row.body, dict) else {}

    @property
    def payload(self) -> dict:
        return (self.training_job.payload or {}) if self.training_job else {}

    @cached_property
    def snapshot_bytes(self) -> bytes | None:
        path = self.payload.get("snapshot_path")
        try:
            return Path(path).read_bytes() if path else None
        except OSError:
            return None

    @cached_property
    def snapshot_groups(self) -> list[dict] | None:
        if self.snapshot_bytes is None:
            return None
        return [json.loads(line) for line in self.snapshot_bytes.splitlines() if line.strip()]

    @property
    def post_eval_requested(self) -> bool:
        return bool(self.payload.get("post_eval"))

    @property
    def gated(self) -> bool:
        return (self.payload.get("post_eval") or {}).get("min_accuracy") is not None

    @cached_property
    def post_eval_job(self):
        from core.jobs.models import Job

        job_id = ((self.training_job.result or {}) if self.training_job else {}).get("post_eval_job_id")
        if not job_id:
            return None
        return Job.objects.filter(uuid=job_id, kind=POST_EVAL_KIND).first()

    @property
    def post_eval_result(self) -> dict:
        return (self.post_eval_job.result or {}) if self.post_eval_job else {}

    @cached_property
    def eval_jobs(self) -> list:
        from core.jobs.models import Job

        ids = self.post_eval_result.get("linked_eval_job_ids") or []
        found = {str(job.uuid): job for job in Job.objects.filter(uuid__in=ids)}
        return [found.get(str(i)) for i in ids]

    @cached_property
    def gate_row(self) -> Receipt | None:
        if self.post_eval_job is None:
            return None
        return (Receipt.objects.filter(kind=ReceiptKind.POST_EVAL_GATE, subject=self.name, job=self.post_eval_job)
                .order_by("-created_at", "-id").first())

    @cached_property
    def activation_rows(self) -> list[Receipt]:
        return list(Receipt.objects.filter(kind=ReceiptKind.ACTIVATION, subject=self.name).order_by("created_at", "id"))

    def results_file(self, eval_job) -> Path:
        return settings.KILN.layout.eval_job(str(eval_job.uuid)) / "results.json"


LinkFn = Callable[[Chain], "LinkResult | Iterable[LinkResult] | None"]
_LINKS: list[tuple[str, LinkFn]] = []
_discovered = False


def register_link(name: str, *, after: str | None = None, before: str | None = None):
    """Register a link function (decorator). It gets the Chain and returns one LinkResult, several,
    or None (nothing to say). Registering a name again replaces it in place."""

    def decorate(fn: LinkFn) -> LinkFn:
        names = [n for n, _ in _LINKS]
        if name in names:
            _LINKS[names.index(name)] = (name, fn)
            return fn
        if after is not None and after in names:
            _LINKS.insert(names.index(after) + 1, (name, fn))
        elif before is not None and before in names:
            _LINKS.insert(names.index(before), (name, fn))
        else:
            _LINKS.append((name, fn))
        return fn

    return decorate


def link_names() -> list[str]:
    _discover()
    return [name for name, _ in _LINKS]


def _discover() -> None:
    """Import each installed app's `verify_links` module once (the admin's autodiscover idiom)."""
    global _discovered
    if not _discovered:
        from django.utils.module_loading import autodiscover_modules

        autodiscover_modules("verify_links")
        _discovered = True


def _run(name: str, fn: LinkFn, chain: Chain) -> list[LinkResult]:
    try:
        produced = fn(chain)
    except Exception as exc:  # a link that cannot be checked is not a passed link
        return [broken(name, f"could not be checked: {type(exc).__name__}: {exc}")]
    if produced is None:
        return []
    return [produced] if isinstance(produced, LinkResult) else list(produced)


def verify_adapter(name: str, *, _depth: int = 0, _seen: tuple[str, ...] = ()) -> VerifyReport:
    """Walk the chain of the adapter `name` (see the module docstring); never raises for a broken link."""
    _discover()
    adapter = Adapter.objects.select_related("training_job").filter(name=name).first()
    chain = Chain(adapter, name, depth=_depth, seen=_seen)
    report = VerifyReport(adapter=name)
    for link_name, fn in list(_LINKS):
        report.links.extend(_run(link_name, fn, chain))
        if adapter is None or adapter.state != AdapterState.PUBLISHED:
            break  # nothing else can be walked
    return report


# The links themselves (registered in walking order when that module is imported).
from adapters import verify_links  # noqa: E402, F401
