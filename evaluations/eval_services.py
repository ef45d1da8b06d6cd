"""Eval job writes: submit a run or a compare, rerun selected examples of a job, strict replay of a
completed job, and cancel-or-delete. Everything is checked before anything is queued, and a
refusal leaves nothing behind.

Submission pins the suite: the parsed suite document (for a rerun, only the selected examples) is
written read-only to `HomeLayout.evals/inputs/<id>/suite.json` and the job carries its path and
sha256 (the handler re-checks it), so a suite replaced or deleted afterwards changes nothing about
a queued job. A target's adapter must be published; its `content_sha256` is recorded, and the
handler holds every response's provenance to it. The served model's identity (a live GPU worker's
heartbeat) is bound into `effective_generation_hash` at submission, so submission needs a worker
that has loaded the model (503 `inference_unavailable` / `model_loading` otherwise, with the
readiness check's hint). Imports no torch.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from django.conf import settings

from core.artifacts import ensure_dir, json_bytes, write_file
from core.canonical import sha256_digest
from core.errors import KilnError
from core.jobs.models import JobState
from core.jobs.services import job_cancel, job_delete, job_submit
from evaluations.eval_payloads import (
    KIND,
    MAX_TARGETS,
    EvalJobPayload,
    PayloadError,
    generation_hash,
    model_binding,
    parse_generation,
    parse_seed,
    rerun_kinds,
    select_examples,
    target_label,
)
from evaluations.suites import SUITE_SCHEMA, SuiteError, parse_suite, suite_hash

ROUTES = {"run": "/v1/eval/run", "compare": "/v1/eval/compare"}


_NOT_COMPLETED_HINT = ("wait for a queued or running job to complete (GET /v1/eval/jobs/{id}); a failed or cancelled "
                       "job has no results: run the evaluation again (POST /v1/eval/run, `kiln eval run`)")


def invalid(message: str, field: str, hint: str = "") -> KilnError:
    return KilnError("eval_invalid_request", f"{field}: {message}", status=400, field=field, hint=hint)


def _from_payload_error(exc: PayloadError) -> KilnError:
    return invalid(exc.message, exc.field)


def _served_model() -> dict:
    from adapters.serving.selectors import require_inference_ready, served_model_identity
    from core.profiles import require_profile_allows

    require_profile_allows("evaluation")
    require_inference_ready()
    identity = served_model_identity()
    try:
        return model_binding(identity)
    except PayloadError:
        raise KilnError("model_loading", "the GPU worker has not reported the served model's identity yet",
                        status=503, hint="retry in a few seconds; /health shows progress") from None


def _target(value, field: str) -> dict:
    from adapters.selectors import adapter_get, adapter_published_path

    if value is None or (isinstance(value, str) and value.strip() in ("", "base")):
        return {"adapter": None, "content_sha256": None}
    if not isinstance(value, str):
        raise invalid("must be an adapter name, or null for the base model", field)
    name = value.strip()
    adapter = adapter_get(name=name)
    if adapter is None or adapter_published_path(name=name) is None:
        raise invalid(f"no published adapter named {name!r}", field,
                      "list adapters with GET /v1/adapters; null (or 'base') is the base model")
    # serving's own check: a quarantined adapter's every example would be refused at inference and the
    # job "complete" with accuracy 0 (QA)
    from adapters.serving.selectors import require_servable_adapter

    try:
        require_servable_adapter(name)
    except KilnError as exc:
        raise KilnError(exc.code, f"{field}: {exc.message}; it cannot be evaluated", status=exc.status,
                        field=field, hint=exc.hint) from None
    return {"adapter": name, "content_sha256": adapter.content_sha256 or None}


def _current_targets(source: EvalJobPayload, job) -> list[dict]:
    """`job`'s targets, checked against the registry now as a new run's are (`_target`): an adapter
    deleted or republished since would be queued only to end in errors or a replay mismatch."""
    targets = []
    for i, recorded in enumerate(source.targets):
        field = "adapter" if len(source.targets) == 1 else f"adapters[{i}]"
        current = _target(recorded.get("adapter"), field)
        if current["content_sha256"] != recorded.get("content_sha256"):
            raise invalid(f"adapter {recorded['adapter']!r} holds other bytes than when job {job.uuid} ran "
                          f"({current['content_sha256']}, not {recorded.get('content_sha256')})", field,
                          "run a new eval job on the adapter as it is now")
        targets.append(dict(recorded))
    return targets


def _suite_from_request(body: dict) -> tuple[dict, str]:
    """The parsed suite (`evaluations.suites.parse_suite`'s value) and its source (registered|inline)."""
    from evaluations.suite_selectors import suite_document, suite_get

    name, inline = body.get("suite_name"), body.get("suite")
    if isinstance(inline, str) and name is None:
        name, inline = inline, None  # "suite": "NAME" names a registered suite
    if (name is None) == (inline is None):
        raise invalid("give exactly one of suite_name (a registered suite) or suite (an inline suite object)",
                      "suite_name")
    if inline is not None:
        if not isinstance(inline, dict):
            raise invalid("must be a suite object (name, scorer, examples) or a registered suite's name", "suite")
        try:
            return parse_suite(inline), "inline"
        except SuiteError as exc:
            raise invalid(exc.message, f"suite.{exc.field}") from None
    if not isinstance(name, str):
        raise invalid(f"must be a registered suite's name (a string), not {type(name).__name__}", "suite_name")
    suite = suite_get(name=name)
    if suite is None:
        raise KilnError("eval_suite_not_found", f"suite_name: no eval suite named {name!r}", status=404,
                        hint="list suites with GET /v1/eval/suites, or send an inline suite")
    document = suite_document(suite=suite)
    try:
        parsed = parse_suite({k: document.get(k) for k in ("name", "description", "scorer", "examples")})
    except SuiteError as exc:
        raise KilnError("eval_registry_unavailable", f"the stored suite {name!r} no longer validates: {exc}",
                        status=503, hint="register the suite again with force=true") from None
    if parsed["suite_hash"] != suite.suite_hash:
        raise KilnError("eval_registry_unavailable", f"the stored suite {name!r} does not hash to its registered "
                        f"suite_hash", status=503, hint="register the suite again with force=true")
    return parsed, "registered"


def _scorer_pins(parsed: dict) -> dict:
    """name -> sha256 of every registered scorer program the suite uses (re-checked by the handler)."""
    from evaluations.selectors import scorer_get

    names = {s["scorer"] for s in [parsed["scorer"], *(e.get("scorer") for e in parsed["examples"])]
             if s and s.get("type") == "program"}
    pins = {}
    for name in sorted(names):
        scorer = scorer_get(name=name)
        if scorer is None:
            raise invalid(f"no registered scorer named {name!r}", "suite.scorer")
        pins[name] = scorer.sha256
    return pins


def _pin_suite(parsed: dict, *, source: str, source_suite_hash: str, examples: list[dict] | None = None) -> dict:
    """Write the suite a job will run, read-only, and describe it for the payload."""
    examples = parsed["examples"] if examples is None else examples
    pinned_hash = suite_hash(parsed["scorer"], examples)
    document = {"schema": SUITE_SCHEMA, "name": parsed["name"], "description": parsed.get("description", ""),
                "scorer": parsed["scorer"], "examples": examples, "suite_hash": pinned_hash}
    data = json_bytes(document)
    directory = ensure_dir(settings.KILN.layout.evals / "inputs" / uuid.uuid4().hex)
    try:
        path = write_file(directory / "suite.json", data, mode=0o444, exclusive=True)
    except BaseException:  # e.g. the disk is full (the API answers 507): no empty folder is left behind
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return {"name": parsed["name"], "suite_hash": pinned_hash, "source_suite_hash": source_suite_hash,
            "source": source, "path": str(path), "sha256": sha256_digest(data), "examples": len(examples),
            "scorers": _scorer_pins({**parsed, "examples": examples})}


def _submit(payload: EvalJobPayload, *, user, title: str):
    try:
        return job_submit(kind=KIND, payload=payload, title=title, user=user)
    except BaseException:
        shutil.rmtree(Path(payload.suite["path"]).parent, ignore_errors=True)
        raise


def _title(mode: str, suite: dict, targets: list[dict]) -> str:
    labels = ", ".join(target_label(t["adapter"]) for t in targets)
    return f"Eval {mode} · {suite['name']} ({suite['examples']} example{'s' if suite['examples'] != 1 else ''}) · {labels}"


def eval_submit(*, body: dict, mode: str = "run", user=None):
    """Validate `POST /v1/eval/run` (`adapter`) or `/v1/eval/compare` (`adapters`, 1..8) and queue it."""
    if not isinstance(body, dict):
        raise invalid("must be a JSON object", "body")
    allowed = {"suite_name", "suite", "generation", "adapter" if mode == "run" else "adapters"}
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise invalid(f"is not a field of this request (known: {', '.join(sorted(allowed))})", unknown[0])
    if mode == "run":
        targets = [_target(body.get("adapter"), "adapter")]
    else:
        adapters = body.get("adapters")
        if not isinstance(adapters, list) or not 1 <= len(adapters) <= MAX_TARGETS:
            raise invalid(f"must be a list of 1 to {MAX_TARGETS} adapter names (null is the base model)", "adapters")
        targets = [_target(a, f"adapters[{i}]") for i, a in enumerate(adapters)]
    parsed, source = _suite_from_request(body)
    try:
        generation = parse_generation(body.get("generation"), suite_hash=parsed["suite_hash"])
    except PayloadError as exc:
        raise _from_payload_error(exc) from None
    _scorer_pins(parsed)  # refuse a missing scorer program before pinning anything
    model = _served_model()
    suite = _pin_suite(parsed, source=source, source_suite_hash=parsed["suite_hash"])
    payload = EvalJobPayload(mode=mode, suite=suite, targets=tuple(targets), generation=generation, model=model,
                             effective_generation_hash=generation_hash(generation, model), route=ROUTES[mode])
    return _submit(payload, user=user, title=_title(mode, suite, targets))


def _check_evidence(job) -> None:
    from evaluations.eval_selectors import evidence_integrity_error

    error = evidence_integrity_error(job)
    if error is not None:
        raise error


def _load_pinned(job) -> dict:
    from evaluations.eval_selectors import pinned_suite

    _check_evidence(job)
    return pinned_suite(payload=EvalJobPayload.of(job))


def eval_rerun(*, job, body: dict, user=None):
    """A new job over the examples of `job` whose outcome is one of the selected kinds."""
    from evaluations.eval_selectors import eval_records

    if not isinstance(body, dict):
        raise invalid("must be a JSON object", "body")
    unknown = sorted(set(body) - {"adapter", "outcome_kinds", "include_pass", "seed"})
    if unknown:
        raise invalid("is not a field of this request (known: adapter, outcome_kinds, include_pass, seed)", unknown[0])
    if job.state != JobState.COMPLETED:
        raise invalid(f"job {job.uuid} is {job.state}; only a completed eval job can be rerun", "job",
                      _NOT_COMPLETED_HINT)
    source = EvalJobPayload.of(job)
    try:
        kinds = rerun_kinds(body.get("outcome_kinds"), body.get("include_pass", False))
        seed = parse_seed(body["seed"], "seed") if body.get("seed") is not None else source.seed
    except PayloadError as exc:
        raise _from_payload_error(exc) from None
    _check_evidence(job)
    records = eval_records(job=job)
    if records is None:
        raise invalid(f"job {job.uuid} published no results", "job")
    chosen = set(select_examples(records, kinds))
    if not chosen:
        raise invalid(f"no example of job {job.uuid} has outcome {' / '.join(kinds)}", "outcome_kinds")
    targets = [_target(body["adapter"], "adapter")] if "adapter" in body else _current_targets(source, job)
    document = _load_pinned(job)
    examples = [e for e in document["examples"] if e["id"] in chosen]
    parsed = {"name": document["name"], "description": document.get("description", ""), "scorer": document["scorer"],
              "examples": document["examples"]}
    generation = {**source.generation, "seed": str(seed), "seed_source": "request" if "seed" in body else
                  source.generation.get("seed_source", "derived")}
    model = _served_model()
    suite = _pin_suite(parsed, source=source.suite.get("source", "registered"),
                       source_suite_hash=source.suite.get("source_suite_hash", source.suite["suite_hash"]),
                       examples=examples)
    payload = EvalJobPayload(mode="rerun", suite=suite, targets=tuple(targets), generation=generation, model=model,
                             effective_generation_hash=generation_hash(generation, model),
                             origin={"job_id": str(job.uuid), "outcome_kinds": list(kinds),
                                     "selected": len(examples)},
                             route=f"/v1/eval/jobs/{job.uuid}/rerun")
    return _submit(payload, user=user, title=_title("rerun", suite, targets))


def eval_replay(*, job, user=None):
    """Strict replay: the same pinned suite, targets, generation settings and model binding as `job`."""
    from evaluations.eval_selectors import eval_records

    if job.state != JobState.COMPLETED:
        raise invalid(f"job {job.uuid} is {job.state}; only a completed eval job can be replayed", "job",
                      _NOT_COMPLETED_HINT)
    source = EvalJobPayload.of(job)
    _check_evidence(job)
    if eval_records(job=job) is None:
        raise invalid(f"job {job.uuid} published no results to replay against", "job")
    _current_targets(source, job)
    current = _served_model()
    if current != source.model:
        raise KilnError("eval_replay_model_changed", "the served model is not the one the job ran on: "
                        f"{current['base_model_sha256']} (inference config {current['inference_config_sha256']}) "
                        f"vs {source.model['base_model_sha256']} ({source.model['inference_config_sha256']})",
                        status=409, hint="strict replay needs the same weights, tokenizer and inference config")
    payload = EvalJobPayload(mode="replay", suite=dict(source.suite), targets=source.targets,
                             generation=dict(source.generation), model=dict(source.model),
                             effective_generation_hash=source.effective_generation_hash,
                             origin={"job_id": str(job.uuid)}, route=f"/v1/eval/jobs/{job.uuid}/replay")
    return job_submit(kind=KIND, payload=payload, title=_title("replay", source.suite, list(source.targets)),
                      user=user)


def eval_cancel_or_delete(*, job, user=None) -> str:
    """Cancel a queued or running eval job; delete (hide) a finished one. Returns what happened:
    `cancelled`, `cancelling` (a running job stops before its next example) or `deleted`."""
    if job.state in (JobState.QUEUED, JobState.RUNNING):
        job = job_cancel(job=job, user=user)
        return "cancelling" if job.state == JobState.RUNNING else "cancelled"
    job_delete(job=job, user=user, not_finished_code="eval_job_not_deletable", not_found_code="eval_job_not_found")
    return "deleted"
