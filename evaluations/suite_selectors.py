"""Eval suite reads: the registry rows and a suite's stored document (with its examples)."""

from __future__ import annotations

import json
from pathlib import Path

from core.errors import KilnError
from evaluations.models import EvalSuite


def suite_list():
    return EvalSuite.objects.all().order_by("name")


def suite_get(*, name: str) -> EvalSuite | None:
    if not isinstance(name, str) or not name:
        return None
    return EvalSuite.objects.filter(name=name).first()


def suite_document(*, suite: EvalSuite) -> dict:
    """The stored suite: schema, name, description, scorer, examples, suite_hash, source, created_at."""
    try:
        document = json.loads(Path(suite.path).read_bytes())
    except (OSError, ValueError) as exc:
        raise KilnError("eval_registry_unavailable", f"suite {suite.name!r} cannot be read: {exc}", status=503,
                        hint="register the suite again with force=true") from None
    return document


def suite_summary(suite: EvalSuite) -> dict:
    return {"name": suite.name, "description": suite.description, "suite_hash": suite.suite_hash,
            "examples": suite.examples, "scorer": suite.scorer, "source": suite.source,
            "created_at": suite.created_at, "updated_at": suite.updated_at}
