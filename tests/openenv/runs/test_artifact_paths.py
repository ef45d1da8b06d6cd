"""Manifest-bound downloads of files in subdirectories of a run directory (openenv.runs.downloads): a nested
artifact streams after its re-check; a symlink anywhere on the path (an intermediate directory or the
leaf), `..`, an absolute or empty component, a missing, truncated or modified file is 409
`openenv_artifact_integrity_failed`. Server-free: the run row and its files are made here."""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from openenv.models import OpenEnvRun
from openenv.runs.selectors import run_dir_for
from tests.openenv.runs.conftest import api, error_of, home  # noqa: F401

pytestmark = pytest.mark.django_db

KIND = "environment_eval_baseline_summary"
NESTED = "environment-evaluation/baseline/summary.json"
DATA = b'{"schema": "kiln.openenv-rollout-summary.v1"}\n'


def _run(files: dict[str, bytes], manifest: dict[str, str] | None = None) -> OpenEnvRun:
    run = OpenEnvRun.objects.create(sequence=OpenEnvRun.objects.count() + 1, request_digest="sha256:x",
                                    request={"kind": "train", "groups": 1, "group_size": 1}, kind="train",
                                    state="completed")
    directory = run_dir_for(run)
    for name, data in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    entries = manifest or {KIND: NESTED}
    run.artifacts = [{"kind": kind, "file": name, "sha256": "sha256:" + hashlib.sha256(DATA).hexdigest(),
                      "bytes": len(DATA)} for kind, name in entries.items()]
    run.save(update_fields=["artifacts"])
    return run


def _get(api, run, kind=KIND):  # noqa: F811
    return api.get(f"/v1/openenv/runs/{run.id}/artifacts/{kind}")


def test_a_nested_artifact_streams_with_its_headers(api, home):  # noqa: F811
    run = _run({NESTED: DATA})
    response = _get(api, run)
    assert response.status_code == 200 and b"".join(response.streaming_content) == DATA
    assert response["Content-Length"] == str(len(DATA))
    assert response["ETag"] == f'"sha256:{hashlib.sha256(DATA).hexdigest()}"'
    assert response["Content-Disposition"] == f'attachment; filename="openenv-{run.id}-{KIND}.json"'


def test_a_symlinked_intermediate_directory_is_refused(api, home, tmp_path):  # noqa: F811
    run = _run({NESTED: DATA})
    outside = tmp_path / "outside" / "baseline"
    outside.mkdir(parents=True)
    (outside / "summary.json").write_bytes(DATA)  # the very same bytes, reached through a link
    folder = run_dir_for(run) / "environment-evaluation"
    shutil.rmtree(folder / "baseline")
    os.symlink(outside, folder / "baseline")
    assert "symlink" in error_of(_get(api, run), 409, "openenv_artifact_integrity_failed")["message"]
    # the top directory of the path too
    shutil.rmtree(tmp_path / "outside")
    shutil.move(folder, tmp_path / "moved")
    os.symlink(tmp_path / "moved", folder)
    error_of(_get(api, run), 409, "openenv_artifact_integrity_failed")


def test_a_symlinked_nested_leaf_is_refused(api, home, tmp_path):  # noqa: F811
    run = _run({NESTED: DATA})
    target = tmp_path / "elsewhere.json"
    target.write_bytes(DATA)
    leaf = run_dir_for(run) / NESTED
    leaf.unlink()
    os.symlink(target, leaf)
    error_of(_get(api, run), 409, "openenv_artifact_integrity_failed")


@pytest.mark.parametrize("name", ["../outside.json", "environment-evaluation/../summary.json", "/etc/passwd",
                                  "environment-evaluation//summary.json", "environment-evaluation/./x.json", ""])
def test_a_manifest_path_leaving_the_run_directory_is_refused(api, home, name):  # noqa: F811
    run = _run({"summary.json": DATA}, manifest={KIND: name})
    assert "names no file" in error_of(_get(api, run), 409, "openenv_artifact_integrity_failed")["message"]


@pytest.mark.parametrize("change", ["missing", "missing_directory", "truncated", "modified", "a_directory"])
def test_a_changed_nested_file_is_refused(api, home, change):  # noqa: F811
    run = _run({NESTED: DATA})
    path = run_dir_for(run) / NESTED
    if change == "missing":
        path.unlink()
    elif change == "missing_directory":
        shutil.rmtree(path.parent)
    elif change == "truncated":
        path.write_bytes(DATA[:-3])
    elif change == "modified":
        path.write_bytes(DATA.replace(b"rollout", b"ROLLOUT"))
    else:
        path.unlink()
        path.mkdir()
    error_of(_get(api, run), 409, "openenv_artifact_integrity_failed")
