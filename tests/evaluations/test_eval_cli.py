"""`kiln eval datasets ...` and `kiln eval suites ...` against the real API (in process: the CLI's
HTTP client is routed into Django's test client), text and --json output, one-line errors."""

from __future__ import annotations

import json

import httpx
import pytest

from kiln_project.cli import eval_cmd
from kiln_project.cli import main as cli_main
from kiln_project.cli.client import KilnClient
from tests.evaluations import dataset_support
from tests.evaluations.dataset_support import group, jsonl

pytestmark = pytest.mark.django_db
api, home = dataset_support.api, dataset_support.home  # the shared fixtures


@pytest.fixture
def kiln(api, monkeypatch, capsys):
    """Run `kiln ...` and return (exit code, stdout, stderr); requests reach the API in process."""

    def handler(request: httpx.Request) -> httpx.Response:
        response = api.generic(request.method, request.url.raw_path.decode(), data=request.read(),
                               content_type=request.headers.get("content-type", "application/octet-stream"))
        return httpx.Response(response.status_code, content=response.content,
                              headers={"content-type": response.get("Content-Type", "application/json")})

    class InProcessClient(KilnClient):
        def __init__(self, url=None, token=None, timeout=30.0):
            super().__init__(url, token="unused", timeout=timeout)
            self._http = httpx.Client(base_url=self.url, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(eval_cmd, "KilnClient", InProcessClient)

    def run(*argv):
        code = cli_main.main(list(argv))
        out = capsys.readouterr()
        return code, out.out, out.err

    return run


def test_datasets_upload_list_show_split_and_synthesize(kiln, home, tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_bytes(jsonl([group(i, reference=str(2 * i)) for i in range(30)]))
    code, out, _ = kiln("eval", "datasets", "upload", "math", str(path), "--format", "grpo_groups",
                        "--description", "sums", "--json")
    assert code == 0
    manifest = json.loads(out)
    assert manifest["name"] == "math" and manifest["rows"] == 30 and manifest["description"] == "sums"
    code, out, _ = kiln("eval", "datasets", "list")
    assert code == 0 and "math" in out and "grpo_groups" in out
    counts = manifest["split_counts"]
    assert f"{counts['train']}/{counts['validation']}/{counts['holdout']}" in out
    code, out, _ = kiln("eval", "datasets", "show", "math")
    assert code == 0 and manifest["corpus_sha256"] in out and "seed 0, train 80%, validation 10%" in out
    code, out, _ = kiln("eval", "datasets", "split", "math", "--seed", "9", "--train-percent", "60",
                        "--validation-percent", "20", "--preview")
    assert code == 0 and out.startswith("math: would give train ")
    assert json.loads(kiln("eval", "datasets", "show", "math", "--json")[1])["split_config"]["seed"] == "0"
    code, out, _ = kiln("eval", "datasets", "split", "math", "--seed", "9", "--train-percent", "60",
                        "--validation-percent", "20", "--json")
    assert code == 0 and json.loads(out)["split_config"] == {"seed": "9", "train_percent": 60,
                                                              "validation_percent": 20}
    # One flag changes one value: the others keep the current split's (they were reset to 80/10).
    code, out, _ = kiln("eval", "datasets", "split", "math", "--seed", "11", "--json")
    assert code == 0 and json.loads(out)["split_config"] == {"seed": "11", "train_percent": 60,
                                                              "validation_percent": 20}
    code, out, _ = kiln("eval", "datasets", "synthesize", "math", "--suite", "math-val", "--source-split",
                        "validation", "--scorer", '{"type": "numeric_tolerance", "tolerance": 0.5}', "--head-n", "2")
    assert code == 0 and out.startswith("suite math-val: 2 examples, sha256:")
    code, out, _ = kiln("eval", "suites", "show", "math-val", "--json")
    suite = json.loads(out)
    assert suite["scorer"] == {"type": "numeric_tolerance", "tolerance": 0.5} and len(suite["examples"]) == 2
    assert suite["examples"][0]["metadata"]["kiln_dataset_provenance"]["partition"] == "validation"
    code, out, err = kiln("eval", "datasets", "synthesize", "math", "--suite", "math-val")
    assert code == 1 and out == "" and err.startswith("error: eval_suite_exists: ") and err.count("\n") == 1
    code, out, _ = kiln("eval", "datasets", "delete", "math")
    assert code == 0 and out.strip() == "deleted math"


def test_suites_create_list_show_delete(kiln, home, tmp_path):
    path = tmp_path / "suite.json"
    body = {"name": "sums", "scorer": {"type": "exact"},
            "examples": [{"id": "a", "messages": [{"role": "user", "content": "2+3?"}], "target": "5"}]}
    path.write_text(json.dumps(body))
    code, out, _ = kiln("eval", "suites", "create", str(path))
    assert code == 0 and out.startswith("suite sums: 1 examples, sha256:")
    code, _, err = kiln("eval", "suites", "create", str(path))
    assert code == 1 and err.startswith("error: eval_suite_exists: ") and "force=true" in err
    assert kiln("eval", "suites", "create", str(path), "--force")[0] == 0
    code, out, _ = kiln("eval", "suites", "list", "--json")
    assert [s["name"] for s in json.loads(out)] == ["sums"]
    code, out, _ = kiln("eval", "suites", "show", "sums")
    assert code == 0 and "a: target '5'" in out
    assert kiln("eval", "suites", "delete", "sums")[1].strip() == "deleted sums"
    code, _, err = kiln("eval", "suites", "show", "sums")
    assert code == 1 and err.startswith("error: eval_suite_not_found: ")


def test_cli_errors_are_one_line(kiln, home, tmp_path):
    code, _, err = kiln("eval", "datasets", "upload", "x", str(tmp_path / "missing.jsonl"), "--format", "raw")
    assert code == 1 and err.startswith("error: file_unreadable: ")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n[2]\n')
    code, _, err = kiln("eval", "datasets", "upload", "x", str(bad), "--format", "raw")
    assert code == 1 and err.startswith("error: dataset_invalid: file line 2: ") and err.count("\n") == 1
    code, _, err = kiln("eval", "datasets", "show", "nope")
    assert code == 1 and err.startswith("error: dataset_not_found: ")
    (tmp_path / "bad.json").write_text("{")
    code, _, err = kiln("eval", "suites", "create", str(tmp_path / "bad.json"))
    assert code == 1 and err.startswith("error: invalid_json: ")
