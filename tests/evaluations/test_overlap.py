"""The held-out admission check: each overlap kind, its variants, and suites that do not overlap."""

from __future__ import annotations

import hashlib

import pytest
import rfc8785

from evaluations.overlap import (
    OVERLAP_KINDS,
    Overlap,
    declared_ids,
    find_overlaps,
    normalize_value,
    prompt_variants,
    row_identities,
    row_targets,
)


def user(text):
    return {"role": "user", "content": text}


def system(text):
    return {"role": "system", "content": text}


def group(*messages, **extra):
    return {"messages": list(messages), "completions": [{"text": "4", "reward": 1.0}, {"text": "5", "reward": 0.0}],
            **extra}


def example(example_id, *messages, target=None, provenance=None, metadata=None):
    value = {"id": example_id, "messages": list(messages)}
    if target is not None:
        value["target"] = target
    if provenance is not None or metadata is not None:
        value["metadata"] = {**(metadata or {}), **({"kiln_dataset_provenance": provenance} if provenance else {})}
    return value


def kinds(rows, examples, **kw):
    return [(o.row_index, o.example_id, o.kind) for o in find_overlaps(rows, examples, **kw)]


# -- identities ---------------------------------------------------------------------------------

def test_row_identities_are_sha256_of_key_sorted_canonical_json():
    row = {"b": [1, "Two  Words"], "a": {"z": True, "y": None}}
    exact, normalized = row_identities(row)
    expected = "sha256:" + hashlib.sha256(b'{"a":{"y":null,"z":true},"b":[1,"Two  Words"]}').hexdigest()
    assert exact == expected
    assert normalized == "sha256:" + hashlib.sha256(rfc8785.dumps({"a": {"y": None, "z": True},
                                                                    "b": [1, "two words"]})).hexdigest()
    assert row_identities({"a": {"y": None, "z": True}, "b": [1, "Two  Words"]}) == (exact, normalized)  # key order
    other_exact, other_normalized = row_identities({"b": [1, " two\nWORDS "], "a": {"z": True, "y": None}})
    assert other_exact != exact and other_normalized == normalized


def test_normalize_value_keeps_keys_and_non_strings():
    assert normalize_value({"Key": ["  A\tB ", 1.5, None, {"X": "Y"}]}) == {"Key": ["a b", 1.5, None, {"X": "y"}]}


def test_identities_agree_with_the_dataset_split_definitions():
    split = pytest.importorskip("evaluations.datasets.split")
    row = group(system("Be Brief"), user("What  is 2+2?"), group_id="g-1", metadata={"session_id": " s-9 "})
    if hasattr(split, "exact_identity"):
        assert row_identities(row) == (split.exact_identity(row), split.normalized_identity(row))
    if hasattr(split, "declared_ids"):
        for key in ("group_id", "session_id"):
            assert declared_ids(row, key) == list(split.declared_ids(row, key))


def test_declared_ids():
    row = {"group_id": " g1 ", "metadata": {"group_id": "g2", "session_id": 7}, "provenance": {"group_id": "g1"},
           "extra": {"session_id": ""}, "other": {"group_id": "ignored"}}
    assert declared_ids(row, "group_id") == ["g1", "g2"]
    assert declared_ids(row, "session_id") == ["7"]
    assert declared_ids({"group_id": True}, "group_id") == []


def test_prompt_variants():
    messages = [system("S"), user("U"), {"role": "assistant", "content": None,
                                         "tool_calls": [{"id": "c1", "type": "function",
                                                         "function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "result"}]
    labels = [label for label, _ in prompt_variants(messages)]
    assert labels == ["as given", "without the system message", "without trailing tool results",
                      "without the system message, without trailing tool results"]
    assert prompt_variants([user("U")]) == [("as given", [{"role": "user", "content": "U"}])]
    assert prompt_variants([system("only")])[1:] == []  # an empty variant is dropped
    assert prompt_variants(None) == []
    sft = [user("U"), {"role": "assistant", "content": "A"}]
    assert [v for _, v in prompt_variants(sft, drop_trailing_assistant=True)][-1] == [{"role": "user",
                                                                                     "content": "U"}]


def test_row_targets():
    row = {"messages": [user("q"), {"role": "assistant", "content": [{"type": "text", "text": "final answer"}]}],
           "target": "root target", "metadata": {"reference": "ref answer"}, "extra": {"target": 5}}
    assert row_targets(row) == ["root target", "ref answer", "final answer"]
    assert row_targets(group(user("q"))) == []  # completions are samples, not targets


# -- each overlap kind --------------------------------------------------------------------------

def test_no_overlap():
    rows = [group(user("What is 2+2?"), group_id="g1"), group(user("What is 3+3?"))]
    examples = [example("e1", user("What is 4+4?"), target="8"),
                example("e2", user("What is 5+5?"), target="10",
                        provenance={"exact_identity": "sha256:other", "normalized_identity": "sha256:other-n",
                                    "group_id": "g2", "session_id": "s2"})]
    assert find_overlaps(rows, examples) == []
    assert find_overlaps([], examples) == [] and find_overlaps(rows, []) == []


def test_exact_prompt():
    rows = [group(user("unrelated")), group(system("Be brief."), user("What is 2+2?"))]
    overlaps = find_overlaps(rows, [example("e1", system("Be brief."), user("What is 2+2?"))])
    assert overlaps == [Overlap(1, "e1", "exact_prompt",
                                "the training prompt (as given) equals the example prompt (as given) exactly")]
    assert overlaps[0].field == "groups[1]"
    assert overlaps[0].to_dict() == {"row_index": 1, "field": "groups[1]", "example_id": "e1",
                                     "kind": "exact_prompt", "detail": overlaps[0].detail}


def test_normalized_prompt():
    rows = [group(user("What   is 2+2?\n"))]
    assert kinds(rows, [example("e1", user(" what is 2+2? "))]) == [(0, "e1", "normalized_prompt")]
    # content parts are joined before comparing
    parts = [group({"role": "user", "content": [{"type": "text", "text": "What is "}, {"type": "text",
                                                                                       "text": "2+2?"}]})]
    assert kinds(parts, [example("e1", user("What is 2+2?"))]) == [(0, "e1", "exact_prompt")]


def test_prompt_with_the_system_message_removed():
    rows = [group(system("You are a tutor."), user("What is 2+2?"))]
    assert kinds(rows, [example("e1", user("What is 2+2?"))]) == [(0, "e1", "exact_prompt")]
    assert kinds(rows, [example("e1", system("Different system"), user("what is 2+2?"))]) == \
        [(0, "e1", "normalized_prompt")]
    detail = find_overlaps(rows, [example("e1", system("Other"), user("What is 2+2?"))])[0].detail
    assert "without the system message" in detail


def test_prompt_with_trailing_tool_results_removed():
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
                                                               "function": {"name": "calc", "arguments": "2+2"}}]}
    rows = [group(user("What is 2+2?"), call, {"role": "tool", "tool_call_id": "call_1", "content": "4"})]
    other_id = {**call, "tool_calls": [{"id": "call_9", "type": "function",
                                        "function": {"name": "calc", "arguments": "2+2"}}]}
    assert kinds(rows, [example("e1", user("What is 2+2?"), other_id)]) == [(0, "e1", "exact_prompt")]
    different_call = {**call, "tool_calls": [{"function": {"name": "calc", "arguments": "3+3"}}]}
    assert kinds(rows, [example("e1", user("What is 2+2?"), different_call)]) == []


def test_sft_style_row_without_its_final_assistant_turn():
    rows = [{"messages": [user("Capital of France?"), {"role": "assistant", "content": "Paris"}]}]
    assert kinds(rows, [example("e1", user("Capital of France?"), target="Paris")]) == [(0, "e1", "exact_prompt")]


def test_exact_and_normalized_source_row():
    row = group(user("What is 2+2?"), metadata={"topic": "math"})
    exact, normalized = row_identities(row)
    flat = example("e1", user("a different prompt"), provenance={"dataset": "d", "exact_identity": exact})
    assert kinds([row], [flat]) == [(0, "e1", "exact_source_row")]
    # the row differs from the source only in case/whitespace
    changed = group(user("what  is 2+2?"), metadata={"topic": "MATH"})
    assert row_identities(changed)[1] == normalized
    by_normalized = example("e2", user("a different prompt"),
                            provenance={"exact_identity": exact, "normalized_identity": normalized})
    assert kinds([changed], [by_normalized]) == [(0, "e2", "normalized_source_row")]
    # the reference layout: a nested row object with content/normalized sha256
    nested = example("e3", user("x"), provenance={"row": {"content_sha256": exact, "normalized_sha256": "n"}})
    assert kinds([row], [nested]) == [(0, "e3", "exact_source_row")]


def test_exact_and_normalized_target():
    long = "The capital of France is Paris."
    rows = [{"messages": [user("Tell me about France"), {"role": "assistant", "content": long}]},
            group(user("q2"), target="  Forty two is the answer  ")]
    examples = [example("e1", user("Which city is the capital?"), target=long),
                example("e2", user("Another question"), target="forty TWO is the answer")]
    assert kinds(rows, examples) == [(0, "e1", "exact_target"), (1, "e2", "normalized_target")]


def test_short_targets_alone_are_not_overlap():
    rows = [group(user("What is 2+2?"), target="4"), group(user("Pick one"), target="B")]
    examples = [example("e1", user("What is 1+3?"), target="4"), example("e2", user("Pick another"), target="B")]
    assert find_overlaps(rows, examples) == []
    assert kinds(rows, examples, min_target_chars=1) == [(0, "e1", "exact_target"), (1, "e2", "exact_target")]


def test_shared_group_and_session_ids():
    rows = [group(user("a"), metadata={"group_id": "g-7"}), group(user("b"), extra={"session_id": "s-9"}),
            group(user("c"), provenance={"session_id": "s-other", "group_id": "g-other"})]
    examples = [example("e1", user("x"), provenance={"group_id": "g-7", "session_id": "s-1"}),
                example("e2", user("y"), provenance={"row": {"session_id": "s-9"}}),
                example("e3", user("z"), provenance={"group_ids": ["g-0", "g-other"]})]
    assert kinds(rows, examples) == [(0, "e1", "group_id"), (1, "e2", "session_id"), (2, "e3", "group_id")]
    assert find_overlaps(rows, examples)[0].detail == "both declare group_id 'g-7'"


def test_empty_ids_and_example_metadata_ids_do_not_link():
    rows = [group(user("a"), group_id="", session_id="  ")]
    examples = [example("e1", user("x"), provenance={"group_id": "", "session_id": " "}),
                example("e2", user("y"), metadata={"group_id": "g"})]
    assert find_overlaps(rows + [group(user("b"), group_id="g")], examples) == []


# -- reporting ----------------------------------------------------------------------------------

def test_one_overlap_per_pair_with_the_first_kind():
    row = group(user("What is 2+2?"), group_id="g1")
    exact, _ = row_identities(row)
    examples = [example("e1", user("What is 2+2?"), provenance={"exact_identity": exact, "group_id": "g1"})]
    assert kinds([row], examples) == [(0, "e1", "exact_prompt")]
    assert OVERLAP_KINDS[0] == "exact_prompt"


def test_limit_and_order():
    rows = [group(user(f"q{i}")) for i in range(30)]
    examples = [example(f"e{i}", user(f"q{i}")) for i in reversed(range(30))]
    found = find_overlaps(rows, examples)
    assert len(found) == 20 and [o.row_index for o in found] == list(range(20))
    assert len(find_overlaps(rows, examples, limit=None)) == 30
    assert len(find_overlaps(rows, examples, limit=3)) == 3
    with pytest.raises(ValueError):
        find_overlaps(rows, examples, limit=0)


def test_one_row_against_several_examples():
    rows = [group(user("Same prompt"))]
    examples = [example("e1", user("Same prompt")), example("e2", user("same PROMPT")), example("e3", user("x"))]
    assert kinds(rows, examples) == [(0, "e1", "exact_prompt"), (0, "e2", "normalized_prompt")]


def test_examples_without_ids_are_named_by_position_and_bad_input_is_refused():
    assert kinds([group(user("q"))], [{"messages": [user("q")]}]) == [(0, "#0", "exact_prompt")]
    with pytest.raises(TypeError):
        find_overlaps([group(user("q"))], ["not an example"])
    with pytest.raises(TypeError):
        find_overlaps(["not a row"], [example("e1", user("q"))])
