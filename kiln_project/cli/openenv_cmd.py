"""`kiln openenv inspect|tasks`: discover OpenEnv environments from this machine (reference-spec §1.7).

Local commands: they talk to the environment servers directly through the pure client
(`openenv.client`), not to the Kiln API, and import no Django and no torch. `inspect` checks
/health, reads the four discovery documents and prints the identity (WebSocket URL, client
profile, OpenAPI version, schema, action-schema and complete-discovery SHA-256); `tasks` reads
one page of the optional Task API (501 means unsupported). Bearer tokens come from
`--credential-env VAR` (one per `--environment`, `-` for a public one) and are never printed.
Failures print one line with a stable code and exit non-zero.
"""

from __future__ import annotations

import asyncio
import json
import re

from kiln_project.cli.client import CliError
from kiln_project.cli.output import print_json

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def add_parser(subparsers, common) -> None:
    openenv = subparsers.add_parser("openenv", help="OpenEnv environments: inspect, task catalogs")
    sub = openenv.add_subparsers(dest="openenv_command", required=True)
    inspect = sub.add_parser("inspect", parents=[common], help="check /health and read the discovery documents")
    _environment_args(inspect)
    tasks = sub.add_parser("tasks", parents=[common], help="one page of an environment's Task API catalog")
    _environment_args(tasks)
    tasks.add_argument("--environment-name", help="the environment (default: the only one the server lists)")
    tasks.add_argument("--split", help="list the tasks of this split (default: list the splits)")
    tasks.add_argument("--start", type=int, default=0)
    tasks.add_argument("--limit", type=int, default=50, help="1..200 (default 50)")
    openenv.set_defaults(handler=run)


def _environment_args(parser) -> None:
    parser.add_argument("target", nargs="?", metavar="URL", help="environment URL (or use --environment)")
    parser.add_argument("--environment", action="append", default=[], metavar="URL",
                        help="environment base URL, e.g. http://127.0.0.1:8990 (repeatable for inspect)")
    parser.add_argument("--credential-env", action="append", default=[], metavar="VAR",
                        help="environment variable holding the bearer token for the aligned --environment; - = public")


def _urls(args) -> list[str]:
    urls = ([args.target] if args.target else []) + list(args.environment)
    if not urls:
        raise CliError("openenv_invalid_url", "give an environment URL", "kiln openenv inspect --environment URL")
    return urls


def _cli_error(exc) -> CliError:
    return CliError(exc.code, exc.message, exc.hint)


def _clean(value) -> str:
    """Server-supplied text for a terminal: no control characters (escape sequences)."""
    return _CONTROL.sub("?", "" if value is None else str(value))


def run(args) -> int:
    from openenv.client import OpenEnvError, credentials_for_urls, normalize_url

    try:
        endpoints = [normalize_url(url) for url in _urls(args)]
        credentials = credentials_for_urls(endpoints, args.credential_env)
        if args.openenv_command == "inspect":
            return _inspect(args, endpoints, credentials)
        if len(endpoints) != 1:
            raise CliError("openenv_invalid_task_selection", "tasks reads one environment at a time")
        return _tasks(args, endpoints[0], credentials[0])
    except OpenEnvError as exc:
        raise _cli_error(exc) from None


def _inspect(args, endpoints, credentials) -> int:
    from openenv.client.discovery import INSPECTION_SCHEMA, inspect

    async def inspect_all():
        return await asyncio.gather(*(inspect(e, credential=c) for e, c in zip(endpoints, credentials, strict=True)))

    inspections = asyncio.run(inspect_all())
    if args.json:
        print_json({"schema": INSPECTION_SCHEMA, "environments": [i.to_json() for i in inspections]})
        return 0
    for number, inspection in enumerate(inspections):
        if number:
            print()
        identity = inspection.identity
        meta = identity["metadata"]
        version = f" {meta['version']}" if meta.get("version") else ""
        rows = [
            ("environment", f"{meta['name']}{version}"),
            ("description", meta["description"][:200]),
            ("base url", identity["base_url"]),
            ("websocket", identity["websocket_url"]),
            ("client profile", identity["client_profile"]),
            ("openapi version", identity["openapi_version"] or "-"),
            ("environments", ", ".join(identity["environments"]) or "-"),
            ("authentication", identity["authentication"]),
            ("action schema", json.dumps(inspection.schema["action"], sort_keys=True)[:200]),
            ("schema sha256", identity["schema_sha256"]),
            ("action sha256", identity["action_schema_sha256"]),
            ("discovery sha256", identity["discovery_sha256"]),
        ]
        for label, value in rows:
            print(f"{label:<17} {_clean(value)}")
    return 0


def _tasks(args, endpoint, credential) -> int:
    from openenv.client.tasks import task_catalog

    catalog = asyncio.run(task_catalog(endpoint, credential=credential, environment_name=args.environment_name,
                                       split=args.split, start=args.start, limit=args.limit))
    if args.json:
        print_json(catalog)
        return 0
    print(f"environment  {_clean(catalog['environment_name'])} at {catalog['base_url']}")
    print(f"task api     {catalog['task_api']}")
    if catalog["task_api"] != "supported":
        return 0
    names = [s.get("name", s) if isinstance(s, dict) else s for s in catalog["splits"]]
    print(f"splits       {_clean(', '.join(map(str, names))) or '-'}")
    if "tasks" in catalog:
        shown = len(catalog["tasks"])
        print(f"split        {_clean(catalog['split'])}: tasks {catalog['start']}..{catalog['start'] + shown} "
              f"of {catalog['num_tasks']} (catalog rows are not reset data)")
        for row in catalog["tasks"]:
            print("  " + _clean(json.dumps(row, sort_keys=True))[:300])
    return 0

