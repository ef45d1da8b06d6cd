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
    metrics_cmd,
    model_cmd,
    openenv_cmd,
    promotions_cmd,
    rollout_cmd,
    serve,
    train_cmd,
    worker,
)
from kiln_project.cli.client import CliError, default_url
from kiln_project.config import ConfigError


class _Parser(argparse.ArgumentParser):
    """argparse without abbreviated long options: `kiln openenv train --output x` must be refused,
    not taken as `--output-adapter x` (every sub-parser is made with the root parser's class)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        """One line, like every other CLI error (argparse prints the whole usage block first)."""
        self.exit(2, f"error: usage_error: {self.prog}: {message} (hint: see {self.prog} --help)\n")


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
    metrics_cmd.add_parser(sub, common)
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
    except ConfigError as exc:
        # kiln.toml or a KILN_* variable holds a value Kiln cannot use: the message names it.
        print(config_error(exc).line(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `kiln openenv runs | head -3`: the reader left; say nothing more (and let the interpreter's
        # final flush of stdout go nowhere instead of printing a traceback).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # noqa: BLE001 - a CLI answers one line, never a traceback
        if os.environ.get("KILN_DEBUG"):
            raise
        print(unexpected_error(exc).line(), file=sys.stderr)
        return 1


def unexpected_error(exc: Exception) -> CliError:
    """One line for what no command turned into a CliError: the common ones by their cause."""
    import httpx

    if isinstance(exc, EOFError):
        return CliError("input_closed", "standard input ended before a prompt was answered",
                        "run it in a terminal, or give the value by its environment variable (e.g. KILN_PASSWORD)")
    if isinstance(exc, UnicodeDecodeError):
        return CliError("file_not_text", f"a file is not UTF-8 text ({exc.reason} at byte {exc.start})",
                        "give an uncompressed UTF-8 JSON or JSONL file")
    from django.core.exceptions import ImproperlyConfigured
    from django.db.utils import OperationalError

    if isinstance(exc, ImproperlyConfigured):
        # e.g. DATABASE_URL=bogus://x (django-environ), or production settings without KILN_SECRET_KEY
        return CliError("invalid_config", _one_line(str(exc)),
                        "fix the variable it names (DATABASE_URL, KILN_*) or kiln.toml; README.md, Configuration")
    if isinstance(exc, OperationalError):
        # the database in DATABASE_URL does not exist, refuses the credentials, or is not reachable
        return CliError("database_unavailable", f"cannot use the database: {_one_line(str(exc))}",
                        "check DATABASE_URL (the server, the database name, the user and password) and that "
                        "the database exists and accepts connections")
    if isinstance(exc, httpx.InvalidURL):
        return CliError("invalid_url", f"the server URL is not valid: {exc}", "e.g. --url http://127.0.0.1:8420")
    if isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        return CliError("os_error", f"{exc.strerror or exc}{where}", "check the path and its permissions")
    from kiln_project.cli import client

    if isinstance(exc, KeyError | TypeError) and client.last_answered_by:
        # A 2xx JSON answer without the fields Kiln's API sends: a wrong --url that answers JSON, or a
        # server of another version. (A bug of the command itself would read the same; the text says which.)
        return CliError("unexpected_answer", f"the answer from {client.last_answered_by} is not what Kiln's API "
                        f"sends ({_one_line(f'{type(exc).__name__}: {exc}')})",
                        "check --url or KILN_URL names a Kiln server of this version; set KILN_DEBUG=1 to see the "
                        "traceback")
    # one line even for a multi-line message (a database error's DETAIL line, say)
    return CliError("unexpected_error", _one_line(f"{type(exc).__name__}: {exc}"),
                    "set KILN_DEBUG=1 to see the traceback, and report it")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def config_error(exc: ConfigError) -> CliError:
    return CliError(exc.code, _one_line(exc.message), exc.hint)


def check_config() -> int:
    """scripts/serve's first look at the settings, before manage.py (whose settings module would raise the
    same refusal as a traceback): 0, or kiln serve's one `invalid_config` line and 1."""
    from kiln_project.config import load_config

    try:
        load_config()
    except ConfigError as exc:
        print(config_error(exc).line(), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
