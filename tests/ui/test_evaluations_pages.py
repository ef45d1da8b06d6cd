"""Evaluations pages (/ui/evaluations/…) and the GRPO form's post-eval section, through the test client.

Data is made through the real services (evaluations.dataset_services, suite_services) in a private
KILN_HOME; the pages' forms go through the same services, so a refused form stores nothing.
"""

from __future__ import annotations

import json
from dataclasses import replace
from html import unescape
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from core.jobs.models import Job
from evaluations import dataset_selectors, dataset_services, suite_services
from evaluations.models import EvalDataset, EvalSuite

pytestmark = pytest.mark.django_db

GROUP = {"messages": [{"role": "user", "content": "What is 2 + 3?"}],
         "completions": [{"text": "5", "reward": 1.0}, {"text": "6", "reward": 0.0}]}
SUITE = {"name": "arith", "description": "hand-made", "scorer": {"type": "exact"},
         "examples": [{"id": "q1", "messages": [{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": "What is 40 + 2?"}], "target": "42"},
                      {"id": "q2", "messages": [{"role": "user", "content": "What is 7 * 6?"}], "target": "42"}]}


@pytest.fixture
def home(settings, tmp_path):
    """A private KILN_HOME: datasets and suites land under it."""
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"


def _group(i: int, **extra) -> dict:
    return {"messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
            "completions": [{"text": str(2 * i), "reward": 1.0}, {"text": str(2 * i + 1), "reward": 0.0}],
            "reference": str(2 * i), **extra}


def _jsonl(rows) -> bytes:
    return ("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n").encode()


def _file(data: bytes, name="data.jsonl") -> SimpleUploadedFile:
    return SimpleUploadedFile(name, data, content_type="application/x-ndjson")


def _dataset(name="math", n=30, operator=None, **extra):
    return dataset_services.dataset_upload(name=name, fmt="grpo_groups", description="thirty sums",
                                           content=_jsonl([_group(i, **extra) for i in range(n)]), user=operator)


def _html(response) -> str:
    return response.content.decode()


def _field_error(html: str, element_id: str) -> str:
    start = html.index(f'id="{element_id}"')
    return unescape(html[start:html.index("</p>", start)])


def _folder_bytes(path: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


# ---- login, navigation, the hub ------------------------------------------------------------------

@pytest.mark.parametrize("url", ["/ui/evaluations/", "/ui/evaluations/datasets/", "/ui/evaluations/datasets/math/",
                                 "/ui/evaluations/suites/", "/ui/evaluations/suites/arith/"])
def test_every_evaluations_page_needs_login(client, url):
    response = client.get(url)
    assert response.status_code == 302 and response["Location"] == f"/ui/login/?next={url}"


@pytest.mark.parametrize("url", ["/ui/evaluations/datasets/", "/ui/evaluations/datasets/math/split/",
                                 "/ui/evaluations/datasets/math/synthesize/", "/ui/evaluations/datasets/math/delete/",
                                 "/ui/evaluations/suites/", "/ui/evaluations/suites/arith/delete/"])
def test_anonymous_posts_are_sent_to_login_and_change_nothing(client, home, operator, url):
    _dataset(operator=operator)
    suite_services.suite_store(body=SUITE)
    response = client.post(url, {"name": "x", "confirm": "on", "action": "apply", "suite_name": "s2"})
    assert response.status_code == 302 and response["Location"].startswith("/ui/login/")
    assert EvalDataset.objects.count() == 1 and EvalSuite.objects.count() == 1


def test_the_hub_shows_datasets_suites_and_the_jobs_table(operator_client, operator, home):
    empty = _html(operator_client.get("/ui/evaluations/"))
    assert 'id="hub-datasets-empty"' in empty and 'id="hub-suites-empty"' in empty
    assert "No evaluation jobs yet." in empty and 'ws-connect="/ws/ui/jobs/?category=evaluation"' in empty
    dataset = _dataset(operator=operator)
    suite_services.suite_store(body=SUITE)
    html = _html(operator_client.get("/ui/evaluations/"))
    for tab in ("Overview", "Datasets", "Suites", "Jobs"):
        assert f">{tab}</a>" in html
    row = html[html.index('id="hub-dataset-math"'):]
    row = row[:row.index("</tr>")]
    counts = dataset.split_counts
    assert f"{counts['train']} train" in row and f"{counts['holdout']} holdout" in row and ">30<" in row
    assert 'id="hub-suite-arith"' in html and 'href="/ui/evaluations/suites/arith/"' in html
    # The side navigation links the Evaluations pages and marks where we are.
    assert '<a href="/ui/evaluations/" aria-current="page">Evaluations</a>' in html
    datasets_page = _html(operator_client.get("/ui/evaluations/datasets/"))
    assert '<a href="/ui/evaluations/datasets/" aria-current="page">Datasets</a>' in datasets_page


# ---- datasets: upload ----------------------------------------------------------------------------

def test_upload_through_the_page_creates_the_dataset_and_the_list_shows_its_split(operator_client, operator, home):
    page = _html(operator_client.get("/ui/evaluations/datasets/"))
    assert 'id="datasets-empty"' in page and 'enctype="multipart/form-data"' in page
    for fmt in ("grpo_groups", "sft_chat", "raw"):
        assert f'<option value="{fmt}"' in page
    data = _jsonl([_group(i) for i in range(20)])
    response = operator_client.post("/ui/evaluations/datasets/", {
        "name": "sums", "format": "grpo_groups", "description": "twenty sums", "file": _file(data)})
    assert response.status_code == 302 and response["Location"] == "/ui/evaluations/datasets/sums/"
    assert "Uploaded dataset sums: 20 rows" in _html(operator_client.get(response["Location"]))
    dataset = EvalDataset.objects.get()
    assert (dataset.name, dataset.format, dataset.rows, dataset.created_by) == ("sums", "grpo_groups", 20, operator)
    assert (Path(dataset.path) / "data.jsonl").is_file()
    counts = dataset.split_counts
    assert sum(counts.values()) == 20 and counts["train"] > 0 and counts["holdout"] > 0
    listing = _html(operator_client.get("/ui/evaluations/datasets/"))
    row = listing[listing.index('id="dataset-row-sums"'):]
    row = row[:row.index("</tr>")]
    assert (f'data-train="{counts["train"]}" data-validation="{counts["validation"]}" '
            f'data-holdout="{counts["holdout"]}"') in row
    assert f"{counts['train']} train" in row and f"{counts['validation']} validation" in row
    assert dataset.corpus_sha256[:19] in row and dataset.corpus_sha256 not in row.split('title="')[0]
    assert "seed 0 · 80/10" in row


@pytest.mark.parametrize(("fields", "data", "field", "code", "text"), [
    ({"name": "bad name"}, "ok", "name", "eval_invalid_request", "is not a valid name"),
    ({"format": "csv"}, "ok", "format", "eval_invalid_request", "must be one of grpo_groups, sft_chat, raw"),
    ({}, "broken", "file", "dataset_invalid", "line 2"),
    ({}, "nan", "file", "dataset_invalid", "line 1"),
    ({}, None, "file", "eval_invalid_request", "choose the JSONL file"),
])
def test_a_bad_upload_shows_the_error_inline_and_stores_nothing(operator_client, home, fields, data, field, code,
                                                                 text):
    uploads = {"ok": _jsonl([GROUP]), "broken": _jsonl([GROUP, "{oops"]),
               "nan": _jsonl([json.dumps(GROUP).replace("0.0", "NaN")])}
    form = {"name": "sums", "format": "grpo_groups", "description": "", **fields}
    if data is not None:
        form["file"] = _file(uploads[data])
    response = operator_client.post("/ui/evaluations/datasets/", form)
    assert response.status_code == 400
    html = _html(response)
    assert "Nothing was stored." in html and f"<code>{code}</code>" in html
    error = _field_error(html, f"error-{field}")
    assert text in error, error
    assert html.count('class="field-error"') == 1
    assert f'value="{form["name"]}"' in html  # what was typed stays
    assert EvalDataset.objects.count() == 0
    datasets = home / "adapters" / ".eval" / "datasets"
    assert not datasets.exists() or not any(datasets.iterdir())


def test_a_taken_name_is_a_conflict_and_the_first_dataset_is_untouched(operator_client, operator, home):
    first = _dataset(name="sums", operator=operator, n=5)
    before = _folder_bytes(Path(first.path))
    response = operator_client.post("/ui/evaluations/datasets/", {
        "name": "sums", "format": "raw", "description": "", "file": _file(_jsonl([{"prompt": "hi", "answer": "yo"}]))})
    assert response.status_code == 409
    assert "<code>dataset_exists</code>" in _field_error(_html(response), "error-name")
    assert EvalDataset.objects.get().format == "grpo_groups" and _folder_bytes(Path(first.path)) == before


def test_a_viewer_sees_the_pages_but_cannot_write(viewer_client, operator, home):
    _dataset(operator=operator)
    page = _html(viewer_client.get("/ui/evaluations/datasets/"))
    assert 'id="needs-permission"' in page and "<fieldset disabled" in page
    response = viewer_client.post("/ui/evaluations/datasets/", {
        "name": "other", "format": "grpo_groups", "file": _file(_jsonl([GROUP]))})
    assert response.status_code == 403 and "You lack the submit_job permission" in _html(response)
    assert viewer_client.post("/ui/evaluations/datasets/math/synthesize/",
                              {"suite_name": "s", "scorer_type": "exact"}).status_code == 403
    assert viewer_client.post("/ui/evaluations/datasets/math/delete/", {"confirm": "on"}).status_code == 403
    assert viewer_client.post("/ui/evaluations/datasets/math/split/", {"seed": "9", "action": "apply"}).status_code == 403
    assert viewer_client.post("/ui/evaluations/suites/", {"suite_json": json.dumps(SUITE)}).status_code == 403
    assert list(EvalDataset.objects.values_list("name", flat=True)) == ["math"] and EvalSuite.objects.count() == 0
    # A preview writes nothing, so a viewer may look.
    assert viewer_client.post("/ui/evaluations/datasets/math/split/", {"seed": "9", "action": "preview"}).status_code == 200


def test_forms_need_csrf(operator, home):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    response = strict.post("/ui/evaluations/datasets/", {"name": "sums", "format": "grpo_groups",
                                                         "file": _file(_jsonl([GROUP]))})
    assert response.status_code == 403 and EvalDataset.objects.count() == 0
    assert strict.post("/ui/evaluations/suites/", {"suite_json": json.dumps(SUITE)}).status_code == 403
    assert EvalSuite.objects.count() == 0
    assert 'name="csrfmiddlewaretoken"' in _html(strict.get("/ui/evaluations/datasets/"))


# ---- one dataset: manifest, rows, split ----------------------------------------------------------

def test_the_dataset_page_shows_manifest_split_and_paged_rows_with_a_partition_filter(operator_client, operator,
                                                                                      home):
    dataset = _dataset(n=60, operator=operator)
    html = _html(operator_client.get("/ui/evaluations/datasets/math/"))
    counts = dataset.split_counts
    assert (f'id="split-counts" data-train="{counts["train"]}" data-validation="{counts["validation"]}" '
            f'data-holdout="{counts["holdout"]}"') in html
    assert "seed 0, train 80%, validation 10%" in html
    assert dataset.split_manifest_sha256[:23] in html and "manifest.json" in html
    assert "Rows 1–50 of 60." in html and 'rel="next"' in html and html.count('id="dataset-line-') == 50
    for name in ("seed", "train_percent", "validation_percent"):
        assert f'name="{name}"' in html
    for name in ("suite_name", "source_split", "strategy", "scorer_type", "scorer_options", "head_n", "force"):
        assert f'name="{name}"' in html, name
    assert '<option value="holdout" selected>' in html
    assert '<option value="reference" selected>' in html and '<option value="best_completion">' in html
    second = _html(operator_client.get("/ui/evaluations/datasets/math/?offset=50"))
    assert "Rows 51–60 of 60." in second and second.count('id="dataset-line-') == 10
    holdout = _html(operator_client.get("/ui/evaluations/datasets/math/?partition=holdout"))
    assert holdout.count('class="partition-holdout"') == counts["holdout"]
    assert 'class="partition-train"' not in holdout and f"of {counts['holdout']} in holdout" in holdout
    bad = _html(operator_client.get("/ui/evaluations/datasets/math/?partition=test"))
    assert 'id="rows-error"' in bad and bad.count('id="dataset-line-') == 50
    assert operator_client.get("/ui/evaluations/datasets/nope/").status_code == 404


def test_preview_shows_counts_and_writes_nothing_then_apply_resplits(operator_client, operator, home):
    dataset = _dataset(n=60, operator=operator)
    folder = Path(dataset.path)
    before, row_before = _folder_bytes(folder), EvalDataset.objects.values().get()
    response = operator_client.post("/ui/evaluations/datasets/math/split/", {
        "seed": "12345", "train_percent": "50", "validation_percent": "25", "action": "preview"})
    assert response.status_code == 200
    html = _html(response)
    assert 'id="split-preview-result"' in html and "nothing was written" in html
    preview = dataset_services.dataset_split_preview(
        dataset=dataset, config={"seed": "12345", "train_percent": 50, "validation_percent": 25})
    c = preview["split_counts"]
    assert f'id="preview-counts" data-train="{c["train"]}" data-validation="{c["validation"]}" ' \
           f'data-holdout="{c["holdout"]}"' in html
    assert 'value="12345"' in html  # the form keeps the config being previewed
    assert _folder_bytes(folder) == before and EvalDataset.objects.values().get() == row_before

    applied = operator_client.post("/ui/evaluations/datasets/math/split/", {
        "seed": "12345", "train_percent": "50", "validation_percent": "25", "action": "apply"})
    assert applied.status_code == 302 and applied["Location"] == "/ui/evaluations/datasets/math/"
    dataset.refresh_from_db()
    assert dataset.split_config == {"seed": "12345", "train_percent": 50, "validation_percent": 25}
    assert dataset.split_counts == c and dataset.split_manifest_sha256 != row_before["split_manifest_sha256"]
    assert "Re-split math with seed 12345" in _html(operator_client.get(applied["Location"]))


@pytest.mark.parametrize(("fields", "field", "text"), [
    ({"seed": "-1"}, "seed", "decimal u64"),
    ({"train_percent": "0"}, "train_percent", "greater than 0"),
    ({"train_percent": "90", "validation_percent": "10"}, "validation_percent", "must be below 100"),
    ({"train_percent": "lots"}, "train_percent", "must be a number"),
])
@pytest.mark.parametrize("action", ["preview", "apply"])
def test_a_bad_split_config_is_shown_next_to_its_field_and_changes_nothing(operator_client, operator, home,
                                                                           fields, field, text, action):
    dataset = _dataset(n=20, operator=operator)
    before = _folder_bytes(Path(dataset.path))
    form = {"seed": "0", "train_percent": "80", "validation_percent": "10", "action": action, **fields}
    response = operator_client.post("/ui/evaluations/datasets/math/split/", form)
    assert response.status_code == 400
    html = _html(response)
    error = _field_error(html, f"split-error-{field}")
    assert "<code>eval_invalid_request</code>" in error and text in error, error
    assert "The split was not changed." in html and 'id="split-preview-result"' not in html
    assert _folder_bytes(Path(dataset.path)) == before
    dataset.refresh_from_db()
    assert dataset.split_config == {"seed": "0", "train_percent": 80, "validation_percent": 10}


# ---- synthesis -----------------------------------------------------------------------------------

def _synth(**fields) -> dict:
    return {"suite_name": "math-holdout", "source_split": "holdout", "strategy": "reference", "scorer_type": "exact",
            "scorer_options": "", "head_n": "", **fields}


def test_synthesis_creates_a_suite_that_the_suites_page_lists(operator_client, operator, home):
    dataset = _dataset(n=100, operator=operator)
    assert dataset.split_counts["holdout"] > 3
    response = operator_client.post("/ui/evaluations/datasets/math/synthesize/", _synth(head_n="3"))
    assert response.status_code == 302 and response["Location"] == "/ui/evaluations/suites/math-holdout/"
    detail = _html(operator_client.get(response["Location"]))
    assert "Created suite math-holdout with 3 examples from the holdout partition of math." in detail
    suite = EvalSuite.objects.get()
    assert suite.examples == 3 and suite.created_by == operator
    assert suite.source["dataset"] == "math" and suite.source["partition"] == "holdout"
    assert suite.scorer == {"type": "exact"}
    listing = _html(operator_client.get("/ui/evaluations/suites/"))
    row = listing[listing.index('id="suite-row-math-holdout"'):]
    row = row[:row.index("</tr>")]
    assert ">3<" in row and suite.suite_hash[:19] in row and 'href="/ui/evaluations/datasets/math/"' in row
    assert "holdout, reference" in row
    assert detail.count('id="example-') == 3 and "row-" in detail
    first = dataset_selectors.dataset_partition_entries(dataset=dataset, partition="holdout").entries[0]["row"]
    assert f"math</span> · holdout · row {first}" in detail
    assert f"What is {first - 1} + {first - 1}?" in detail  # the last user message of that row
    # The dataset page links the suites made from it.
    assert 'href="/ui/evaluations/suites/math-holdout/"' in _html(operator_client.get("/ui/evaluations/datasets/math/"))


def test_synthesis_with_scorer_options_and_force(operator_client, operator, home):
    _dataset(n=40, operator=operator)
    form = _synth(scorer_type="numeric_tolerance", scorer_options='{"tolerance": 0.5}')
    assert operator_client.post("/ui/evaluations/datasets/math/synthesize/", form).status_code == 302
    assert EvalSuite.objects.get().scorer == {"type": "numeric_tolerance", "tolerance": 0.5}
    again = operator_client.post("/ui/evaluations/datasets/math/synthesize/", _synth(source_split="validation"))
    assert again.status_code == 409
    assert "<code>eval_suite_exists</code>" in _field_error(_html(again), "synth-error-suite_name")
    assert EvalSuite.objects.get().source["partition"] == "holdout"
    forced = operator_client.post("/ui/evaluations/datasets/math/synthesize/",
                                  _synth(source_split="validation", force="on"))
    assert forced.status_code == 302
    suite = EvalSuite.objects.get()
    assert suite.source["partition"] == "validation" and suite.scorer == {"type": "exact"}


@pytest.mark.parametrize(("fields", "field", "text"), [
    ({"suite_name": "no good"}, "suite_name", "is not a valid name"),
    ({"scorer_options": "{not json"}, "scorer_options", "not valid JSON"),
    ({"scorer_options": "[1]"}, "scorer_options", "must be a JSON object"),
    ({"scorer_type": "regex"}, "scorer_options", "scorer.pattern"),
    ({"scorer_options": '{"tolerance": 1}'}, "scorer_options", "is not an option of the exact scorer"),
    ({"scorer_type": "telepathy"}, "scorer_type", "must be one of"),
    ({"head_n": "0"}, "head_n", "must be a positive integer"),
    ({"strategy": "last_assistant"}, "strategy", "for a grpo_groups dataset"),
    ({"source_split": "test"}, "source_split", "must be one of train, validation, holdout"),
])
def test_a_bad_synthesis_is_shown_next_to_its_field_and_creates_nothing(operator_client, operator, home, fields,
                                                                         field, text):
    _dataset(n=40, operator=operator)
    response = operator_client.post("/ui/evaluations/datasets/math/synthesize/", _synth(**fields))
    assert response.status_code == 400
    html = _html(response)
    assert "No suite was created." in html
    error = _field_error(html, f"synth-error-{field}")
    assert "<code>eval_invalid_request</code>" in error and text in error, error
    assert EvalSuite.objects.count() == 0


def test_deleting_a_dataset_needs_the_confirm_box(operator_client, operator, home):
    dataset = _dataset(operator=operator)
    page = _html(operator_client.get("/ui/evaluations/datasets/math/"))
    assert 'id="dataset-delete-form"' in page and 'name="confirm"' in page
    refused = operator_client.post("/ui/evaluations/datasets/math/delete/", {})
    assert refused.status_code == 400 and 'id="delete-error"' in _html(refused)
    assert EvalDataset.objects.count() == 1 and Path(dataset.path).is_dir()
    # a GET of the form's address (a reload after an error) goes back to the dataset's page; nothing is deleted
    back = operator_client.get("/ui/evaluations/datasets/math/delete/")
    assert (back.status_code, back["Location"]) == (302, "/ui/evaluations/datasets/math/")
    assert EvalDataset.objects.count() == 1
    deleted = operator_client.post("/ui/evaluations/datasets/math/delete/", {"confirm": "on"})
    assert deleted.status_code == 302 and deleted["Location"] == "/ui/evaluations/datasets/"
    assert EvalDataset.objects.count() == 0 and not Path(dataset.path).exists()
    assert "Deleted dataset math" in _html(operator_client.get("/ui/evaluations/datasets/"))


# ---- suites --------------------------------------------------------------------------------------

def test_suite_json_create_refuses_a_taken_name_unless_forced(operator_client, operator, home):
    page = _html(operator_client.get("/ui/evaluations/suites/"))
    assert 'id="suites-empty"' in page and 'name="suite_json"' in page and 'name="suite_file"' in page
    response = operator_client.post("/ui/evaluations/suites/", {"suite_json": json.dumps(SUITE)})
    assert response.status_code == 302 and response["Location"] == "/ui/evaluations/suites/arith/"
    suite = EvalSuite.objects.get()
    assert (suite.examples, suite.created_by, suite.source) == (2, operator, {"kind": "upload"})
    changed = {**SUITE, "examples": SUITE["examples"][:1]}
    taken = operator_client.post("/ui/evaluations/suites/", {"suite_json": json.dumps(changed)})
    assert taken.status_code == 409
    html = _html(taken)
    assert "<code>eval_suite_exists</code>" in _field_error(html, "error-suite_json")
    assert "No suite was registered." in html and "&quot;name&quot;: &quot;arith&quot;" in html  # kept
    assert EvalSuite.objects.get().examples == 2
    forced = operator_client.post("/ui/evaluations/suites/", {"suite_json": json.dumps(changed), "force": "on"})
    assert forced.status_code == 302
    replaced = EvalSuite.objects.get()
    assert replaced.examples == 1 and replaced.suite_hash != suite.suite_hash


def test_a_suite_file_upload_registers_it(operator_client, home):
    upload = SimpleUploadedFile("arith.json", json.dumps(SUITE).encode(), content_type="application/json")
    response = operator_client.post("/ui/evaluations/suites/", {"suite_json": "", "suite_file": upload})
    assert response.status_code == 302 and EvalSuite.objects.get().name == "arith"


@pytest.mark.parametrize(("text", "file", "message"), [
    ("", False, "paste the suite JSON or choose a file"),
    ("{nope", False, "not valid JSON"),
    (json.dumps(SUITE), True, "not both"),
    (json.dumps({**SUITE, "examples": []}), False, "examples: must be a non-empty list"),
    (json.dumps({**SUITE, "scorer": {"type": "regex"}}), False, "scorer.pattern"),
    (json.dumps({**SUITE, "examples": [SUITE["examples"][0]] * 2}), False, "ids must be unique"),
])
def test_a_bad_suite_is_shown_inline_and_stores_nothing(operator_client, home, text, file, message):
    form = {"suite_json": text}
    if file:
        form["suite_file"] = SimpleUploadedFile("s.json", json.dumps(SUITE).encode())
    response = operator_client.post("/ui/evaluations/suites/", form)
    assert response.status_code == 400
    error = _field_error(_html(response), "error-suite_json")
    assert "<code>eval_invalid_request</code>" in error and message in error, error
    assert EvalSuite.objects.count() == 0
    suites = home / "adapters" / ".eval" / "suites"
    assert not suites.exists() or not any(p for p in suites.iterdir() if p.suffix == ".json")


def test_the_suite_page_shows_scorer_hash_and_examples_and_deletes_with_confirm(operator_client, home):
    suite = suite_services.suite_store(body={**SUITE, "scorer": {"type": "numeric_tolerance", "tolerance": 0.5}})
    html = _html(operator_client.get("/ui/evaluations/suites/arith/"))
    assert "numeric_tolerance · tolerance=0.5" in html and suite.suite_hash in html
    first = html[html.index('id="example-0"'):]
    first = first[:first.index("</tr>")]
    assert ">q1<" in first and "What is 40 + 2?" in first and "Be brief." not in first and "(2 messages)" in first
    assert ">42<" in first
    assert 'id="example-1"' in html and "What is 7 * 6?" in html
    assert operator_client.get("/ui/evaluations/suites/nope/").status_code == 404
    refused = operator_client.post("/ui/evaluations/suites/arith/delete/", {})
    assert refused.status_code == 400 and EvalSuite.objects.count() == 1
    deleted = operator_client.post("/ui/evaluations/suites/arith/delete/", {"confirm": "on"})
    assert deleted.status_code == 302 and deleted["Location"] == "/ui/evaluations/suites/"
    assert EvalSuite.objects.count() == 0 and not Path(suite.path).exists()


# ---- the GRPO form's "Prove it after training" section -------------------------------------------

def _grpo_form(**fields) -> dict:
    return {"output_name": "math-r001", "behavior_policy": "no_importance_correction", "base_adapter": "",
            "lora_rank": "", "learning_rate": "", "kl_coeff": "", "checkpoint_interval": "", "seed": "",
            "advanced_config": "", "dataset_path": "", "auto_load": "on",
            "jsonl_file": SimpleUploadedFile("g.jsonl", (json.dumps(GROUP) + "\n").encode()), **fields}


def test_the_grpo_form_lists_installed_suites_in_its_post_eval_section(operator_client, home):
    html = _html(operator_client.get("/ui/training/grpo/"))
    assert 'id="field-post-eval"' in html and "Prove it after training" in html
    assert "No suite installed yet" in html
    for name in ("post_eval_suite", "post_eval_data_scope", "post_eval_min_accuracy", "post_eval_include_baseline"):
        assert f'name="{name}"' in html, name
    assert '<option value="held-out" selected>' in html and '<option value="train-set-eval">' in html
    suite_services.suite_store(body=SUITE)
    html = _html(operator_client.get("/ui/training/grpo/"))
    assert '<option value="arith">arith (2 examples)</option>' in html


def test_the_grpo_form_with_post_eval_queues_a_job_whose_payload_carries_it(operator_client, operator, home):
    suite_services.suite_store(body=SUITE)
    response = operator_client.post("/ui/training/grpo/", _grpo_form(
        post_eval_suite="arith", post_eval_data_scope="held-out", post_eval_min_accuracy="0.6",
        post_eval_include_baseline="on"))
    assert response.status_code == 302, _html(response)
    job = Job.objects.get()
    assert job.payload["post_eval"] == {"suite": "arith", "data_scope": "held-out", "generation": None,
                                        "min_accuracy": 0.6, "include_baseline": True}
    diagnostic = operator_client.post("/ui/training/grpo/", _grpo_form(
        output_name="math-r002", post_eval_suite="arith", post_eval_data_scope="train-set-eval"))
    assert diagnostic.status_code == 302
    assert Job.objects.get(uuid=diagnostic["Location"].split("/")[-2]).payload["post_eval"] == {
        "suite": "arith", "data_scope": "train-set-eval", "generation": None, "min_accuracy": None,
        "include_baseline": False}
    plain = operator_client.post("/ui/training/grpo/", _grpo_form(output_name="math-r003", post_eval_suite="",
                                                                  post_eval_data_scope="held-out"))
    assert plain.status_code == 302
    assert Job.objects.get(uuid=plain["Location"].split("/")[-2]).payload["post_eval"] is None


@pytest.mark.parametrize(("fields", "field", "text"), [
    ({"post_eval_suite": "arith", "post_eval_data_scope": "train-set-eval", "post_eval_min_accuracy": "0.6"},
     "post_eval_min_accuracy", "post_eval.min_accuracy: is not allowed with data_scope train-set-eval"),
    ({"post_eval_suite": "arith", "post_eval_min_accuracy": "1.5"}, "post_eval_min_accuracy", "within [0, 1]"),
    ({"post_eval_suite": "arith", "post_eval_min_accuracy": "most"}, "post_eval_min_accuracy", "finite number"),
    ({"post_eval_min_accuracy": "0.6"}, "post_eval_suite", "post_eval.suite: is required"),
    ({"post_eval_suite": "arith", "post_eval_data_scope": "everything"}, "post_eval_data_scope", "must be one of"),
])
def test_a_bad_post_eval_is_refused_inline_and_queues_nothing(operator_client, home, fields, field, text):
    suite_services.suite_store(body=SUITE)
    response = operator_client.post("/ui/training/grpo/", _grpo_form(**fields))
    assert response.status_code == 400
    html = _html(response)
    assert "Nothing was queued." in html
    error = _field_error(html, f"error-{field}")
    assert "<code>training_invalid_request</code>" in error and text in error, error
    assert html.count('class="field-error"') == 1
    assert Job.objects.count() == 0
    if field == "post_eval_min_accuracy":  # kept, and left enabled so it can be corrected
        box = html[html.index('id="id_post_eval_min_accuracy"'):]
        box = box[:box.index(">")]
        assert f'value="{fields["post_eval_min_accuracy"]}"' in box and "disabled" not in box


def test_another_users_dataset_cannot_be_resplit_or_deleted_from_its_page(operator_client, home):
    """Apply (re-split) was enabled on another user's dataset and refused only after the post."""
    import re

    from django.contrib.auth import get_user_model

    from core.accounts.services import user_create

    User = get_user_model()  # noqa: N806

    _dataset(operator=user_create(username="owner", password="long-enough-pw"))
    html = _html(operator_client.get("/ui/evaluations/datasets/math/"))
    assert re.search(r'id="split-apply"[^>]* disabled', html) and 'id="split-refusal"' in html
    assert 'id="delete-refused"' in html
    _dataset(name="mine", operator=User.objects.get(username="operator"))
    html = _html(operator_client.get("/ui/evaluations/datasets/mine/"))
    assert not re.search(r'id="split-apply"[^>]* disabled', html) and 'id="split-refusal"' not in html
