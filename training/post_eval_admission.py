"""The held-out `post_eval` checks that run at submission, before anything is queued (§1.4).

- The suite must be installed (404 `eval_suite_not_found`).
- `generation` must be settings the eval run will accept (400 `training_invalid_request` naming
  `post_eval.generation.FIELD`): checked now with the eval side's own parser, so a misspelt
  `temprature` is refused before training instead of leaving the gate `error` hours later.
- With `data_scope: held-out` (the default) the suite must not overlap the admitted training data:
  exact or normalized prompt/target (also with the system message or trailing tool results
  removed), exact or normalized source-row identity, or a shared group_id/session_id
  (`evaluations.overlap`). A hit is a 400 `eval_train_overlap` that names the overlapping rows.
  `train-set-eval` is diagnostic only (its contract already forbids `min_accuracy`), so it is not
  held to separation.

The overlap check reads the rows as submitted (group_id, metadata and reference survive there; the
admitted corpus keeps only what training needs).
"""

from __future__ import annotations

import json
from pathlib import Path

from core.contracts.grpo_submission import PostEvalConfig
from core.errors import KilnError
from evaluations.eval_payloads import PayloadError, parse_generation
from evaluations.gate import MIN_PAIRED_EXAMPLES
from evaluations.overlap import find_overlaps
from evaluations.suite_selectors import suite_document, suite_get

INLINE_SOURCES = ("groups", "agentic_groups", "rollouts")
SHOWN_OVERLAPS = 5
OVERLAP_SEARCH_LIMIT = 20  # overlaps looked for before refusing: enough to name, not to list them all


def submitted_rows(body: dict, provenance: dict) -> list[dict]:
    """The training rows as the user sent them: inline, or the lines of the (already admitted) file."""
    for key in INLINE_SOURCES:
        if isinstance(body.get(key), list):
            return body[key]
    data = Path(provenance["path"]).read_bytes()
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def check_post_eval(post_eval: PostEvalConfig, rows: list[dict]) -> dict:
    """Raise a KilnError unless the suite is installed and held out; return {suite, suite_hash}."""
    suite = suite_get(name=post_eval.suite)
    if suite is None:
        raise KilnError("eval_suite_not_found", f"post_eval.suite: no installed eval suite named "
                        f"{post_eval.suite!r}", status=404, field="post_eval.suite",
                        hint="install it first: kiln eval suites create FILE, or synthesize one from a dataset")
    check_post_eval_generation(post_eval, suite_hash=suite.suite_hash)
    if post_eval.data_scope == "held-out":
        examples = suite_document(suite=suite)["examples"]
        overlaps = find_overlaps(rows, examples, limit=OVERLAP_SEARCH_LIMIT)
        if overlaps:
            shown = "; ".join(f"{o.field} ~ example {o.example_id!r} ({o.kind})" for o in overlaps[:SHOWN_OVERLAPS])
            at_least = "at least " if len(overlaps) >= OVERLAP_SEARCH_LIMIT else ""  # the search stops there
            more = (f" and {at_least}{len(overlaps) - SHOWN_OVERLAPS} more"
                    if len(overlaps) > SHOWN_OVERLAPS else "")
            raise KilnError("eval_train_overlap", f"post_eval.suite: suite {suite.name!r} overlaps the training "
                            f"data: {shown}{more}", status=400, field="post_eval.suite",
                            hint="evaluate on held-out rows (a dataset's holdout partition), or use "
                                 "data_scope train-set-eval for a diagnostic without a gate")
    return {"suite": suite.name, "suite_hash": suite.suite_hash}


def gate_warnings(post_eval: PostEvalConfig | None) -> list[str]:
    """What a submitter should know before a held-out gate runs: a suite too small for the gate to
    decide (it can only end inconclusive, and the adapter is kept, never promoted)."""
    if post_eval is None or post_eval.data_scope != "held-out":
        return []
    suite = suite_get(name=post_eval.suite)
    if suite is None:
        return []
    count = len(suite_document(suite=suite)["examples"])
    if count >= MIN_PAIRED_EXAMPLES:
        return []
    return [f"post_eval.suite {suite.name!r} has {count} example{'s' if count != 1 else ''}; the held-out gate "
            f"needs at least {MIN_PAIRED_EXAMPLES} paired examples to decide, so it will end inconclusive and the "
            "adapter will be kept, not promoted"]


def check_post_eval_generation(post_eval: PostEvalConfig, *, suite_hash: str) -> None:
    """Refuse generation settings the post-training eval would refuse (the same parser it runs)."""
    try:
        parse_generation(post_eval.generation, suite_hash=suite_hash)
    except PayloadError as exc:
        field = f"post_eval.{exc.field}"
        raise KilnError("training_invalid_request", f"{field}: {exc.message}", status=400, field=field,
                        hint="fix or remove the setting; post_eval.generation takes the settings of "
                             "kiln eval run (temperature, top_p, max_tokens, seed, thinking, ...)") from None
