"""/v1/eval/datasets: upload, list, show, rows, split (get, put, preview), delete; errors and atomicity."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from django.db import connection
from django.test import Client

from core.canonical import sha256_digest
from evaluations.datasets.split import exact_identity
from evaluations.models import EvalDataset
from tests.evaluations import dataset_support
from tests.evaluations.dataset_support import error, group, jsonl, ok, send, upload

pytestmark = pytest.mark.django_db
api, home = dataset_support.api, dataset_support.home  # the shared fixtures

FILES = {"data.jsonl", "manifest.json", "identity.json", "split.json", "train.jsonl", "validation.jsonl",
         "holdout.jsonl"}


def _folder(root: Path, name: str) -> Path:
    return root / "adapters" / ".eval" / "datasets" / name


def _datasets_dir_entries(root: Path) -> list[str]:
    folder = root / "adapters" / ".eval" / "datasets"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_upload_publishes_every_file_and_answers_the_manifest(api, home):
    rows = [group(i, group_id=f"g{i // 2}") for i in range(20)]
    manifest = ok(upload(api, "math", jsonl(rows, blank_after=3), description="sums"))
    assert manifest["name"] == "math" and manifest["format"] == "grpo_groups" and manifest["description"] == "sums"
    assert manifest["rows"] == 20 and manifest["num_groups"] == 10 and manifest["num_sessions"] == 0
    assert manifest["split_config"] == {"seed": "0", "train_percent": 80, "validation_percent": 10}
    assert sum(manifest["split_counts"].values()) == 20
    assert all(manifest["split_counts"][p] >= 2 for p in ("train", "validation", "holdout"))  # whole groups of 2
    folder = _folder(home, "math")
    assert {p.name for p in folder.iterdir()} == FILES
    assert manifest["split_manifest_sha256"] == sha256_digest((folder / "split.json").read_bytes())
    ids = [exact_identity(r) for r in rows]
    assert manifest["corpus_sha256"] == sha256_digest(json.dumps(ids, separators=(",", ":")).encode())
    data_rows = [json.loads(line) for line in (folder / "data.jsonl").read_text().splitlines()]
    assert data_rows == rows  # blank lines dropped: row N is line N
    split = ok(api.get("/v1/eval/datasets/math/split"))
    for partition in ("train", "validation", "holdout"):
        stored = [json.loads(line) for line in (folder / f"{partition}.jsonl").read_text().splitlines()]
        assert stored == [rows[e["row"] - 1] for e in split["rows"] if e["partition"] == partition]
    row = EvalDataset.objects.get(name="math")
    assert row.split_counts == manifest["split_counts"] and row.corpus_sha256 == manifest["corpus_sha256"]
    assert ok(api.get("/v1/eval/datasets/math")) == manifest
    assert [m["name"] for m in ok(api.get("/v1/eval/datasets"))] == ["math"]


def test_split_manifest_names_every_row_with_its_identities_and_ids(api, home):
    rows = [{"q": "A", "metadata": {"group_id": "g"}}, {"q": "b", "session_id": "s", "extra": {"group_id": "g"}},
            {"q": "c"}, {"q": " C "}]
    ok(upload(api, "raw1", jsonl(rows), fmt="raw"))
    split = ok(api.get("/v1/eval/datasets/raw1/split"))
    assert split["config"] == {"seed": "0", "train_percent": 80, "validation_percent": 10}
    assert [e["row"] for e in split["rows"]] == [1, 2, 3, 4]
    assert split["rows"][0]["group_id"] == "g" and split["rows"][1]["session_id"] == "s"
    assert split["rows"][0]["partition"] == split["rows"][1]["partition"]  # joined by group_id
    assert split["rows"][2]["partition"] == split["rows"][3]["partition"]  # joined by normalized identity
    assert split["rows"][2]["normalized_identity"] == split["rows"][3]["normalized_identity"]
    assert split["rows"][2]["exact_identity"] != split["rows"][3]["exact_identity"]
    assert split["num_components"] == 2 and split["counts"]["validation"] == 0  # small-N: train + holdout
    assert {split["rows"][0]["partition"], split["rows"][2]["partition"]} == {"train", "holdout"}


def test_rows_are_paged_and_filtered_by_partition(api, home):
    rows = [{"q": f"question {i}"} for i in range(30)]
    ok(upload(api, "paged", jsonl(rows), fmt="raw"))
    page = ok(api.get("/v1/eval/datasets/paged/rows?offset=5&limit=10"))
    assert page["total"] == 30 and [r["row"] for r in page["rows"]] == list(range(6, 16))
    assert page["rows"][0]["data"] == rows[5]
    train = ok(api.get("/v1/eval/datasets/paged/rows?partition=train&limit=500"))
    split = ok(api.get("/v1/eval/datasets/paged/split"))
    assert [r["row"] for r in train["rows"]] == [e["row"] for e in split["rows"] if e["partition"] == "train"]
    error(api.get("/v1/eval/datasets/paged/rows?partition=test"), 400, "eval_invalid_request")
    error(api.get("/v1/eval/datasets/paged/rows?offset=-1"), 400, "eval_invalid_request")
    error(api.get("/v1/eval/datasets/nope/rows"), 404, "dataset_not_found")


def test_put_split_republishes_and_preview_writes_nothing(api, home):
    rows = [{"q": f"question {i}"} for i in range(100)]
    first = ok(upload(api, "resplit", jsonl(rows), fmt="raw"))
    folder = _folder(home, "resplit")
    before = {name: (folder / name).read_bytes() for name in FILES}
    preview = ok(send(api, "post", "/v1/eval/datasets/resplit/preview",
                      {"seed": "99", "train_percent": 50, "validation_percent": 25}))
    assert preview["split_config"] == {"seed": "99", "train_percent": 50, "validation_percent": 25}
    assert sum(preview["split_counts"].values()) == 100
    assert {name: (folder / name).read_bytes() for name in FILES} == before
    updated = ok(send(api, "put", "/v1/eval/datasets/resplit/split",
                      {"seed": "99", "train_percent": 50, "validation_percent": 25}))
    assert updated["split_counts"] == preview["split_counts"]
    assert updated["split_config"] == preview["split_config"]
    assert updated["corpus_sha256"] == first["corpus_sha256"] and updated["created_at"] == first["created_at"]
    assert updated["split_manifest_sha256"] != first["split_manifest_sha256"]
    assert updated["split_manifest_sha256"] == sha256_digest((folder / "split.json").read_bytes())
    assert (folder / "data.jsonl").read_bytes() == before["data.jsonl"]
    assert (folder / "train.jsonl").read_bytes() != before["train.jsonl"]
    assert EvalDataset.objects.get(name="resplit").split_manifest_sha256 == updated["split_manifest_sha256"]
    split = ok(api.get("/v1/eval/datasets/resplit/split"))
    moved = [e for e, old in zip(split["rows"], json.loads(before["split.json"])["rows"], strict=True)
             if e["partition"] != old["partition"]]
    assert moved  # a different seed (and percentages) moves rows
    again = ok(send(api, "put", "/v1/eval/datasets/resplit/split", {"seed": "0"}))
    assert again["split_manifest_sha256"] == first["split_manifest_sha256"]  # deterministic: back to the first
    assert (folder / "split.json").read_bytes() == before["split.json"]
    assert sorted(p.name for p in folder.parent.iterdir()) == ["resplit"]  # no staging left behind


@pytest.mark.parametrize("body, field", [
    ({"train_percent": 0}, "train_percent"),
    ({"train_percent": 90, "validation_percent": 10}, "validation_percent"),
    ({"validation_percent": -1}, "validation_percent"),
    ({"seed": "-3"}, "seed"),
    ({"seed": "x"}, "seed"),
])
def test_bad_split_configs_are_refused_and_change_nothing(api, home, body, field):
    ok(upload(api, "fixed", jsonl([{"q": str(i)} for i in range(10)]), fmt="raw"))
    before = (_folder(home, "fixed") / "split.json").read_bytes()
    for route, method in (("split", "put"), ("preview", "post")):
        message = error(send(api, method, f"/v1/eval/datasets/fixed/{route}", body), 400, "eval_invalid_request")
        assert message.startswith(f"{field}:")
    assert (_folder(home, "fixed") / "split.json").read_bytes() == before


@pytest.mark.parametrize("data, fmt, line", [
    (b'{"messages": [{"role": "user", "content": "hi"}], "completions": [{"text": "a", "reward": 1}]}\n\n'
     b'{"messages": [{"role": "user", "content": "hi"}], "completions": [{"text": "a"}]}\n', "grpo_groups", 3),
    (b'{"a": 1}\n{"a": \n', "raw", 2),
    (b'{"messages": [{"role": "assistant", "content": "x"}]}\n{"messages": [{"role": "user", "content": "y"}]}\n',
     "sft_chat", 2),
])
def test_a_bad_file_names_its_line_and_leaves_nothing(api, home, data, fmt, line):
    message = error(upload(api, "broken", data, fmt=fmt), 400, "dataset_invalid")
    assert message.startswith(f"file line {line}:")
    assert not EvalDataset.objects.exists() and _datasets_dir_entries(home) == []


def test_request_errors(api, home):
    assert "name" in error(upload(api, "../evil", b'{"a": 1}\n', fmt="raw"), 400, "eval_invalid_request")
    assert "name" in error(upload(api, "x" * 65, b'{"a": 1}\n', fmt="raw"), 400, "eval_invalid_request")
    assert "format" in error(upload(api, "ok", b'{"a": 1}\n', fmt="csv"), 400, "eval_invalid_request")
    assert error(upload(api, "", b'{"a": 1}\n', fmt="raw"), 400, "eval_invalid_request") == \
        "name: a dataset name is required"
    missing = api.post("/v1/eval/datasets/upload", data={"name": "ok", "format": "raw"})
    assert "file" in error(missing, 400, "eval_invalid_request")
    assert "no rows" in error(upload(api, "ok", b"\n\n", fmt="raw"), 400, "dataset_invalid")
    for path in ("/v1/eval/datasets/nope", "/v1/eval/datasets/nope/split"):
        error(api.get(path), 404, "dataset_not_found")
    error(api.delete("/v1/eval/datasets/nope"), 404, "dataset_not_found")
    error(send(api, "put", "/v1/eval/datasets/nope/split", {}), 404, "dataset_not_found")
    assert not EvalDataset.objects.exists() and _datasets_dir_entries(home) == []
    assert Client().get("/v1/eval/datasets").status_code == 401


def test_an_oversized_upload_is_refused(api, home, settings):
    from dataclasses import replace

    settings.KILN = replace(settings.KILN, max_request_bytes=1024)
    error(upload(api, "big", jsonl([{"q": "x" * 100} for _ in range(20)]), fmt="raw"), 413, "request_too_large")
    assert not EvalDataset.objects.exists()


def test_a_second_upload_of_a_name_is_a_conflict_and_keeps_the_first(api, home):
    first = ok(upload(api, "dup", jsonl([{"q": "a"}]), fmt="raw"))
    error(upload(api, "dup", jsonl([{"q": "b"}]), fmt="raw"), 409, "dataset_exists")
    assert ok(api.get("/v1/eval/datasets/dup")) == first


def test_a_folder_published_by_a_racing_upload_is_a_conflict(api, home, monkeypatch):
    """The race after the existence check: the other upload's folder appears first; ours answers 409,
    leaves its folder intact and writes no row."""
    from evaluations import dataset_services

    real_stage = dataset_services._stage

    def racing(final, files, *, replace):
        final.mkdir(parents=True)
        (final / "data.jsonl").write_bytes(b"theirs\n")
        return real_stage(final, files, replace=replace)

    monkeypatch.setattr(dataset_services, "_stage", racing)
    error(upload(api, "race", jsonl([{"q": "a"}]), fmt="raw"), 409, "dataset_exists")
    assert (_folder(home, "race") / "data.jsonl").read_bytes() == b"theirs\n"
    assert _datasets_dir_entries(home) == ["race"] and not EvalDataset.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_concurrent_uploads_of_one_name_give_one_dataset_and_one_conflict(home):
    """Two uploads of one name at once (the service, from two threads: the in-memory test database
    cannot take two writers, so the HTTP layer's token bookkeeping stays out): one wins, one 409."""
    from core.errors import KilnError
    from evaluations.dataset_services import dataset_upload

    barrier = threading.Barrier(2)
    results = []

    def worker(i):
        try:
            barrier.wait(timeout=10)
            dataset_upload(name="same", fmt="raw", content=jsonl([{"q": f"writer {i}"}]))
            results.append(200)
        except KilnError as exc:
            results.append((exc.status, exc.code))
        finally:
            connection.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(results, key=str) == [(409, "dataset_exists"), 200]
    assert EvalDataset.objects.filter(name="same").count() == 1
    assert _datasets_dir_entries(home) == ["same"]
    row = json.loads((_folder(home, "same") / "data.jsonl").read_text())
    assert EvalDataset.objects.get(name="same").corpus_sha256 == \
        sha256_digest(json.dumps([exact_identity(row)], separators=(",", ":")).encode())


def test_delete_removes_the_folder_and_the_row(api, home):
    ok(upload(api, "gone", jsonl([{"q": "a"}, {"q": "b"}]), fmt="raw"))
    assert ok(api.delete("/v1/eval/datasets/gone")) == {"name": "gone", "status": "deleted"}
    assert not EvalDataset.objects.exists() and _datasets_dir_entries(home) == []
    error(api.get("/v1/eval/datasets/gone"), 404, "dataset_not_found")
    ok(upload(api, "gone", jsonl([{"q": "c"}]), fmt="raw"))  # the name is free again
