"""Scoring one suite example's completion: the built-in scorers and the mapping of a sandboxed
scorer program's verdict to an example outcome. Pure module: standard library, `jsonschema`,
`core.canonical` and the sandbox's value types only (no Django, no torch, no ninja; the import
contracts keep it so).

    spec = parse_scorer_spec({"type": "numeric_tolerance", "tolerance": 0.01})  # ScorerSpecError
    outcome = score_example(spec, completion, target, example)                  # ExampleOutcome

An outcome's `kind` is one of OUTCOME_KINDS:
- `pass` / `fail`: the completion was scored and is right / wrong;
- `invalid`: nothing scoreable was found (no number, several chosen options, a missing target, a
  completion whose thinking never closed);
- `error`: scoring itself failed (a malformed target such as a non-numeric one for
  `numeric_tolerance`, a scorer program that crashed or printed no reward).

Before any scorer runs, a thinking block is removed (`strip_thinking`, on by default): the text up to
and including the first `</think>` is dropped (a leading `<think>` opener is optional, since the
chat template may own it); a `<think>` that never closes leaves nothing to score (`invalid`).

Scorer specs (unknown keys are refused, so a misspelt option never silently takes its default):
- `{"type": "exact"}`: `completion.strip() == target.strip()`.
- `{"type": "normalized_exact"}`: equality after `normalize_answer` on both sides: Unicode NFKC,
  `casefold()`, runs of whitespace collapsed to one space, then surrounding quotes, brackets,
  markdown emphasis (`*`, `_`, backquotes) and trailing `. , ; : ! ?` stripped from both ends. A
  leading sign or currency mark is kept (`-5` is not `5`).
- `{"type": "numeric_tolerance", "tolerance": 1e-6}`: the last number in the completion (sign,
  decimals, exponent, `1,234` thousands groups) against `float(target)`: pass when
  `|prediction - target| <= tolerance`; no number in the completion is `invalid`; a target that is
  not one number is `error`.
- `{"type": "regex", "pattern": "..."}`: `re.search(pattern, completion)`; no target used. The
  pattern is at most MAX_PATTERN_CHARS, must compile, and may not nest quantifiers (`(a+)+`,
  `(\\w*)*`): Python's `re` has no timeout, so those catastrophic shapes are refused up front and only
  the last MAX_REGEX_SUBJECT_CHARS characters of a completion are searched (an answer sits at the
  end). Inline flags such as `(?i)` work.
- `{"type": "contains"}`: `target.strip() in completion` (case-sensitive; an empty target is invalid).
- `{"type": "json_valid"}`: the completion (or the one fenced code block it consists of) parses as
  one JSON value (NaN/Infinity refused); otherwise `fail`. No target used.
- `{"type": "json_schema", "schema": {...}}`: as json_valid (unparseable → `invalid`), then the
  value validated by `jsonschema` against the schema (checked when the spec is parsed; the draft is
  the schema's `$schema`, 2020-12 by default; a `$ref` must point inside the schema, and its
  `pattern`s are held to the regex rule below): valid → pass, else fail; a schema that cannot be
  applied (a local `$ref` to nothing) → error.
- `{"type": "multiple_choice", "choices": ["A", "B", "C", "D"]}`: 2..MAX_CHOICES distinct options
  (labels or texts); the target must be one of them. The answer text is what follows the last
  "answer is"/"answer:" marker, or the whole completion. If it normalizes to one option, that is
  the choice; otherwise the options standing as whole words in it are collected (one-character
  options case-sensitively, so the article "a" is not option "A"; an option inside a longer
  matched option does not count): exactly one → the choice; none or several → `invalid`.
- `{"type": "program", "scorer": "name", "pass_threshold": 1.0}`: a registered scorer program.
  This module only parses it (`spec.needs_program`); the caller runs the sandbox with
  `program_payload(...)` and passes the ScorerResult, or the ScorerError it raised, to
  `outcome_from_program`: reward >= pass_threshold → pass, lower → fail, ScorerError → error.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from dataclasses import dataclass, field

import jsonschema

from core.canonical import canonical_json
from evaluations.sandbox.types import ScorerError, ScorerResult

OUTCOME_KINDS = ("pass", "fail", "invalid", "error")
SCORER_TYPES = ("exact", "normalized_exact", "numeric_tolerance", "regex", "contains", "json_valid",
                "json_schema", "multiple_choice", "program")
NEEDS_TARGET = frozenset({"exact", "normalized_exact", "numeric_tolerance", "contains", "multiple_choice"})
DEFAULT_TOLERANCE = 1e-6
MAX_PATTERN_CHARS = 1000
MAX_REGEX_SUBJECT_CHARS = 32_768
MAX_SCHEMA_BYTES = 64 * 1024
MAX_CHOICES = 26
MAX_CHOICE_CHARS = 500
MAX_DETAIL_CHARS = 500
SCORER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"

_OPTIONS = {
    "exact": (), "normalized_exact": (), "contains": (), "json_valid": (),
    "numeric_tolerance": ("tolerance",), "regex": ("pattern",), "json_schema": ("schema",),
    "multiple_choice": ("choices",), "program": ("scorer", "pass_threshold"),
}
_WHITESPACE = re.compile(r"\s+")
_LEADING = "\"'`*_([{<“‘«‹„"
_TRAILING = "\"'`*_)]}>”’»›.,;:!?"
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?(?:[eE][-+]?\d+)?(?![\w])")
_NESTED_QUANTIFIER = re.compile(r"\((?:[^()\\]|\\.)*(?:[+*]|\{\d*,\d*\})\)(?:[+*]|\{\d*,\d*\})")
_ANSWER_MARKER = re.compile(r"answer\s*(?:is|:)\s*", re.IGNORECASE)
_FENCE = re.compile(r"^```[\w+-]*[ \t]*\n(.*?)\n?```$", re.DOTALL)


class ScorerSpecError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class ScorerSpec:
    type: str
    tolerance: float | None = None  # numeric_tolerance
    pattern: str | None = None  # regex
    schema: dict | None = field(default=None, hash=False)  # json_schema
    choices: tuple[str, ...] = ()  # multiple_choice
    scorer: str | None = None  # program
    pass_threshold: float | None = None  # program

    @property
    def needs_target(self) -> bool:
        return self.type in NEEDS_TARGET

    @property
    def needs_program(self) -> bool:
        return self.type == "program"

    def to_dict(self) -> dict:
        """The spec with its defaults filled in: what a suite hash and a replay record bind."""
        values = {"tolerance": self.tolerance, "pattern": self.pattern, "schema": self.schema,
                  "choices": list(self.choices), "scorer": self.scorer, "pass_threshold": self.pass_threshold}
        return {"type": self.type, **{key: values[key] for key in _OPTIONS[self.type]}}


@dataclass(frozen=True)
class ExampleOutcome:
    kind: str  # one of OUTCOME_KINDS
    detail: str  # for a person: why

    def __post_init__(self):
        if self.kind not in OUTCOME_KINDS:
            raise ValueError(f"outcome kind must be one of {', '.join(OUTCOME_KINDS)}, got {self.kind!r}")

    @property
    def passed(self) -> bool:
        return self.kind == "pass"


def _number(value, where: str, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ScorerSpecError(where, "must be a finite number")
    if minimum is not None and value < minimum:
        raise ScorerSpecError(where, f"must be at least {minimum:g}")
    return float(value)


def _pattern(value, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise ScorerSpecError(where, "must be a non-empty string (a Python regular expression)")
    if len(value) > MAX_PATTERN_CHARS:
        raise ScorerSpecError(where, f"at most {MAX_PATTERN_CHARS} characters")
    try:
        re.compile(value)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ScorerSpecError(where, f"does not compile: {exc}") from None
    if _NESTED_QUANTIFIER.search(value):
        raise ScorerSpecError(where, "nests a quantifier inside a repeated group (such as (a+)+), which can "
                                     "backtrack for ever; rewrite it without the nested repetition")
    return value


def _schema(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise ScorerSpecError(where, "must be a JSON Schema object")
    try:
        size = len(canonical_json(value))
    except Exception as exc:  # noqa: BLE001 - rfc8785 raises its own types for NaN, huge ints, bad keys
        raise ScorerSpecError(where, f"is not plain JSON ({exc})") from None
    if size > MAX_SCHEMA_BYTES:
        raise ScorerSpecError(where, f"at most {MAX_SCHEMA_BYTES} bytes of canonical JSON")
    try:
        jsonschema.validators.validator_for(value, default=jsonschema.Draft202012Validator).check_schema(value)
    except jsonschema.SchemaError as exc:
        raise ScorerSpecError(where, f"is not a valid JSON Schema: {exc.message}") from None
    except RecursionError:  # the API refuses bodies this deep; a suite read from elsewhere may not be
        raise ScorerSpecError(where, "nests too deep to check (the metaschema's recursion ran out)") from None
    _check_schema_parts(value, where)
    return value


def _check_schema_parts(node, where: str) -> None:
    """Refuse what would fail or hang at scoring time: a `$ref` outside the schema (nothing is
    fetched) and a `pattern`/`patternProperties` regex with nested quantifiers."""
    if isinstance(node, list):
        for i, item in enumerate(node):
            _check_schema_parts(item, f"{where}[{i}]")
        return
    if not isinstance(node, dict):
        return
    for key, item in node.items():
        here = f"{where}.{key}"
        if key == "$ref" and isinstance(item, str) and not item.startswith("#"):
            raise ScorerSpecError(here, "may only point inside the schema (#...); nothing is fetched")
        if key == "pattern" and isinstance(item, str) and _NESTED_QUANTIFIER.search(item):
            raise ScorerSpecError(here, "nests a quantifier inside a repeated group, which can backtrack for ever")
        if key == "patternProperties" and isinstance(item, dict):
            for name in item:
                if _NESTED_QUANTIFIER.search(name):
                    raise ScorerSpecError(f"{here}.{name}", "nests a quantifier inside a repeated group, which "
                                                            "can backtrack for ever")
        _check_schema_parts(item, here)


def _choices(value, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not 2 <= len(value) <= MAX_CHOICES:
        raise ScorerSpecError(where, f"must be a list of 2 to {MAX_CHOICES} options")
    seen = set()
    for i, choice in enumerate(value):
        if not isinstance(choice, str) or not choice.strip() or len(choice) > MAX_CHOICE_CHARS:
            raise ScorerSpecError(f"{where}[{i}]", f"must be a non-empty string of at most {MAX_CHOICE_CHARS} "
                                                   "characters")
        key = normalize_answer(choice)
        if not key or key in seen:
            raise ScorerSpecError(f"{where}[{i}]", "repeats another option (options are compared normalized)")
        seen.add(key)
    return tuple(c.strip() for c in value)


def parse_scorer_spec(spec, field: str = "scorer") -> ScorerSpec:
    """Check a scorer spec dict once; errors name the key as `<field>.<key>`."""
    if isinstance(spec, ScorerSpec):
        return spec
    if not isinstance(spec, dict):
        raise ScorerSpecError(field, "must be an object with a type")
    kind = spec.get("type")
    if kind not in SCORER_TYPES:
        raise ScorerSpecError(f"{field}.type", f"must be one of {', '.join(SCORER_TYPES)}")
    allowed = _OPTIONS[kind]
    unknown = sorted(set(spec) - {"type", *allowed})
    if unknown:
        raise ScorerSpecError(f"{field}.{unknown[0]}", f"is not an option of the {kind} scorer"
                              + (f" (options: {', '.join(allowed)})" if allowed else " (it takes none)"))
    if kind == "numeric_tolerance":
        return ScorerSpec(kind, tolerance=_number(spec.get("tolerance", DEFAULT_TOLERANCE), f"{field}.tolerance",
                                                  minimum=0))
    if kind == "regex":
        return ScorerSpec(kind, pattern=_pattern(spec.get("pattern"), f"{field}.pattern"))
    if kind == "json_schema":
        return ScorerSpec(kind, schema=_schema(spec.get("schema"), f"{field}.schema"))
    if kind == "multiple_choice":
        return ScorerSpec(kind, choices=_choices(spec.get("choices"), f"{field}.choices"))
    if kind == "program":
        name = spec.get("scorer")
        if not isinstance(name, str) or not SCORER_NAME.match(name) or ".." in name:
            raise ScorerSpecError(f"{field}.scorer", "must name a registered scorer program")
        return ScorerSpec(kind, scorer=name,
                          pass_threshold=_number(spec.get("pass_threshold", 1.0), f"{field}.pass_threshold"))
    return ScorerSpec(kind)


# -- text helpers -------------------------------------------------------------------------------

def strip_thinking(text: str) -> str | None:
    """The answer after a thinking block: everything after the first `</think>`; the text itself when
    there is no thinking; None when a `<think>` opened and never closed (no answer was given)."""
    close = text.find(THINK_CLOSE)
    if close >= 0:
        return text[close + len(THINK_CLOSE):]
    if text.lstrip().startswith(THINK_OPEN):
        return None
    return text


def normalize_answer(text: str) -> str:
    """NFKC, casefold, whitespace collapsed, surrounding quotes/brackets/emphasis/end punctuation off."""
    text = _WHITESPACE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()
    previous = None
    while previous != text:
        previous = text
        text = text.lstrip(_LEADING).rstrip(_TRAILING).strip()
    return text


def last_number(text: str) -> float | None:
    """The last number written in `text` (thousands commas allowed), or None."""
    for match in reversed(list(_NUMBER.finditer(text))):
        token = match.group(0)
        if not any(ch.isdigit() for ch in token):
            continue
        try:
            value = float(token.replace(",", ""))
        except ValueError:
            continue
        return value if math.isfinite(value) else None
    return None


def _clip(text: str, limit: int = 80) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _json_value(text: str):
    """(True, value) when the text, or the one fenced block it is, is one JSON value; (False, why)."""
    body = text.strip()
    fence = _FENCE.match(body)
    if fence:
        body = fence.group(1).strip()

    def refuse(name):
        raise ValueError(f"{name} is not JSON")

    try:
        return True, json.loads(body, parse_constant=refuse)
    except RecursionError:
        return False, "it is nested too deeply"
    except ValueError as exc:
        return False, str(exc)


# -- scorers ------------------------------------------------------------------------------------

def _multiple_choice(choices: tuple[str, ...], answer: str) -> str | list[str]:
    """The chosen option, or the list of options found (empty or several)."""
    by_key = {normalize_answer(c): c for c in choices}
    markers = list(_ANSWER_MARKER.finditer(answer))
    if markers:
        answer = answer[markers[-1].end():]
    whole = normalize_answer(answer)
    if whole in by_key:
        return by_key[whole]
    spans = []
    for choice in choices:
        flags = 0 if len(choice) == 1 else re.IGNORECASE
        for m in re.finditer(r"(?<!\w)" + re.escape(choice) + r"(?!\w)", answer, flags):
            spans.append((m.start(), m.end(), choice))
    found = []
    for start, end, choice in spans:
        inside = any(s <= start and end <= e and (e - s) > (end - start) for s, e, _ in spans)
        if not inside and choice not in found:
            found.append(choice)
    return found[0] if len(found) == 1 else found


def score_example(spec, completion: str, target: str | None, example: dict | None = None, *,
                  strip_think: bool = True) -> ExampleOutcome:
    """Score one completion of one suite example with a built-in scorer (never a program). `example`
    is accepted for per-example options; no built-in scorer reads it today."""
    spec = parse_scorer_spec(spec)
    if spec.needs_program:
        raise ValueError("a program scorer runs in the sandbox: call outcome_from_program with its verdict")
    if not isinstance(completion, str):
        return ExampleOutcome("error", f"the completion is {type(completion).__name__}, not text")
    if strip_think:
        stripped = strip_thinking(completion)
        if stripped is None:
            return ExampleOutcome("invalid", "the thinking block never closed, so there is no answer to score")
        completion = stripped
    if spec.needs_target:
        if target is None or (isinstance(target, str) and not target.strip()):
            return ExampleOutcome("invalid", f"the {spec.type} scorer needs a target and the example has none")
        if not isinstance(target, str):
            return ExampleOutcome("error", f"the target is {type(target).__name__}, not text")
    kind = spec.type
    if kind == "exact":
        ok = completion.strip() == target.strip()
        return ExampleOutcome("pass" if ok else "fail", "exact match" if ok else
                              f"{_clip(completion.strip())} is not exactly {_clip(target.strip())}")
    if kind == "normalized_exact":
        got, want = normalize_answer(completion), normalize_answer(target)
        ok = got == want
        return ExampleOutcome("pass" if ok else "fail", "normalized match" if ok else
                              f"{_clip(got)} is not {_clip(want)} (both normalized)")
    if kind == "numeric_tolerance":
        try:
            want = float(target.strip().replace(",", ""))
        except ValueError:
            return ExampleOutcome("error", f"the target {_clip(target)} is not one number")
        if not math.isfinite(want):
            return ExampleOutcome("error", f"the target {_clip(target)} is not a finite number")
        got = last_number(completion)
        if got is None:
            return ExampleOutcome("invalid", "the completion holds no (finite) number")
        ok = abs(got - want) <= spec.tolerance
        return ExampleOutcome("pass" if ok else "fail", f"{got!r} vs target {want!r} (tolerance {spec.tolerance:g})")
    if kind == "regex":
        subject = completion[-MAX_REGEX_SUBJECT_CHARS:]
        match = re.search(spec.pattern, subject)
        return ExampleOutcome("pass" if match else "fail", f"pattern matched {_clip(match.group(0))}" if match
                              else "the pattern does not match the completion")
    if kind == "contains":
        ok = target.strip() in completion
        return ExampleOutcome("pass" if ok else "fail", f"{'contains' if ok else 'does not contain'} the target "
                              f"{_clip(target.strip())}")
    if kind == "json_valid":
        ok, value = _json_value(completion)
        return ExampleOutcome("pass" if ok else "fail", "valid JSON" if ok else f"not valid JSON: {value}")
    if kind == "json_schema":
        ok, value = _json_value(completion)
        if not ok:
            return ExampleOutcome("invalid", f"not valid JSON: {value}")
        validator = jsonschema.validators.validator_for(spec.schema, default=jsonschema.Draft202012Validator)
        try:
            error = jsonschema.exceptions.best_match(validator(spec.schema).iter_errors(value))
        except RecursionError:
            return ExampleOutcome("error", "the schema could not be applied: it recurses without end")
        except Exception as exc:  # noqa: BLE001 - an unresolvable local $ref, a bad regex inside the schema
            return ExampleOutcome("error", f"the schema could not be applied: {type(exc).__name__}: "
                                           f"{exc}"[:MAX_DETAIL_CHARS])
        if error is None:
            return ExampleOutcome("pass", "valid against the schema")
        where = "/".join(str(p) for p in error.absolute_path) or "(root)"
        return ExampleOutcome("fail", f"schema violation at {where}: {error.message}"[:MAX_DETAIL_CHARS])
    if kind == "multiple_choice":
        keys = {normalize_answer(c): c for c in spec.choices}
        correct = keys.get(normalize_answer(target))
        if correct is None:
            return ExampleOutcome("error", f"the target {_clip(target)} is not one of the options")
        chosen = _multiple_choice(spec.choices, completion)
        if isinstance(chosen, list):
            if not chosen:
                return ExampleOutcome("invalid", "no option was chosen")
            return ExampleOutcome("invalid", f"several options were named: {', '.join(chosen)}"[:MAX_DETAIL_CHARS])
        ok = chosen == correct
        return ExampleOutcome("pass" if ok else "fail", f"chose {_clip(chosen)}, the answer is {_clip(correct)}")
    raise AssertionError(kind)  # pragma: no cover - parse_scorer_spec admits only SCORER_TYPES


# -- scorer programs ----------------------------------------------------------------------------

def program_payload(example: dict, completion: str, target: str | None) -> dict:
    """The stdin object for a scorer program, shaped like the rollout scorer contract (`task` is the
    example, `content` the completion) so one program can score rollouts and suite examples."""
    return {"task": example, "content": completion, "target": target, "example_id": example.get("id")}


def outcome_from_program(verdict: ScorerResult | BaseException, spec=None) -> ExampleOutcome:
    """A sandboxed scorer's verdict as an example outcome: its ScorerResult (reward >= the spec's
    pass_threshold, 1.0 by default, passes) or the exception `run_scorer` raised (always `error`)."""
    threshold = parse_scorer_spec(spec).pass_threshold if spec is not None else 1.0
    if threshold is None:
        raise ValueError("outcome_from_program needs a program scorer spec")
    if isinstance(verdict, ScorerError):
        return ExampleOutcome("error", f"scorer failed ({verdict.code}): {verdict.message}"[:MAX_DETAIL_CHARS])
    if isinstance(verdict, BaseException):
        return ExampleOutcome("error", f"scorer failed: {type(verdict).__name__}: {verdict}"[:MAX_DETAIL_CHARS])
    reward = getattr(verdict, "reward", None)
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        return ExampleOutcome("error", f"the scorer returned reward {reward!r}; it must be a finite number")
    ok = reward >= threshold
    return ExampleOutcome("pass" if ok else "fail", f"reward {reward:g} {'>=' if ok else '<'} pass threshold "
                          f"{threshold:g}")
