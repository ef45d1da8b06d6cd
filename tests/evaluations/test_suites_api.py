"""/v1/eval/suites and /v1/eval/datasets/{name}/synthesize: the suite contract, its hash, storage,
conflicts, and suites built from a dataset partition with their provenance."""

from __future__ import annotations

import hashlib
import json

import pytest

from core.canonical import canonical_json
from evaluations.models import EvalSuite, Scorer
from evaluations.suites import SuiteError, check_scorer_spec
from tests.evaluations import dataset_support
from tests.evaluations.dataset_support import error, group, jsonl, ok, send, upload

pytestmark = pytest.mark.django_db
api, home = dataset_support.api, dataset_support.home  # the shared fixtures

EXAMPLES = [{"id": "q1", "messages": [{"role": "user", "content": "2+3?"}], "target": "5"},
            {"id": "q2", "messages": [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "4+4?"}], "target": "8", "metadata": {"k": 1}}]


def _suite(name="sums", scorer=None, examples=None, **extra):
    return {"name": name, "scorer": scorer or {"type": "exact"}, "examples": EXAMPLES if examples is None else examples,
            **extra}


def test_a_suite_is_stored_with_its_content_hash(api, home):
    created = ok(send(api, "post", "/v1/eval/suites", _suite(description="two sums")))
    expected = "sha256:" + hashlib.sha256(canonical_json(
        {"schema": "kiln.eval-suite.v1", "scorer": {"type": "exact"}, "examples": EXAMPLES})).hexdigest()
    assert created["suite_hash"] == expected and created["examples"] == 2
    assert created["source"] == {"kind": "upload"} and created["description"] == "two sums"
    path = home / "adapters" / ".eval" / "suites" / "sums.json"
    stored = json.loads(path.read_text())
    assert stored["examples"] == EXAMPLES and stored["suite_hash"] == expected and stored["name"] == "sums"
    shown = ok(api.get("/v1/eval/suites/sums"))
    assert shown["examples"] == EXAMPLES and shown["scorer"] == {"type": "exact"}
    assert [s["name"] for s in ok(api.get("/v1/eval/suites"))] == ["sums"]
    renamed = ok(send(api, "post", "/v1/eval/suites", _suite(name="sums-copy", description="other words")))
    assert renamed["suite_hash"] == expected  # name and description are not content
    changed = ok(send(api, "post", "/v1/eval/suites", _suite(name="sums-tol", scorer={"type": "numeric_tolerance"})))
    assert changed["suite_hash"] != expected


def test_an_existing_name_is_a_conflict_unless_forced(api, home):
    first = ok(send(api, "post", "/v1/eval/suites", _suite()))
    error(send(api, "post", "/v1/eval/suites", _suite(examples=EXAMPLES[:1])), 409, "eval_suite_exists")
    assert ok(api.get("/v1/eval/suites/sums"))["suite_hash"] == first["suite_hash"]
    replaced = ok(send(api, "post", "/v1/eval/suites?force=true", _suite(examples=EXAMPLES[:1])))
    assert replaced["examples"] == 1 and replaced["suite_hash"] != first["suite_hash"]
    assert len(ok(api.get("/v1/eval/suites/sums"))["examples"]) == 1
    assert EvalSuite.objects.count() == 1


def test_delete_and_not_found(api, home):
    ok(send(api, "post", "/v1/eval/suites", _suite()))
    assert ok(api.delete("/v1/eval/suites/sums")) == {"name": "sums", "status": "deleted"}
    assert not (home / "adapters" / ".eval" / "suites" / "sums.json").exists()
    assert list((home / "adapters" / ".eval" / "suites").iterdir()) == []
    error(api.get("/v1/eval/suites/sums"), 404, "eval_suite_not_found")
    error(api.delete("/v1/eval/suites/sums"), 404, "eval_suite_not_found")


@pytest.mark.parametrize("body, field", [
    (_suite(name="../x"), "name"),
    (_suite(scorer={"type": "fuzzy"}), "scorer.type"),
    ({"name": "s", "examples": EXAMPLES}, "scorer"),
    (_suite(examples=[]), "examples"),
    (_suite(examples=[{**EXAMPLES[0], "id": ""}]), "examples[0].id"),
    (_suite(examples=[EXAMPLES[0], {**EXAMPLES[1], "id": "q1"}]), "examples[1].id"),
    (_suite(examples=[{**EXAMPLES[0], "messages": []}]), "examples[0].messages"),
    (_suite(examples=[{**EXAMPLES[0], "messages": [{"role": "robot", "content": "x"}]}]), "examples[0].messages[0].role"),
    (_suite(examples=[{"id": "a", "messages": EXAMPLES[0]["messages"]}]), "examples[0].target"),
    (_suite(examples=[{**EXAMPLES[0], "target": ["5"]}]), "examples[0].target"),
    (_suite(examples=[{**EXAMPLES[0], "scorer": {"type": "regex", "pattern": "("}}]), "examples[0].scorer.pattern"),
    (_suite(examples=[{**EXAMPLES[0], "metadata": "x"}]), "examples[0].metadata"),
    (_suite(scorer={"type": "numeric_tolerance", "tolerance": -1}), "scorer.tolerance"),
    (_suite(scorer={"type": "numeric_tolerance"}, examples=[{**EXAMPLES[0], "target": "five"}]), "examples[0].target"),
    (_suite(scorer={"type": "multiple_choice", "choices": ["A", "B"]}), "examples[0].target"),
    (_suite(scorer={"type": "program", "scorer": "never-registered"}), "scorer.scorer"),
    (_suite(scorer={"type": "exact", "tolerance": 1}), "scorer.tolerance"),
    (_suite(description=5), "description"),
    ({"scorer": {"type": "exact"}, "examples": EXAMPLES}, "name"),
])
def test_bad_suites_name_the_field_and_store_nothing(api, home, body, field):
    message = error(send(api, "post", "/v1/eval/suites", body), 400, "eval_invalid_request")
    assert message.startswith(f"{field}:") and "None" not in message, message  # a missing name: "is required"
    assert not EvalSuite.objects.exists()
    assert not (home / "adapters" / ".eval" / "suites").exists() or \
        list((home / "adapters" / ".eval" / "suites").iterdir()) == []


@pytest.mark.parametrize("ids, field", [(["a", "a "], "examples[1].id"), ([" q1", "q2"], "examples[0].id"),
                                        (["q1", "q2\t"], "examples[1].id")])
def test_an_id_with_surrounding_whitespace_is_refused(api, home, ids, field):
    """"a" and "a " used to be two ids that look like one; the rows, reruns and the gate pair by id."""
    examples = [{**EXAMPLES[0], "id": example_id} for example_id in ids]
    message = error(send(api, "post", "/v1/eval/suites", _suite(examples=examples)), 400, "eval_invalid_request")
    assert message.startswith(f"{field}: ") and "leading or trailing whitespace" in message, message
    assert not EvalSuite.objects.exists()


def test_a_body_that_is_not_an_object_is_an_eval_error(api, home):
    response = api.post("/v1/eval/suites", data="[1, 2]", content_type="application/json")
    error(response, 400, "eval_invalid_request")
    error(api.post("/v1/eval/suites", data="{not json", content_type="application/json"), 400,
          "eval_invalid_request")


def test_every_scorer_spec_shape():
    assert check_scorer_spec({"type": "exact"}) == {"type": "exact"}
    assert check_scorer_spec({"type": "normalized_exact"}) == {"type": "normalized_exact"}
    assert check_scorer_spec({"type": "numeric_tolerance"}) == {"type": "numeric_tolerance", "tolerance": 1e-6}
    assert check_scorer_spec({"type": "numeric_tolerance", "tolerance": 0}) == \
        {"type": "numeric_tolerance", "tolerance": 0.0}
    assert check_scorer_spec({"type": "regex", "pattern": r"\b5\b"}) == {"type": "regex", "pattern": r"\b5\b"}
    assert check_scorer_spec({"type": "contains"}) == {"type": "contains"}
    assert check_scorer_spec({"type": "json_valid"}) == {"type": "json_valid"}
    schema = {"type": "object", "required": ["answer"]}
    assert check_scorer_spec({"type": "json_schema", "schema": schema}) == {"type": "json_schema", "schema": schema}
    assert check_scorer_spec({"type": "multiple_choice", "choices": ["A", "B", "C"]})["choices"] == ["A", "B", "C"]
    assert check_scorer_spec({"type": "program", "scorer": "math"}, scorer_exists=lambda n: n == "math") == \
        {"type": "program", "scorer": "math", "pass_threshold": 1.0}
    Scorer.objects.create(name="registered", filename="s.py", path="/x/s.py", sha256="sha256:0")
    assert check_scorer_spec({"type": "program", "scorer": "registered"})["scorer"] == "registered"
    for bad in ({"type": "json_schema", "schema": {"type": 5}}, {"type": "json_schema"},
                {"type": "multiple_choice", "choices": ["A"]}, {"type": "multiple_choice", "choices": ["A", "A"]},
                {"type": "regex"}, {"type": "numeric_tolerance", "tolerance": True}, "exact", None,
                {"type": "program", "scorer": "unknown"}):
        with pytest.raises(SuiteError):
            check_scorer_spec(bad)


# -- synthesis from a dataset --------------------------------------------------------------------

def _split_entries(client, name):
    return {e["row"]: e for e in ok(client.get(f"/v1/eval/datasets/{name}/split"))["rows"]}


def test_synthesize_grpo_groups_with_reference_targets_and_provenance(api, home):
    rows = [group(i, reference=str(2 * i), metadata={"group_id": f"g{i}", "topic": "sums"}) for i in range(30)]
    manifest = ok(upload(api, "math", jsonl(rows)))
    suite = ok(send(api, "post", "/v1/eval/datasets/math/synthesize",
                    {"suite_name": "math-holdout", "scorer": {"type": "exact"}}))
    entries = _split_entries(api, "math")
    holdout_rows = sorted(r for r, e in entries.items() if e["partition"] == "holdout")
    assert suite["examples"] == len(holdout_rows) == manifest["split_counts"]["holdout"] > 0
    assert suite["source"]["partition"] == "holdout" and suite["source"]["strategy"] == "reference"
    examples = ok(api.get("/v1/eval/suites/math-holdout"))["examples"]
    first, row = examples[0], holdout_rows[0]
    assert first["id"] == f"row-{row}"
    assert first["messages"] == rows[row - 1]["messages"] and first["target"] == str(2 * (row - 1))
    assert first["metadata"]["topic"] == "sums"
    assert first["metadata"]["kiln_dataset_provenance"] == {
        "dataset": "math", "partition": "holdout", "row": row, "exact_identity": entries[row]["exact_identity"],
        "normalized_identity": entries[row]["normalized_identity"], "group_id": f"g{row - 1}",
        "corpus_sha256": manifest["corpus_sha256"], "split_manifest_sha256": manifest["split_manifest_sha256"]}


def test_synthesize_best_completion_head_n_validation_split_and_force(api, home):
    rows = [{"messages": [{"role": "user", "content": f"q{i}"}],
             "completions": [{"text": "low", "reward": 0.1}, {"text": f"best {i}", "reward": 0.9},
                             {"text": "also best", "reward": 0.9}]} for i in range(40)]
    ok(upload(api, "best", jsonl(rows)))
    body = {"suite_name": "val", "source_split": "validation", "strategy": "best_completion", "head_n": 2,
            "scorer": {"type": "contains"}}
    suite = ok(send(api, "post", "/v1/eval/datasets/best/synthesize", body))
    assert suite["examples"] == 2 and suite["scorer"] == {"type": "contains"}
    examples = ok(api.get("/v1/eval/suites/val"))["examples"]
    entries = _split_entries(api, "best")
    validation_rows = sorted(r for r, e in entries.items() if e["partition"] == "validation")[:2]
    assert [e["id"] for e in examples] == [f"row-{r}" for r in validation_rows]
    assert [e["target"] for e in examples] == [f"best {r - 1}" for r in validation_rows]  # first of equal rewards
    error(send(api, "post", "/v1/eval/datasets/best/synthesize", body), 409, "eval_suite_exists")
    assert ok(send(api, "post", "/v1/eval/datasets/best/synthesize", {**body, "head_n": 3, "force": True}))["examples"] == 3


def test_best_completion_skips_groups_where_no_completion_stands_out(api, home):
    """An all-zero group (every completion wrong, say) has no best completion: taking its first text
    as the target would make a suite that rewards a wrong answer. Such groups make no example."""
    rows = [{"messages": [{"role": "user", "content": f"What is {i} + 1?"}],
             "completions": [{"text": f"Let me add {i} and 1.", "reward": 0.0},
                             {"text": str(i + 1) if i % 2 else "no idea", "reward": 1.0 if i % 2 else 0.0}]}
            for i in range(40)]
    ok(upload(api, "mixed", jsonl(rows)))
    body = {"suite_name": "mixed-train", "source_split": "train", "strategy": "best_completion",
            "scorer": {"type": "contains"}}
    ok(send(api, "post", "/v1/eval/datasets/mixed/synthesize", body))
    examples = ok(api.get("/v1/eval/suites/mixed-train"))["examples"]
    assert examples and all(int(e["id"].split("-")[1]) % 2 == 0 for e in examples)  # rows 2, 4, ... = i odd
    assert all(e["target"] == str(int(e["id"].split("-")[1])) for e in examples)
    flat = [dict(r, completions=[dict(c, reward=0.0) for c in r["completions"]]) for r in rows]
    ok(upload(api, "flat", jsonl(flat)))
    message = error(send(api, "post", "/v1/eval/datasets/flat/synthesize", {**body, "suite_name": "flat-train"}),
                    400, "eval_invalid_request")
    assert "every completion scored the same" in message


def test_synthesize_sft_chat_and_raw(api, home):
    sft = [{"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": f"u{i}"},
                         {"role": "assistant", "content": f"a{i}"}]} for i in range(3)]
    ok(upload(api, "chat", jsonl(sft), fmt="sft_chat"))
    ok(send(api, "post", "/v1/eval/datasets/chat/synthesize", {"suite_name": "chat-train", "source_split": "train"}))
    examples = ok(api.get("/v1/eval/suites/chat-train"))["examples"]
    row = int(examples[0]["id"].split("-")[1])
    assert examples[0]["messages"] == sft[row - 1]["messages"][:2] and examples[0]["target"] == f"a{row - 1}"
    raw = [{"prompt": "Capital of France?", "answer": "Paris"}, {"prompt": "Capital of Spain?", "answer": "Madrid"}]
    ok(upload(api, "facts", jsonl(raw), fmt="raw"))
    ok(send(api, "post", "/v1/eval/datasets/facts/synthesize",
            {"suite_name": "facts", "scorer": {"type": "normalized_exact"}}))
    (example,) = ok(api.get("/v1/eval/suites/facts"))["examples"]  # two components: one holdout row
    assert example["messages"][0]["role"] == "user" and example["target"] in ("Paris", "Madrid")


def test_synthesize_errors(api, home):
    ok(upload(api, "two", jsonl([group(1), group(2)])))  # two components: validation is empty
    path = "/v1/eval/datasets/two/synthesize"
    assert "empty" in error(send(api, "post", path, {"suite_name": "s", "source_split": "validation",
                                                     "strategy": "best_completion"}), 400, "eval_invalid_request")
    assert "reference" in error(send(api, "post", path, {"suite_name": "s"}), 400, "eval_invalid_request")
    assert error(send(api, "post", path, {"suite_name": "s", "strategy": "last_assistant"}), 400,
                 "eval_invalid_request").startswith("strategy:")
    assert error(send(api, "post", path, {"suite_name": "s", "source_split": "test"}), 400,
                 "eval_invalid_request").startswith("source_split:")
    assert error(send(api, "post", path, {"suite_name": "../s"}), 400, "eval_invalid_request").startswith("suite_name:")
    assert error(send(api, "post", path, {"suite_name": "s", "head_n": 0}), 400,
                 "eval_invalid_request").startswith("head_n:")
    assert error(send(api, "post", path, {"suite_name": "s", "strategy": "best_completion", "scorer": {"type": "x"}}),
                 400, "eval_invalid_request").startswith("scorer.type:")
    error(send(api, "post", "/v1/eval/datasets/nope/synthesize", {"suite_name": "s"}), 404, "dataset_not_found")
    assert not EvalSuite.objects.exists()


def test_synthesized_provenance_keeps_every_declared_id(api, home):
    rows = [{"prompt": "p1", "answer": "a", "group_id": "g1", "metadata": {"group_id": "g2", "session_id": "s"}},
            {"prompt": "p2", "answer": "b"}]
    ok(upload(api, "ids", jsonl(rows), fmt="raw"))
    entries = _split_entries(api, "ids")
    source = next(p for p in ("train", "holdout") if entries[1]["partition"] == p)
    ok(send(api, "post", "/v1/eval/datasets/ids/synthesize", {"suite_name": "ids", "source_split": source}))
    (example,) = ok(api.get("/v1/eval/suites/ids"))["examples"]
    provenance = example["metadata"]["kiln_dataset_provenance"]
    assert provenance["group_id"] == "g1" and provenance["group_ids"] == ["g1", "g2"]
    assert provenance["session_id"] == "s" and "session_ids" not in provenance
    assert example["metadata"]["session_id"] == "s"  # the row's own metadata is kept beside it
