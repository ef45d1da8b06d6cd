"""Each built-in suite scorer, the spec checker, thinking removal and the program-verdict mapping."""

from __future__ import annotations

import pytest

from evaluations.example_scorers import (
    OUTCOME_KINDS,
    ExampleOutcome,
    ScorerSpec,
    ScorerSpecError,
    last_number,
    normalize_answer,
    outcome_from_program,
    parse_scorer_spec,
    program_payload,
    score_example,
    strip_thinking,
)
from evaluations.sandbox.types import SCORER_CRASHED, SCORER_OUTPUT_INVALID, ScorerError, ScorerResult

EXAMPLE = {"id": "ex-1", "messages": [{"role": "user", "content": "q"}]}


def kind(spec, completion, target=None, **kw):
    return score_example(spec, completion, target, EXAMPLE, **kw).kind


# -- spec parsing -------------------------------------------------------------------------------

def test_parse_defaults_and_to_dict():
    spec = parse_scorer_spec({"type": "numeric_tolerance"})
    assert spec == ScorerSpec("numeric_tolerance", tolerance=1e-6)
    assert spec.to_dict() == {"type": "numeric_tolerance", "tolerance": 1e-6}
    assert parse_scorer_spec({"type": "exact"}).to_dict() == {"type": "exact"}
    program = parse_scorer_spec({"type": "program", "scorer": "math.v2"})
    assert program.needs_program and not program.needs_target
    assert program.to_dict() == {"type": "program", "scorer": "math.v2", "pass_threshold": 1.0}
    mc = parse_scorer_spec({"type": "multiple_choice", "choices": ["A", "B"]})
    assert mc.choices == ("A", "B") and mc.needs_target
    assert mc.to_dict() == {"type": "multiple_choice", "choices": ["A", "B"]}
    assert parse_scorer_spec(mc) is mc


@pytest.mark.parametrize("spec, field", [
    (None, "scorer"),
    ({"type": "fuzzy"}, "scorer.type"),
    ({}, "scorer.type"),
    ({"type": "exact", "case_sensitive": False}, "scorer.case_sensitive"),
    ({"type": "numeric_tolerance", "tolerence": 0.1}, "scorer.tolerence"),
    ({"type": "numeric_tolerance", "tolerance": -1}, "scorer.tolerance"),
    ({"type": "numeric_tolerance", "tolerance": float("nan")}, "scorer.tolerance"),
    ({"type": "numeric_tolerance", "tolerance": True}, "scorer.tolerance"),
    ({"type": "regex"}, "scorer.pattern"),
    ({"type": "regex", "pattern": "("}, "scorer.pattern"),
    ({"type": "regex", "pattern": "a" * 1001}, "scorer.pattern"),
    ({"type": "regex", "pattern": "(a+)+$"}, "scorer.pattern"),
    ({"type": "regex", "pattern": r"^(\w*)*x"}, "scorer.pattern"),
    ({"type": "regex", "pattern": "(?:a|b{1,})*c"}, "scorer.pattern"),
    ({"type": "json_schema"}, "scorer.schema"),
    ({"type": "json_schema", "schema": {"type": "nonsense"}}, "scorer.schema"),
    ({"type": "json_schema", "schema": {"enum": ["x" * 70000]}}, "scorer.schema"),
    ({"type": "json_schema", "schema": {"$ref": "https://example.com/s.json"}}, "scorer.schema.$ref"),
    ({"type": "json_schema", "schema": {"prefixItems": [{"type": "string", "pattern": "(a+)+$"}]}},
     "scorer.schema.prefixItems[0].pattern"),
    ({"type": "json_schema", "schema": {"patternProperties": {"(x*)*": {}}}}, "scorer.schema.patternProperties.(x*)*"),
    ({"type": "multiple_choice", "choices": ["A"]}, "scorer.choices"),
    ({"type": "multiple_choice", "choices": "AB"}, "scorer.choices"),
    ({"type": "multiple_choice", "choices": ["A", " a "]}, "scorer.choices[1]"),
    ({"type": "multiple_choice", "choices": ["A", ""]}, "scorer.choices[1]"),
    ({"type": "multiple_choice", "choices": [chr(65 + i) for i in range(27)]}, "scorer.choices"),
    ({"type": "program"}, "scorer.scorer"),
    ({"type": "program", "scorer": "../etc/passwd"}, "scorer.scorer"),
    ({"type": "program", "scorer": "ok", "pass_threshold": "high"}, "scorer.pass_threshold"),
])
def test_parse_rejects_bad_specs_naming_the_field(spec, field):
    with pytest.raises(ScorerSpecError) as err:
        parse_scorer_spec(spec)
    assert err.value.field == field
    assert str(err.value).startswith(field + ": ")


def test_parse_field_prefix():
    with pytest.raises(ScorerSpecError) as err:
        parse_scorer_spec({"type": "regex", "pattern": ""}, field="examples[3].scorer")
    assert err.value.field == "examples[3].scorer.pattern"


def test_harmless_regex_shapes_are_accepted():
    for pattern in [r"\d+", r"(ab)+", r"(a|b)+c", r"^answer: (\w+)$", r"(a+b)+", r"(?i)paris"]:
        assert parse_scorer_spec({"type": "regex", "pattern": pattern}).pattern == pattern


def test_outcome_kind_is_checked():
    assert OUTCOME_KINDS == ("pass", "fail", "invalid", "error")
    with pytest.raises(ValueError):
        ExampleOutcome("maybe", "")
    assert ExampleOutcome("pass", "").passed and not ExampleOutcome("fail", "").passed


# -- helpers ------------------------------------------------------------------------------------

def test_strip_thinking():
    assert strip_thinking("<think>hmm</think>42") == "42"
    assert strip_thinking("hmm, so</think>\n\n42") == "\n\n42"  # the template owns the opener
    assert strip_thinking("plain 42") == "plain 42"
    assert strip_thinking("  <think>still going") is None
    assert strip_thinking("a</think>b</think>c") == "b</think>c"


def test_normalize_answer():
    assert normalize_answer('  "Paris."  ') == "paris"
    assert normalize_answer("**The   Answer**\n") == "the answer"
    assert normalize_answer("(B)") == "b"
    assert normalize_answer("-5") == "-5" and normalize_answer("$5") == "$5"
    assert normalize_answer("Straße") == "strasse"  # casefold
    assert normalize_answer("ﬁne") == "fine"  # NFKC
    assert normalize_answer("“quoted”!") == "quoted"


@pytest.mark.parametrize("text, value", [
    ("The answer is 42.", 42.0), ("-3.5 then 7", 7.0), ("x = -0.25", -0.25), ("1,234,567 apples", 1234567.0),
    ("1e3", 1000.0), ("no digits", None), ("v1.2.3 and 42nd", None), ("3, 4", 4.0), ("total: .5", 0.5),
    ("$19.99", 19.99), ("1" * 400, None),
])
def test_last_number(text, value):
    assert last_number(text) == value


# -- scorers ------------------------------------------------------------------------------------

def test_exact():
    spec = {"type": "exact"}
    assert kind(spec, "  Paris\n", "Paris ") == "pass"
    assert kind(spec, "paris", "Paris") == "fail"
    assert kind(spec, "<think>Lyon?</think> Paris", "Paris") == "pass"
    assert kind(spec, "<think>Lyon?</think> Paris", "Paris", strip_think=False) == "fail"
    outcome = score_example(spec, "Lyon", "Paris", EXAMPLE)
    assert outcome.kind == "fail" and "'Lyon'" in outcome.detail


def test_missing_target_is_invalid_for_every_type_that_needs_one():
    for spec in [{"type": "exact"}, {"type": "normalized_exact"}, {"type": "numeric_tolerance"},
                 {"type": "contains"}, {"type": "multiple_choice", "choices": ["A", "B"]}]:
        for target in (None, "", "   "):
            outcome = score_example(spec, "A", target, EXAMPLE)
            assert outcome.kind == "invalid" and "needs a target" in outcome.detail, spec


def test_unclosed_thinking_is_invalid():
    outcome = score_example({"type": "exact"}, "<think>never ends", "x", EXAMPLE)
    assert outcome.kind == "invalid" and "never closed" in outcome.detail


def test_non_text_completion_or_target_is_error():
    assert kind({"type": "exact"}, None, "x") == "error"
    assert kind({"type": "exact"}, "x", 5) == "error"


def test_normalized_exact():
    spec = {"type": "normalized_exact"}
    assert kind(spec, "  **PARIS**.", "paris") == "pass"
    assert kind(spec, "New\n  York", "new york") == "pass"
    assert kind(spec, "'-5'", "-5") == "pass"
    assert kind(spec, "5", "-5") == "fail"
    assert kind(spec, "The answer is Paris", "Paris") == "fail"


def test_numeric_tolerance():
    assert kind({"type": "numeric_tolerance"}, "so 6 * 7 = 42", "42") == "pass"
    assert kind({"type": "numeric_tolerance"}, "42.0000001", "42") == "pass"
    assert kind({"type": "numeric_tolerance"}, "42.001", "42") == "fail"
    assert kind({"type": "numeric_tolerance", "tolerance": 0.01}, "42.001", "42") == "pass"
    assert kind({"type": "numeric_tolerance", "tolerance": 0}, "1,000", "1000") == "pass"
    assert kind({"type": "numeric_tolerance"}, "first 42, then 41", "42") == "fail"  # the last number counts
    assert kind({"type": "numeric_tolerance"}, "-7", " -7 ") == "pass"
    outcome = score_example({"type": "numeric_tolerance"}, "I do not know", "42", EXAMPLE)
    assert outcome.kind == "invalid" and "no (finite) number" in outcome.detail
    assert kind({"type": "numeric_tolerance"}, "42", "forty-two") == "error"
    assert kind({"type": "numeric_tolerance"}, "42", "inf") == "error"


def test_regex():
    spec = {"type": "regex", "pattern": r"(?i)answer:\s*paris\b"}
    assert kind(spec, "Thinking...\nAnswer: Paris.") == "pass"  # re.search, no target needed
    assert kind(spec, "Answer: Lyon") == "fail"
    # only the tail of an overlong completion is searched
    long_tail = "Answer: Paris " + "x" * 40_000
    assert kind(spec, long_tail) == "fail"
    assert kind(spec, "x" * 40_000 + " Answer: Paris") == "pass"


def test_contains():
    spec = {"type": "contains"}
    assert kind(spec, "The capital is Paris, of course.", " Paris ") == "pass"
    assert kind(spec, "The capital is paris", "Paris") == "fail"  # case-sensitive


def test_json_valid():
    spec = {"type": "json_valid"}
    assert kind(spec, ' {"a": [1, 2]} ') == "pass"
    assert kind(spec, '```json\n{"a": 1}\n```') == "pass"
    assert kind(spec, "42") == "pass"
    assert kind(spec, '{"a": 1} trailing') == "fail"
    assert kind(spec, '{"a": NaN}') == "fail"
    assert kind(spec, "") == "fail"
    assert kind(spec, "[" * 100_000) == "fail"


def test_json_schema():
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0}},
              "required": ["name"], "additionalProperties": False}
    spec = {"type": "json_schema", "schema": schema}
    assert kind(spec, '{"name": "Ada", "age": 36}') == "pass"
    outcome = score_example(spec, '{"name": "Ada", "age": -1}', None, EXAMPLE)
    assert outcome.kind == "fail" and "age" in outcome.detail
    assert kind(spec, '{"age": 3}') == "fail"
    assert kind(spec, "not json") == "invalid"
    draft7 = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "items": {"type": "number"}}
    assert kind({"type": "json_schema", "schema": draft7}, "[1, 2.5]") == "pass"
    assert kind({"type": "json_schema", "schema": draft7}, '[1, "x"]') == "fail"
    local = {"$defs": {"name": {"type": "string"}}, "properties": {"n": {"$ref": "#/$defs/name"}}}
    assert kind({"type": "json_schema", "schema": local}, '{"n": "x"}') == "pass"
    assert kind({"type": "json_schema", "schema": local}, '{"n": 1}') == "fail"
    dangling = score_example({"type": "json_schema", "schema": {"$ref": "#/$defs/missing"}}, "1", None, EXAMPLE)
    assert dangling.kind == "error" and "could not be applied" in dangling.detail


MC = {"type": "multiple_choice", "choices": ["A", "B", "C", "D"]}


@pytest.mark.parametrize("completion, expected", [
    ("B", "pass"), ("b", "pass"), ("(B)", "pass"), ("**B**.", "pass"), ("The answer is B.", "pass"),
    ("Answer: (B)", "pass"), ("B) because it is larger", "pass"), ("I pick option B here", "pass"),
    ("A cat would say B? No. The answer is C", "fail"),  # the last answer marker decides
    ("C", "fail"),
    ("It is either A or B", "invalid"), ("no idea", "invalid"), ("", "invalid"),
    ("a reasonable guess is B", "pass"),  # lower-case "a" is an article, not option A
])
def test_multiple_choice_letters(completion, expected):
    assert kind(MC, completion, "B") == expected


def test_multiple_choice_texts_and_nested_options():
    spec = {"type": "multiple_choice", "choices": ["York", "New York", "Boston"]}
    assert kind(spec, "I would say New York.", "New York") == "pass"  # York inside New York does not count
    assert kind(spec, "York, not Boston", "York") == "invalid"
    assert kind(spec, "the answer is boston", "Boston") == "pass"
    outcome = score_example(spec, "York or Boston", "York", EXAMPLE)
    assert "several options" in outcome.detail
    assert kind(spec, "Boston", "Chicago") == "error"  # the target must be an option


def test_program_spec_is_not_scored_here():
    with pytest.raises(ValueError):
        score_example({"type": "program", "scorer": "s"}, "x", None, EXAMPLE)


# -- programs -----------------------------------------------------------------------------------

def _result(reward):
    return ScorerResult(reward=reward, raw_output=str(reward), stderr_tail="", elapsed_ms=1.0, sandboxed=True,
                        mechanism="bubblewrap")


def test_outcome_from_program():
    assert outcome_from_program(_result(1.0)).kind == "pass"
    assert outcome_from_program(_result(0.5)).kind == "fail"
    spec = {"type": "program", "scorer": "s", "pass_threshold": 0.5}
    assert outcome_from_program(_result(0.5), spec).kind == "pass"
    assert outcome_from_program(_result(0.49), parse_scorer_spec(spec)).kind == "fail"
    crashed = outcome_from_program(ScorerError(SCORER_CRASHED, "exited with status 1"))
    assert crashed.kind == "error" and "scorer_crashed" in crashed.detail
    assert outcome_from_program(ScorerError(SCORER_OUTPUT_INVALID, "printed 'yes'")).kind == "error"
    assert outcome_from_program(RuntimeError("boom")).kind == "error"
    assert outcome_from_program(_result(float("nan"))).kind == "error"
    with pytest.raises(ValueError):
        outcome_from_program(_result(1.0), {"type": "exact"})


def test_program_payload_follows_the_rollout_contract():
    payload = program_payload(EXAMPLE, "42", "42")
    assert payload == {"task": EXAMPLE, "content": "42", "target": "42", "example_id": "ex-1"}
