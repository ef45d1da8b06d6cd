"""The `kiln` command line itself: options are never abbreviated, and a closed pipe is not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kiln_project.cli.main import build_parser


def test_an_abbreviated_option_is_refused_not_taken_for_a_longer_one(capsys):
    # `--output-ad` used to be taken for `--output-adapter` and name the adapter.
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["openenv", "train", "--environment", "http://127.0.0.1:1",
                                   "--output-adapter", "real-name", "--output-ad", "abbrev-name"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == ("error: usage_error: kiln: unrecognized arguments: --output-ad "
                                       "(hint: see kiln --help)\n")
    # `--output` is its own flag (the collected episodes' copy, as on rollout), never the adapter's name
    args = build_parser().parse_args(["openenv", "train", "--environment", "http://127.0.0.1:1",
                                      "--output-adapter", "real-name", "--output", "mine.jsonl"])
    assert args.output_adapter == "real-name" and str(args.output) == "mine.jsonl"
    assert str(args.summary_output) == "openenv.rollout-summary.json"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["jobs", "list", "--js"])  # a prefix of --json


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    # `kiln ... | head -1`: the handler's writes hit a closed pipe. The command ends quietly.
    script = ("import argparse, sys\n"
              "from kiln_project.cli import main as cli\n"
              "def handler(args):\n"
              "    for i in range(100000):\n"
              "        print('row', i)\n"
              "class Parser:\n"
              "    def parse_args(self, argv):\n"
              "        return argparse.Namespace(handler=handler)\n"
              "cli.build_parser = Parser\n"
              "sys.exit(cli.main([]))\n")
    reader = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              cwd=os.getcwd())
    reader.stdout.readline()
    reader.stdout.close()  # the reader leaves
    stderr = reader.stderr.read().decode()
    assert reader.wait(30) == 141
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr



@pytest.mark.parametrize(("argv", "message"), [
    (["openenv", "rollout", "--thinking", "maybe"], "error: usage_error: kiln openenv rollout: argument --thinking: "),
    (["openenv", "train", "--environment", "http://127.0.0.1:1"],
     "error: usage_error: kiln openenv train: the following arguments are required: --output-adapter"),
    (["nope"], "error: usage_error: kiln: argument command: invalid choice: 'nope'"),
    (["promotions", "approve", "1"], "error: usage_error: kiln promotions approve: the following arguments are required"),
])
def test_a_usage_error_is_one_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.startswith(message) and err.count("\n") == 1, err
