"""`kiln rollout-generate` refuses hostile or mistaken inputs cleanly, before any request:

- an output path that is one of the inputs (same path, a symlink or a hard link to it) is refused
  (`output_conflict`, naming both flags) and the input is left as it was;
- a tasks line or a template nested thousands of levels deep, or holding an integer over 4300 digits,
  is a `tasks_invalid` / `template_invalid` naming the line, never a RecursionError / ValueError;
- NaN and Infinity in a task are refused at load time, naming the line;
- a leading UTF-8 BOM in the tasks file or the template is accepted, as the server accepts it;
- a scorer's reward beyond 2**53 in size (which training refuses) is refused before publication.
"""

from __future__ import annotations

import json
import os
import stat
from types import SimpleNamespace

import pytest

from evaluations.generation.errors import RolloutError
from evaluations.generation.generate import plan_requests, run_requests
from evaluations.generation.template import RenderOptions, load_tasks, load_template
from kiln_project.cli import main as cli_main
from tests.rollouts.fakes import FakeServer
from tests.rollouts.test_command import FakeClient, argv, workdir  # noqa: F401 - workdir is a fixture

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = '{"id": "big", "prompt": "x", "reward": 1' + "0" * 5000 + "}"


def _with(args: list[str], flag: str, value) -> list[str]:
    args = list(args)
    args[args.index(flag) + 1] = str(value)
    return args


def _refused(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


# ---- outputs that are inputs ---------------------------------------------------------------------

@pytest.mark.parametrize(("out_flag", "in_flag", "name"), [
    ("--output", "--tasks", "tasks.jsonl"),
    ("--output", "--scorer", "score_math.py"),
    ("--summary-output", "--request-template", "request.json"),
    ("--summary-output", "--scorer", "score_math.py"),
])
def test_an_output_that_is_an_input_is_refused_and_the_input_kept(workdir, capsys, out_flag, in_flag, name):  # noqa: F811
    target = workdir / name
    before = (target.read_bytes(), stat.S_IMODE(target.stat().st_mode))
    assert cli_main.main(_with(argv(workdir), out_flag, target)) == 1
    err = _refused(capsys)
    assert err.startswith("error: output_conflict: ") and f"{out_flag} " in err and f"the {in_flag} file" in err
    assert (target.read_bytes(), stat.S_IMODE(target.stat().st_mode)) == before  # the scorer keeps its x bit
    assert FakeClient.server.bodies == []


def test_a_relative_output_naming_the_tasks_file_is_refused(workdir, capsys, monkeypatch):  # noqa: F811
    monkeypatch.chdir(workdir)
    assert cli_main.main(_with(argv(workdir), "--output", "tasks.jsonl")) == 1
    assert _refused(capsys).startswith("error: output_conflict: --output ")


@pytest.mark.parametrize("link", [os.symlink, os.link])
def test_a_symlink_or_hard_link_to_an_input_is_refused(workdir, capsys, link):  # noqa: F811
    link(workdir / "tasks.jsonl", workdir / "alias.jsonl")
    assert cli_main.main(_with(argv(workdir), "--output", workdir / "alias.jsonl")) == 1
    assert "the --tasks file" in _refused(capsys)
    assert FakeClient.server.bodies == []


def test_an_input_that_links_to_an_output_is_refused(workdir, capsys):  # noqa: F811
    os.symlink(workdir / "r.summary.json", workdir / "template-link.json")
    (workdir / "r.summary.json").write_text((workdir / "request.json").read_text())
    assert cli_main.main(_with(argv(workdir), "--request-template", workdir / "template-link.json")) == 1
    err = _refused(capsys)
    assert "--summary-output" in err and "the --request-template file" in err
    assert FakeClient.server.bodies == []


# ---- JSON the loaders must refuse cleanly ----------------------------------------------------------

@pytest.mark.parametrize(("line", "needle"), [
    (DEEP, "tasks.jsonl:2: nested too deeply"),
    (HUGE, "tasks.jsonl:2: not valid JSON (Exceeds the limit (4300 digits)"),
    ('{"id": "n", "prompt": "x", "answer": NaN}', "tasks.jsonl:2: not valid JSON (NaN is not JSON)"),
    ('{"id": "n", "prompt": "x", "answer": -Infinity}', "tasks.jsonl:2: not valid JSON (-Infinity is not JSON)"),
])
def test_hostile_task_lines_are_refused_naming_the_line(tmp_path, line, needle):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a", "prompt": "p"}\n' + line + "\n")
    with pytest.raises(RolloutError) as err:
        load_tasks(path)
    assert err.value.code == "tasks_invalid" and needle in err.value.message


@pytest.mark.parametrize(("text", "needle"), [
    (DEEP, "nested too deeply"),
    ('{"messages": [], "max_tokens": 1' + "0" * 5000 + "}", "not valid JSON (Exceeds the limit (4300 digits)"),
])
def test_a_hostile_template_is_refused(tmp_path, text, needle):
    path = tmp_path / "request.json"
    path.write_text(text)
    with pytest.raises(RolloutError) as err:
        load_template(path)
    assert err.value.code == "template_invalid" and needle in err.value.message


@pytest.mark.parametrize(("line", "code", "needle"), [
    (DEEP, "tasks_invalid", ":1: nested too deeply"),
    (HUGE, "tasks_invalid", ":1: not valid JSON (Exceeds the limit"),
    ('{"id": "n", "prompt": "What is 2 + 3?", "answer": NaN}', "tasks_invalid", ":1: not valid JSON (NaN is not JSON)"),
])
def test_the_command_refuses_hostile_tasks_before_any_request(workdir, capsys, line, code, needle):  # noqa: F811
    (workdir / "tasks.jsonl").write_text(line + "\n")
    assert cli_main.main(argv(workdir)) == 1
    err = _refused(capsys)
    assert err.startswith(f"error: {code}: ") and needle in err and "RecursionError" not in err
    assert FakeClient.server.bodies == []


def test_a_leading_bom_is_accepted_in_tasks_and_template(tmp_path):
    tasks, template = tmp_path / "tasks.jsonl", tmp_path / "request.json"
    tasks.write_bytes(b'\xef\xbb\xbf{"id": "a", "prompt": "p"}\n{"id": "b", "prompt": "q"}\n')
    body = {"messages": [{"role": "user", "content": "{{prompt}}"}]}
    template.write_bytes(b"\xef\xbb\xbf" + json.dumps(body).encode())
    assert [t.id for t in load_tasks(tasks)] == ["a", "b"]
    assert load_template(template) == body


# ---- rewards training would refuse -------------------------------------------------------------------

@pytest.mark.parametrize("reward", [1e300, -1e17, 2**60])
def test_a_reward_training_would_refuse_is_refused_at_scoring(tmp_path, reward):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"id": "a", "prompt": "What is 2 + 3?"}\n')
    options = RenderOptions(adapter="base", thinking=False)
    planned = plan_requests({"messages": [{"role": "user", "content": "{{prompt}}"}]}, load_tasks(tasks), [0],
                            options)

    def scorer(value):
        return lambda payload: SimpleNamespace(reward=value, raw_output=f"{value}\n", stderr_tail="", elapsed_ms=1,
                                               sandboxed=True, mechanism="fake")

    with pytest.raises(RolloutError) as err:
        run_requests(planned, post=FakeServer(), score=scorer(reward), options=options)
    assert err.value.code == "scorer_output_invalid" and "at most 2**53" in err.value.message
    ok = run_requests(planned, post=FakeServer(), score=scorer(-(2**53)), options=options)
    assert ok[0].reward == -(2**53)  # the bound itself is accepted, as training accepts it


def test_the_command_refuses_a_scorer_printing_1e300(workdir, capsys):  # noqa: F811
    scorer = workdir / "score_math.py"
    scorer.write_text("#!/usr/bin/env python3\nimport sys\nsys.stdin.read()\nprint('1e300')\n")
    scorer.chmod(0o755)
    assert cli_main.main(argv(workdir, "--unsandboxed-scorer")) == 1
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the --unsandboxed-scorer warning
    assert err.startswith("error: scorer_output_invalid: task ") and "at most 2**53" in err
    assert not (workdir / "r.rollouts.jsonl").exists() and not (workdir / "r.summary.json").exists()
