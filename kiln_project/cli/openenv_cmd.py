"""`kiln openenv inspect|tasks|rollout|verify|replay`: OpenEnv from this machine (reference-spec §1.7).

Local commands: they talk to the environment servers directly through the pure client
(`openenv.client`), not to the Kiln API, and import no Django and no torch. `inspect` checks
/health, reads the four discovery documents and prints the identity (WebSocket URL, client
profile, OpenAPI version, schema, action-schema and complete-discovery SHA-256); `tasks` reads
one page of the optional Task API (501 means unsupported). Bearer tokens come from
`--credential-env VAR` (one per `--environment`, `-` for a public one) and are never printed.
Failures print one line with a stable code and exit non-zero.

`rollout` collects seed-matched groups (`openenv.collector`) with Kiln's model as the policy: each
turn is a POST /v1/chat/completions with rollout provenance to `--url` (token: KILN_API_TOKEN or
the local cli-token), validated against its provenance record; it publishes the JSONL, the replay
and the summary together, or nothing. `verify` checks the three files offline (`openenv.verify`);
`replay` verifies, then runs the recorded transcript against the live environments
(`openenv.replay`) and exits non-zero on the first divergence.

`start|runs|status|artifact|cancel` are clients of the server's persisted runs
(kiln_project/cli/openenv_runs_cmd.py).
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
from pathlib import Path

from kiln_project.cli import openenv_run_text, openenv_runs_cmd
from kiln_project.cli.client import CliError
from kiln_project.cli.openenv_artifact_paths import artifact_paths
from kiln_project.cli.openenv_interrupted import CollectionTally, interrupted_error
from kiln_project.cli.output import check_output_path, print_json

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def add_parser(subparsers, common) -> None:
    from kiln_project.cli.rollout_cmd import finite_float

    openenv = subparsers.add_parser("openenv", help="OpenEnv environments: inspect, collect, persisted runs")
    sub = openenv.add_subparsers(dest="openenv_command", required=True)
    inspect = sub.add_parser("inspect", parents=[common], help="check /health and read the discovery documents")
    _environment_args(inspect)
    tasks = sub.add_parser("tasks", parents=[common], help="one page of an environment's Task API catalog")
    _environment_args(tasks)
    tasks.add_argument("--environment-name", help="the environment (default: the only one the server lists)")
    tasks.add_argument("--split", help="list the tasks of this split (default: list the splits)")
    tasks.add_argument("--start", type=int, default=0)
    tasks.add_argument("--limit", type=int, default=50, help="1..200 (default 50)")
    _rollout_args(sub, common)
    verify = sub.add_parser("verify", parents=[common], help="check a collection's JSONL, replay and summary offline")
    _artifact_args(verify)
    replay = sub.add_parser("replay", parents=[common], help="verify, then run the recorded transcript again live")
    _artifact_args(replay)
    replay.add_argument("--credential-env", action="append", default=[], metavar="VAR",
                        help="bearer token variable per recorded environment, in order; - = public")
    replay.add_argument("--concurrency", type=_positive, default=4)
    replay.add_argument("--capacity-wait-seconds", type=finite_float, default=300.0)
    openenv_runs_cmd.add_parsers(sub, common)  # start, runs, status, artifact, cancel: the server's runs
    openenv.set_defaults(handler=run)


def _positive(value: str) -> int:
    from kiln_project.cli.rollout_cmd import positive_int

    return positive_int(value)


def collection_args(parser) -> None:
    """The collection flags `rollout` (here, collected locally) and `train` (openenv_runs_cmd.py, collected
    by the server) share: groups and seeds, reset options, episode limits, sampling, error handling."""
    from kiln_project.cli.rollout_cmd import finite_float, parse_bool, parse_budget, positive_int

    parser.add_argument("--groups", type=positive_int, default=8)
    parser.add_argument("--group-size", type=positive_int, default=4)
    parser.add_argument("--seed-start", type=int, default=0)
    parser.add_argument("--reset-options", type=Path, metavar="FILE",
                        help="one JSON reset object for every environment")
    parser.add_argument("--environment-reset-options", action="append", default=[], metavar="FILE|-",
                        help="a JSON reset object per --environment, aligned; - for an empty slot")
    parser.add_argument("--max-steps", type=positive_int, default=8)
    parser.add_argument("--concurrency", type=positive_int, default=4)
    parser.add_argument("--max-action-tokens", type=positive_int, default=256)
    parser.add_argument("--temperature", type=finite_float, default=1.0)
    parser.add_argument("--thinking", type=parse_bool, default=True, metavar="BOOL", help="default true")
    parser.add_argument("--thinking-budget-tokens", type=parse_budget, default=None, metavar="N|unlimited")
    parser.add_argument("--protocol-error-reward", type=finite_float, default=-1.0)
    parser.add_argument("--max-recoverable-errors", type=int, default=3)
    parser.add_argument("--capacity-wait-seconds", type=finite_float, default=300.0)


def _rollout_args(sub, common) -> None:
    p = sub.add_parser("rollout", parents=[common], help="collect seed-matched OpenEnv episodes with Kiln's model",
                       description="Collect groups x candidates of stateful episodes and publish canonical "
                                   "AgenticGroup JSONL, the replay transcript and the summary together.")
    _environment_args(p)
    p.add_argument("--adapter", default="base", help="behavior adapter (base, none or null: the base model)")
    collection_args(p)
    p.add_argument("--reply-timeout-seconds", type=_positive, default=60, metavar="N",
                   help="how long one environment reply (reset, step, state) may take; default 60 (a server's "
                        "runs: [openenv] reply_timeout_secs)")
    p.add_argument("--output", type=Path, default=Path("openenv.rollouts.jsonl"))
    p.add_argument("--replay-output", type=Path, default=Path("openenv.replay.json"))
    p.add_argument("--summary-output", type=Path, default=Path("openenv.rollout-summary.json"))


def _artifact_args(parser) -> None:
    parser.add_argument("summary_file", nargs="?", metavar="SUMMARY", help="the rollout summary (or --summary)")
    parser.add_argument("--summary", type=Path, help="the rollout summary JSON")
    parser.add_argument("--dataset", type=Path, help="the JSONL (default: the summary's output_path file name beside "
                        "the summary, else STEM.rollouts.jsonl beside STEM.rollout-summary.json, else that stored "
                        "path, said in a note)")
    parser.add_argument("--replay", type=Path, help="the replay transcript (default: the summary's replay_output_path "
                        "file name beside the summary, else STEM.replay.json beside it, else that stored path, "
                        "said in a note)")


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
    for url in urls:
        _check_url_form(url)
    return urls


def _check_url_form(raw: str) -> None:
    """Before any request: a URL without a scheme must be HOST:PORT (a bare word such as `notaurl` is a typo,
    not a host to look up and fail to reach)."""
    from urllib.parse import urlsplit

    text = raw.strip() if isinstance(raw, str) else ""
    if not text or "://" in text:
        return  # normalize_url checks the rest
    try:
        port = urlsplit("http://" + text).port
    except ValueError:
        return  # normalize_url names what does not parse
    if port is None:
        raise CliError("openenv_invalid_url", f"{_clean(text)[:200]!r} is not an environment URL",
                       "give http(s)://HOST[:PORT][/PATH] or HOST:PORT, e.g. http://127.0.0.1:8990")


def _cli_error(exc) -> CliError:
    return CliError(exc.code, exc.message, exc.hint)


def _clean(value) -> str:
    """Server-supplied text for a terminal: no control characters (escape sequences)."""
    return _CONTROL.sub("?", "" if value is None else str(value))


def run(args) -> int:
    from openenv.client import OpenEnvError, credentials_for_urls, normalize_url

    if args.openenv_command in openenv_runs_cmd.COMMANDS:
        return openenv_runs_cmd.run(args)
    if args.openenv_command in ("rollout", "verify", "replay"):
        try:
            return {"rollout": _rollout, "verify": _verify, "replay": _replay}[args.openenv_command](args)
        except OpenEnvError as exc:
            raise _cli_error(exc) from None
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
            # reference-spec 4.2: openapi_version is the document's info.version, not its "openapi" (3.1.0)
            ("openapi version", f"{identity['openapi_version']} (info.version)" if identity["openapi_version"] else "-"),
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
    from openenv.client.errors import OpenEnvInvalidTaskSelection
    from openenv.client.tasks import task_catalog

    try:
        catalog = asyncio.run(task_catalog(endpoint, credential=credential, environment_name=args.environment_name,
                                           split=args.split, start=args.start, limit=args.limit))
    except OpenEnvInvalidTaskSelection as exc:
        if exc.http_status == 404 and exc.message.startswith("GET splits"):
            # Not a bad selection: the splits route itself is missing, so `tasks` without --split fails too.
            named = f" or has no environment named {args.environment_name!r}" if args.environment_name else ""
            raise CliError(exc.code, f"{endpoint.base_url} has no Task API (GET splits answered 404){named}",
                           "the Task API is optional: collection does not need it; kiln openenv inspect URL shows "
                           "what the server offers") from None
        raise
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
        shown, total = len(catalog["tasks"]), catalog["num_tasks"]
        if not shown and isinstance(total, int) and catalog["start"] >= total > 0:
            raise CliError("openenv_invalid_task_selection", f"--start {catalog['start']} is past the end of split "
                           f"{_clean(catalog['split'])!r}, which has {total} tasks",
                           f"use --start 0..{total - 1}")
        print(f"split        {_clean(catalog['split'])}: tasks {catalog['start']}..{catalog['start'] + shown} "
              f"of {total} (catalog rows are not reset data)")
        for row in catalog["tasks"]:  # text as it is (ensure_ascii off), control characters still escaped
            print("  " + _clean(json.dumps(row, sort_keys=True, ensure_ascii=False))[:300])
    return 0



# --- rollout ---------------------------------------------------------------------------------------

MAX_RESET_FILE_BYTES = 16 * 1024 * 1024 - 1024


def json_object_file(path: Path, code: str, max_bytes: int) -> dict:
    """The one JSON object in `path` (at most `max_bytes`); anything else is a CliError with `code`.
    Reset options here, and the request `kiln openenv start --request FILE` posts (openenv_runs_cmd.py)."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise CliError(code, f"{path} holds {size} bytes; at most {max_bytes}")
        value = json.loads(path.read_bytes())
    except OSError as exc:
        raise CliError(code, f"cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(code, f"{path} is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CliError(code, f"{path} must hold one JSON object")
    return value


def _reset_file(path: Path) -> dict:
    return json_object_file(path, "openenv_invalid_collection", MAX_RESET_FILE_BYTES)


def _progress():
    from kiln_project.cli.output import ProgressBar

    if not sys.stderr.isatty():
        return None, None
    bar = ProgressBar()
    return bar, lambda done, total, label: bar.update(done / total, f"{done}/{total} {label}")


def _kiln_post(client):
    from openenv.collector import CollectionError
    from openenv.collector.errors import policy_refusal_hint

    async def post(body: dict) -> dict:
        try:
            return await asyncio.to_thread(client.post, "/v1/chat/completions", json=body)
        except CliError as exc:
            raise CollectionError("openenv_policy_failed", f"the model server answered {exc.code}: {exc.message}",
                                  failure_code="model_inference_failed",
                                  hint=policy_refusal_hint(exc.code, exc.hint)) from None

    return post


def _refuse_under_a_profile_without_inference(client) -> None:
    """Every episode's actions come from the server's chat route: under the maintenance profile it refuses
    them all, so say so before an environment is contacted (a server run is refused at admission alike)."""
    try:
        profile = client.get("/health").get("serving_profile")
    except CliError:
        return  # an unhealthy server: the collection's first request says what is wrong
    if profile == "maintenance":
        raise CliError("inference_disabled_by_profile", "the maintenance serving profile refuses inference, "
                       "which every episode's actions need",
                       "restart the server with the stable profile (KILN_SERVER_SERVING_PROFILE=stable) to run it")


def _rollout(args) -> int:
    from kiln_project.cli.client import KilnClient
    from kiln_project.cli.rollout_cmd import REQUEST_TIMEOUT_S
    from openenv.client import OpenEnvError, credentials_for_urls, normalize_url
    from openenv.collector import ChatCompletionPolicy, CollectionConfig, collect_and_publish
    from openenv.collector.config import adapter_name
    from openenv.collector.diagnosis import collection_warnings

    urls = [normalize_url(url).base_url for url in _urls(args)]
    if args.reset_options is not None and args.environment_reset_options:
        raise CliError("openenv_invalid_collection", "give --reset-options or --environment-reset-options, not both")
    per_environment = None
    if args.environment_reset_options:
        per_environment = [None if item == "-" else _reset_file(Path(item)) for item in args.environment_reset_options]
    client = KilnClient(args.url, timeout=REQUEST_TIMEOUT_S)
    _refuse_under_a_profile_without_inference(client)
    config = CollectionConfig(
        environment_urls=urls, credentials=credentials_for_urls(urls, args.credential_env), kiln_url=client.url,
        adapter=args.adapter, groups=args.groups, group_size=args.group_size, seed_start=args.seed_start,
        max_steps=args.max_steps, concurrency=args.concurrency, max_action_tokens=args.max_action_tokens,
        temperature=args.temperature, thinking=args.thinking, thinking_budget_tokens=args.thinking_budget_tokens,
        protocol_error_reward=args.protocol_error_reward, max_recoverable_errors=args.max_recoverable_errors,
        capacity_wait_seconds=args.capacity_wait_seconds,
        reset_options=_reset_file(args.reset_options) if args.reset_options is not None else None,
        environment_reset_options=per_environment, output_path=args.output, replay_output_path=args.replay_output,
        summary_output_path=args.summary_output, request_timeout_s=float(args.reply_timeout_seconds)).check()
    for path in (config.output_path, config.replay_output_path, config.summary_output_path):
        check_output_path(path)  # before any episode: a device, FIFO or missing folder is refused
    policy = ChatCompletionPolicy(_kiln_post(client), adapter=adapter_name(args.adapter))
    bar, progress = _progress()
    tally = CollectionTally(config.groups, config.group_size, progress)
    try:
        bundle = asyncio.run(collect_and_publish(config, policy, on_progress=tally))
    except OpenEnvError as exc:
        raise interrupted_error(exc, tally) from None
    finally:
        if bar is not None:
            bar.close()
    summary = bundle.summary_value
    stats = summary["stats"]
    warnings = collection_warnings([json.loads(line) for line in bundle.dataset.splitlines() if line.strip()])
    if args.json:
        print_json({"output": summary["output_path"], "replay_output": summary["replay_output_path"],
                    "summary_output": summary["summary_output_path"], "dataset_sha256": summary["dataset_sha256"],
                    "stats": stats, "warnings": warnings})
        return 0
    print(f"wrote {summary['groups']} groups ({summary['rollout_count']} rollouts) to {summary['output_path']}")
    print(f"replay: {summary['replay_output_path']}")
    print(f"summary: {summary['summary_output_path']}")
    returns, episodes = openenv_run_text.stats_lines(stats)
    print(f"return {returns}; {episodes}")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _print_notes(notes: list[str], as_json: bool) -> None:
    for note in notes:
        print(f"note: {note}", file=sys.stderr if as_json else sys.stdout, flush=True)


def _verified(summary: Path, dataset: Path | None, replay: Path | None):
    """openenv.verify.verify, whose refusal also names the files it checked (they may be ones found
    beside the summary, not given)."""
    from openenv.verify import VerificationError, verify

    try:
        return verify(summary, dataset_path=dataset, replay_path=replay)
    except VerificationError as exc:
        checked = ", ".join(f"{what} {path}" for what, path in (("dataset", dataset), ("replay", replay)) if path)
        raise CliError(exc.code, f"{exc.message} (checked {checked})" if checked else exc.message,
                       exc.hint) from None


def _verify(args) -> int:

    summary, dataset, replay, notes = artifact_paths(args)
    _print_notes(notes, args.json)
    report = _verified(summary, dataset, replay).report
    if args.json:
        print_json(report)
    else:
        print(f"verified {report['groups']} groups, {report['rollouts']} rollouts, "
              f"{report['environment_exchanges']} environment exchanges")
        print(f"dataset  {report['dataset_sha256']}  {report['dataset_path']}")
        print(f"replay   {report['replay_sha256']}  {report['replay_path']}")
    return 0


def _replay(args) -> int:
    from openenv.client.credentials import credentials_for_urls
    from openenv.replay import replay_async

    summary_path, dataset, replay, notes = artifact_paths(args)
    _print_notes(notes, args.json)
    summary = _verified(summary_path, dataset, replay).summary
    urls = [e["identity"]["base_url"] for e in summary["environments"]]
    credentials = credentials_for_urls(urls, args.credential_env)
    bar, progress = _progress()
    try:
        report = asyncio.run(replay_async(summary_path, dataset_path=dataset, replay_path=replay,
                                          credentials=credentials, concurrency=args.concurrency,
                                          capacity_wait_seconds=args.capacity_wait_seconds, on_progress=progress))
    finally:
        if bar is not None:
            bar.close()
    if args.json:
        print_json(report)
    elif report["outcome"] == "matched":
        print(f"matched: {report['rollouts']} rollouts, {report['environment_exchanges']} exchanges "
              f"({report['environment_prefix_only_rollouts']} replayed as an episode prefix)")
    if report["outcome"] != "matched":
        d = report["divergence"]
        step = "reset" if d["step_index"] is None else f"step {d['step_index']}"
        was = "absent" if d.get("absent") == "expected" else _clean(json.dumps(d["expected"]))[:80]
        now = "absent" if d.get("absent") == "actual" else _clean(json.dumps(d["actual"]))[:80]
        message = f"group {d['group_index']} candidate {d['candidate_index']} {step}: {d['field']} was {was}, now {now}"
        if args.json:
            return 1
        raise CliError("openenv_replay_diverged", message, "the environment's dynamics changed since the collection")
    return 0
