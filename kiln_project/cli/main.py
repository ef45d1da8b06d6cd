"""Entry point of the `kiln` console command."""

from __future__ import annotations

import argparse
import os
import sys

from kiln_project.cli import (
    accounts_cmd,
    adapters_cmd,
    eval_cmd,
    jobs_cmd,
    model_cmd,
    openenv_cmd,
    promotions_cmd,
    rollout_cmd,
    serve,
    train_cmd,
    worker,
)
from kiln_project.cli.client import CliError, default_url


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviated long options: `kiln openenv train --output x` must be refused,
    not taken as `--output-adapter x` (every sub-parser is made with the root parser's class)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        """One line, like every other CLI error (argparse prints the whole usage block first)."""
        self.exit(2, f"error: {self.prog}: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=None, help=f"Kiln server URL (default KILN_URL, else {default_url()})")
    common.add_argument("--json", action="store_true", help="print JSON instead of text")

    parser = _Parser(prog="kiln", description="Kiln: improve a local language model from its own use.")
    sub = parser.add_subparsers(dest="command", required=True)
    serve.add_parser(sub)
    worker.add_parser(sub)
    accounts_cmd.add_parser(sub)
    model_cmd.add_parser(sub)
    jobs_cmd.add_parser(sub, common)
    train_cmd.add_parser(sub, common)
    rollout_cmd.add_parser(sub, common)
    openenv_cmd.add_parser(sub, common)
    eval_cmd.add_parser(sub, common)
    adapters_cmd.add_parser(sub, common)
    promotions_cmd.add_parser(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln_project.settings")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args) or 0
    except CliError as exc:
        print(exc.line(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `kiln openenv runs | head -3`: the reader left; say nothing more (and let the interpreter's
        # final flush of stdout go nowhere instead of printing a traceback).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
