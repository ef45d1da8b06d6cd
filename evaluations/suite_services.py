"""Eval suite writes: register (or with force replace) and delete a suite.

The suite file (`HomeLayout.eval_suite(name)`, the pretty JSON of
`evaluations.suites.suite_document`) is published atomically in the transaction that writes its
row: a refused or failed registration leaves neither. The contract (shape, bounds, scorer specs,
`suite_hash`) is `evaluations.suites`.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction

from core.artifacts import ensure_dir, hidden_sibling, write_file
from core.artifacts import json_bytes as _json_bytes
from core.errors import KilnError
from core.jobs.models import TERMINAL_STATES, Job
from core.jobs.services import check_owner_or_permitted
from evaluations.models import EvalSuite
from evaluations.suites import SuiteError, parse_suite, suite_document


def _exists(name: str) -> KilnError:
    return KilnError("eval_suite_exists", f"name: an eval suite named {name!r} already exists", status=409,
                     field="name", hint="choose another name, or replace it (the form's replace box, --force on the CLI, "
                          "force=true in the API)")


def suite_store(*, body, force: bool = False, source: dict | None = None, user=None) -> EvalSuite:
    """Validate a suite and register it; an existing name answers eval_suite_exists unless `force`
    (another user's suite is replaced only with jobs.delete_others_jobs: suite_replace_forbidden)."""
    try:
        parsed = parse_suite(body)
    except SuiteError as exc:
        raise KilnError("eval_invalid_request", str(exc), status=400, field=exc.field) from None
    name = parsed["name"]
    if not force and EvalSuite.objects.filter(name=name).exists():
        raise _exists(name)
    source = source or {"kind": "upload"}
    created_at = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    data = _json_bytes(suite_document(parsed, source=source, created_at=created_at))
    target = settings.KILN.layout.eval_suite(name)
    fields = {"description": parsed["description"], "path": str(target), "suite_hash": parsed["suite_hash"],
              "examples": len(parsed["examples"]), "scorer": parsed["scorer"], "source": source,
              "created_by": user if getattr(user, "is_authenticated", False) else None}
    try:
        with transaction.atomic():
            if force:
                existing = EvalSuite.objects.select_for_update().filter(name=name).first()
                if existing is not None:  # replacing is deleting: the owner's, or jobs.delete_others_jobs
                    check_owner_or_permitted(owner_id=existing.created_by_id, user=user, what=f"eval suite {name!r}",
                                             code="suite_replace_forbidden")
                    if existing.suite_hash != parsed["suite_hash"]:  # the same suite again changes nothing
                        _check_not_pinned_by_a_gate(name)
                suite, _created = EvalSuite.objects.select_for_update().update_or_create(name=name, defaults=fields)
            else:
                suite = EvalSuite.objects.create(name=name, **fields)
            ensure_dir(target.parent)
            write_file(target, data)  # the row's unique name is the guard
    except (IntegrityError, FileExistsError):
        raise _exists(name) from None
    return suite


def suite_check_delete(*, suite: EvalSuite, user) -> None:
    """The jobs' rule (core.jobs.services.check_owner_or_permitted): only the suite's creator (created_by;
    a replacement makes its author the creator) or a holder of jobs.delete_others_jobs deletes it
    (403 suite_delete_forbidden)."""
    check_owner_or_permitted(owner_id=suite.created_by_id, user=user, what=f"eval suite {suite.name!r}",
                             code="suite_delete_forbidden")


def _check_not_pinned_by_a_gate(name: str) -> None:
    """A training queued or running with `post_eval` on this suite (or its post-eval, not yet ended)
    needs it: deleted now, its gate could only end `error` after the whole training (409 eval_suite_in_use)."""
    waiting = Job.objects.filter(kind__in=("training.grpo", "training.post_eval"),
                                 deleted_at__isnull=True, payload__post_eval__suite=name
                                 ).exclude(state__in=TERMINAL_STATES).first()
    if waiting is not None:
        raise KilnError("eval_suite_in_use", f"eval suite {name!r} is the post_eval suite of {waiting.kind} job "
                        f"{waiting.uuid} ({waiting.state})", status=409,
                        hint="delete it once that job has ended, or cancel the job first")


def suite_delete(*, suite: EvalSuite, user=None) -> None:
    """Remove the row and the file. `user` must own it or hold jobs.delete_others_jobs
    (suite_check_delete); refused, nothing changes."""
    path = Path(suite.path)
    aside = hidden_sibling(path, "deleted")
    with transaction.atomic():
        # The row as it is now: a concurrent replacement (force) may have given it another creator.
        current = EvalSuite.objects.select_for_update().filter(pk=suite.pk).first()
        suite_check_delete(suite=current or suite, user=user)
        _check_not_pinned_by_a_gate(suite.name)
        EvalSuite.objects.filter(pk=suite.pk).delete()
        if path.exists():
            os.rename(path, aside)
    aside.unlink(missing_ok=True)
