"""`kiln user create` and `kiln token create|revoke`: local commands that write the database directly
(migrating it first, so they work on a fresh KILN_HOME)."""

from __future__ import annotations

import getpass
import os
import sys

from kiln_project.cli.migrate_lock import migrate_database


def add_parser(subparsers) -> None:
    user = subparsers.add_parser("user", help="manage users (local)")
    user_sub = user.add_subparsers(dest="user_command", required=True)
    create = user_sub.add_parser("create", help="create a user who can log in to /ui/ and submit and cancel "
                                                "their own work (jobs.submit_job)")
    create.add_argument("username")
    role = create.add_mutually_exclusive_group()
    role.add_argument("--superuser", action="store_true", help="may use /admin/ and approve promotions")
    role.add_argument("--viewer", action="store_true", help="may only read: no jobs.submit_job")
    create.add_argument("--approver", action="store_true", help="may approve or reject promotions")
    create.add_argument("--password-env", default="KILN_PASSWORD",
                        help="read the password from this variable instead of prompting")
    user.set_defaults(handler=run_user)

    token = subparsers.add_parser("token", help="manage API tokens (local)")
    token_sub = token.add_subparsers(dest="token_command", required=True)
    token_create = token_sub.add_parser("create", help="create an API token for USER and print it once")
    token_create.add_argument("username")
    token_create.add_argument("--name", default="")
    revoke = token_sub.add_parser("revoke", help="revoke a token: the whole token, or its first 8+ characters")
    revoke.add_argument("prefix", metavar="TOKEN", help="the token kiln token create printed, or a start of it "
                                                        "(at least 8 characters) that only one active token has")
    token.set_defaults(handler=run_token)


def _setup() -> None:
    """Django, and the database brought up to date as `kiln serve` does: on a fresh KILN_HOME,
    `kiln user create` is the first command the README runs, before any server has migrated."""
    import django

    django.setup()
    _refuse_upgrading_a_served_database()
    migrate_database()  # several nodes starting together on one PostgreSQL: one migrates, the others wait


def _refuse_upgrading_a_served_database() -> None:
    """Kiln's code was upgraded under a running `kiln serve`: migrating here would change its tables
    under the old code (QA: a new NOT NULL column, and every job the server then created failed).
    The server migrates when it restarts."""
    from django.conf import settings

    from core.process_locks import ProcessLock
    from kiln_project.cli.client import CliError
    from kiln_project.cli.migrate_lock import pending_upgrade

    pending = pending_upgrade()
    if not pending:
        return
    lock = ProcessLock(settings.KILN.layout.locks / "serve.lock")
    if not lock.held_elsewhere():  # no server on this KILN_HOME: this command may migrate
        return
    holder = lock.holder() or {}
    raise CliError("kiln_serve_needs_restart", f"kiln serve (pid {holder.get('pid', '?')}) runs on {settings.KILN.home} "
                   f"and the database still needs {len(pending)} migration(s) of this code "
                   f"({', '.join(pending[:3])}): migrating here would change its tables under it",
                   "if it is starting, wait a moment and run this again; if it runs older code, restart it (it "
                   "migrates as it starts), then run this again")


def run_user(args) -> int:
    from kiln_project.cli.client import CliError

    _setup()
    from core.accounts.services import check_new_username, user_create
    from core.errors import KilnError

    try:
        check_new_username(args.username)  # before the prompt: no password typed for nothing
    except KilnError as exc:
        raise CliError(exc.code, exc.message, exc.hint) from None
    password = os.environ.get(args.password_env)
    if password is None:
        password = _read_password(args.username)
    if len(password) < 8:
        raise CliError("weak_password", "the password must be at least 8 characters")
    try:
        user_create(username=args.username, password=password, superuser=args.superuser,
                    can_submit=not args.viewer, can_approve=args.approver or args.superuser)
    except KilnError as exc:
        raise CliError(exc.code, exc.message, exc.hint) from None
    print(f"created user {args.username}")
    return 0


def _read_password(username: str) -> str:
    """Prompt on a terminal; without one (a pipe, a closed stdin) read one line, as getpass would but
    without its multi-line "password may be echoed" warning (an empty stdin is input_closed in main)."""
    if sys.stdin is not None and sys.stdin.isatty():
        return getpass.getpass(f"password for {username}: ")
    line = sys.stdin.readline() if sys.stdin is not None else ""
    if not line:
        raise EOFError
    return line.rstrip("\r\n")


def run_token(args) -> int:
    from kiln_project.cli.client import CliError

    _setup()
    from core.accounts.services import token_create, token_revoke
    from core.errors import KilnError

    if args.token_command == "create":
        try:
            _, secret = token_create(username=args.username, name=args.name)
        except KilnError as exc:
            raise CliError(exc.code, exc.message, exc.hint) from None
        print(secret)
        return 0
    shown = args.prefix[:12]  # never echo a whole secret
    try:
        revoked = token_revoke(prefix=args.prefix)
    except KilnError as exc:
        raise CliError(exc.code, exc.message, exc.hint) from None
    if not revoked:
        raise CliError("token_not_found", f"no active token is or starts with {shown!r}",
                       "give the token kiln token create printed, or at least its first 8 characters")
    print(f"revoked {shown}")
    return 0
