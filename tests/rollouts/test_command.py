"""`kiln rollout-generate` end to end against a fake server: real scorer sandbox, real files.

The server is faked at the KilnClient boundary (answers built like runtime_host's); the scorer is
the example scorer run through evaluations.sandbox, sandboxed and not.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from core.contracts.groups import admit_jsonl
from kiln_project.cli import main as cli_main
from kiln_project.cli import rollout_cmd
from tests.rollouts.fakes import FakeServer

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "grpo-math"


class FakeClient:
    server = FakeServer()
    fail = None

    def __init__(self, url=None, token=None, timeout=30.0):
        self.url = url or "http://fake"

    def post(self, path, json=None):
        assert path == "/v1/chat/completions"
        return type(self).server(json)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    lines = (EXAMPLE / "tasks.jsonl").read_text().splitlines()[:3]
    (tmp_path / "tasks.jsonl").write_text("\n".join(lines) + "\n")
    shutil.copy(EXAMPLE / "request.json", tmp_path / "request.json")
    shutil.copy(EXAMPLE / "score_math.py", tmp_path / "score_math.py")
    tmp_path.chmod(0o755)  # the sandbox user must be able to read the scorer
    monkeypatch.setattr(rollout_cmd, "KilnClient", FakeClient)
    FakeClient.server = FakeServer()
    return tmp_path


def argv(workdir, *extra, adapter="base"):
    return ["rollout-generate", "--adapter", adapter, "--thinking", "false", "--tasks", str(workdir / "tasks.jsonl"),
            "--seeds", "4", "--seed-start", "42", "--request-template", str(workdir / "request.json"),
            "--scorer", str(workdir / "score_math.py"), "--output", str(workdir / "r.rollouts.jsonl"),
            "--summary-output", str(workdir / "r.summary.json"), "--concurrency", "3", *extra]


def test_generates_validated_scored_rollouts_and_a_summary(workdir, capsys):
    assert cli_main.main(argv(workdir)) == 0
    out = capsys.readouterr()
    assert "wrote 3 groups (12 rollouts)" in out.out
    data = (workdir / "r.rollouts.jsonl").read_bytes()
    corpus = admit_jsonl(data)
    assert corpus.jsonl == data and corpus.rollouts == corpus.with_provenance == 12
    summary = json.loads((workdir / "r.summary.json").read_text())
    assert summary["output"]["sha256"] == corpus.sha256
    assert summary["stats"]["mean_reward"] == 0.5  # the fake answers right on even seeds
    assert (summary["stats"]["min_reward"], summary["stats"]["max_reward"]) == (0.0, 1.0)
    assert summary["stats"]["groups_without_contrast"] == 0
    assert summary["scorer"]["sandboxed"] is True and summary["scorer"]["unsandboxed_requested"] is False
    assert summary["scorer"]["mechanisms"][0].startswith("bubblewrap")
    assert summary["seeds"] == {"start": 42, "count": 4, "last": 45}
    assert [r["scorer_raw_output"] for r in summary["requests"][:2]] == ["1.0\n", "0.0\n"]
    sent = sorted((b["messages"][0]["content"], b["seed"]) for b in FakeClient.server.bodies)
    assert len(sent) == len(set(sent)) == 12 and {seed for _, seed in sent} == {42, 43, 44, 45}
    assert all(b["adapter"] == "base" and b["rollout_provenance"] is True for b in FakeClient.server.bodies)
    assert sorted(p.name for p in workdir.iterdir()) == ["r.rollouts.jsonl", "r.summary.json", "request.json",
                                                         "score_math.py", "tasks.jsonl"]


def test_unsandboxed_scorer_is_warned_about_and_recorded(workdir, capsys):
    assert cli_main.main(argv(workdir, "--unsandboxed-scorer", "--json")) == 0
    out = capsys.readouterr()
    assert "--unsandboxed-scorer" in out.err and "WITHOUT a sandbox" in out.err
    printed = json.loads(out.out)
    assert printed["stats"]["count"] == 12
    # the warning is in the JSON too (stdout alone says it), as on stderr
    assert len(printed["warnings"]) == 1 and printed["warnings"][0] in out.err
    summary = json.loads((workdir / "r.summary.json").read_text())
    assert summary["scorer"]["sandboxed"] is False and summary["scorer"]["unsandboxed_requested"] is True


def test_a_misspelt_template_key_is_warned_about(workdir, capsys):
    """QA: `"max_token": 64` sampled the default 256 tokens unsaid (the route ignores unknown fields)."""
    template = json.loads((workdir / "request.json").read_text())
    template["max_token"] = template.pop("max_tokens")
    (workdir / "request.json").write_text(json.dumps(template))
    assert cli_main.main(argv(workdir)) == 0
    err = capsys.readouterr().err
    assert ("warning: the request template's 'max_token' is not a chat completions field: the server ignores it; "
            "did you mean 'max_tokens'?") in err
    assert "'messages'" not in err and "'temperature'" not in err  # real fields are not warned about


def _existing(workdir):
    (workdir / "r.rollouts.jsonl").write_text("previous rollouts\n")
    (workdir / "r.summary.json").write_text('{"previous": true}\n')
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in (workdir / "r.rollouts.jsonl", workdir / "r.summary.json")}


def _untouched(workdir, before):
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in before} == before
    assert not [p.name for p in workdir.iterdir() if p.name.startswith(".")]


def test_a_drifted_response_fails_with_one_line_and_writes_nothing(workdir, capsys):
    before = _existing(workdir)

    def tamper(body, response):
        if body["seed"] == 44:
            response["choices"][0]["rollout_provenance"]["sampling"]["temperature"] = 0.5

    FakeClient.server = FakeServer(tamper)
    assert cli_main.main(argv(workdir)) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("error: rollout_check_failed: task 'train-") and ", seed 44, check sampling:" in err
    _untouched(workdir, before)


def test_a_scorer_crash_names_task_seed_and_stderr_and_writes_nothing(workdir, capsys):
    before = _existing(workdir)
    scorer = workdir / "score_math.py"
    scorer.write_text(scorer.read_text().replace('row["task"]["answer"]', 'row["task"]["missing_field"]'))
    assert cli_main.main(argv(workdir)) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: scorer_crashed: task 'train-")
    assert re.search(r", seed 4[2-5]: scorer failed \(scorer_crashed\)", err) and "KeyError: 'missing_field'" in err
    _untouched(workdir, before)


def test_a_time_budget_is_sent_with_each_request_and_recorded(workdir, capsys):
    assert cli_main.main(argv(workdir, "--thinking", "true", "--thinking-budget-ms", "750")) == 0
    bodies = FakeClient.server.bodies
    assert len(bodies) == 12 and all(b["thinking_budget_ms"] == 750 and "thinking_budget_tokens" not in b
                                     and b["chat_template_kwargs"] == {"enable_thinking": True} for b in bodies)
    summary = json.loads((workdir / "r.summary.json").read_text())
    assert summary["thinking"] == {"enabled": True, "budget_tokens": None, "budget_ms": 750}
    capsys.readouterr()
    with pytest.raises(SystemExit) as usage:
        cli_main.main(argv(workdir, "--thinking-budget-ms", "0"))
    assert usage.value.code == 2 and "at least 1 millisecond" in capsys.readouterr().err


def test_refusals_happen_before_any_request(workdir, capsys):
    template = json.loads((workdir / "request.json").read_text())
    (workdir / "request.json").write_text(json.dumps({**template, "n": 4}))
    assert cli_main.main(argv(workdir)) == 1
    assert "template_owned_field" in capsys.readouterr().err and FakeClient.server.bodies == []
    (workdir / "request.json").write_text(json.dumps(template))
    assert cli_main.main(argv(workdir, "--thinking-budget-tokens", "8")) == 1
    assert "needs --thinking true" in capsys.readouterr().err
    (workdir / "score_math.py").chmod(0o644)
    assert cli_main.main(argv(workdir)) == 1
    assert "scorer_not_executable" in capsys.readouterr().err
    assert cli_main.main([*argv(workdir)[:-6], "--output", str(workdir / "nodir" / "x.jsonl")]) == 1
    assert "output_directory_missing" in capsys.readouterr().err
    assert FakeClient.server.bodies == []


def test_a_plan_too_large_is_refused_before_anything_is_read_or_rendered(workdir, capsys, monkeypatch):
    """QA: --seeds 100000000 rendered every body up front and grew past 4 GB without a word."""
    from evaluations.generation import generate

    args = argv(workdir)
    seeds = args.index("--seeds") + 1
    args[seeds] = "100000000"
    assert cli_main.main(args) == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("error: invalid_argument: --seeds 100000000 is more than 1024 completions per task")
    assert len(error.splitlines()) == 1 and FakeClient.server.bodies == []
    monkeypatch.setattr(generate, "MAX_PLANNED_REQUESTS", 10)  # 3 tasks x 4 seeds = 12
    assert cli_main.main(argv(workdir)) == 1
    assert "3 tasks x 4 seeds is 12 requests, more than 10 in one run" in capsys.readouterr().err
    assert FakeClient.server.bodies == [] and not (workdir / "r.rollouts.jsonl").exists()


def test_the_command_module_stays_light():
    code = ("import sys, kiln_project.cli.main, kiln_project.cli.rollout_cmd;"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'django', 'peft')))")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "[]", result.stderr


@pytest.mark.parametrize("inside", [False, True])
def test_a_file_the_local_server_could_not_train_on_by_path_is_warned_about(workdir, capsys, monkeypatch, inside):
    """Spec audit: the guide's step 5 sends this file as dataset_path, which the server reads only under its
    dataset roots; written elsewhere, the refusal came two steps later. Now rollout-generate says so."""
    roots = [str(workdir)] if inside else ["/srv/kiln/rollouts", "/srv/kiln/datasets"]

    class LocalServer(FakeClient):
        def __init__(self, url=None, token=None, timeout=30.0):
            self.url = "http://127.0.0.1:8420"

        def get(self, path):
            assert path == "/v1/config"
            return {"config": {"dataset_roots": roots}}

    monkeypatch.setattr(rollout_cmd, "KilnClient", LocalServer)
    assert cli_main.main(argv(workdir)) == 0
    err = capsys.readouterr().err
    warned = [line for line in err.splitlines() if "outside the server's dataset roots" in line]
    if inside:
        assert not warned
    else:
        assert warned == [f"warning: {workdir / 'r.rollouts.jsonl'} lies outside the server's dataset roots "
                          "(/srv/kiln/rollouts, /srv/kiln/datasets), so POST /v1/train/grpo with it as dataset_path "
                          "will be refused: write it under one of them, or add its folder to [training] "
                          "dataset_roots in kiln.toml (or KILN_DATASET_ROOTS, separated by ':') and restart"]
