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
from kiln_project.cli.output import check_output_path, print_json

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def add_parser(subparsers, common) -> None:
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
    replay.add_argument("--capacity-wait-seconds", type=_finite_float, default=300.0)
    openenv_runs_cmd.add_parsers(sub, common)  # start, runs, status, artifact, cancel: the server's runs
    openenv.set_defaults(handler=run)


def _finite_float(value: str) -> float:
    """A float option that refuses nan and inf at parsing: a bound check (`not low <= x <= high`) lets nan
    through to the collector, whose refusal then reads as a fault of the environment."""
    import argparse
    import math

    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return number


def _positive(value: str) -> int:
    from kiln_project.cli.rollout_cmd import positive_int

    return positive_int(value)


def collection_args(parser) -> None:
    """The collection flags `rollout` (here, collected locally) and `train` (openenv_runs_cmd.py, collected
    by the server) share: groups and seeds, reset options, episode limits, sampling, error handling."""
    from kiln_project.cli.rollout_cmd import parse_bool, parse_budget, positive_int

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
    parser.add_argument("--temperature", type=_finite_float, default=1.0)
    parser.add_argument("--thinking", type=parse_bool, default=True, metavar="BOOL", help="default true")
    parser.add_argument("--thinking-budget-tokens", type=parse_budget, default=None, metavar="N|unlimited")
    parser.add_argument("--protocol-error-reward", type=_finite_float, default=-1.0)
    parser.add_argument("--max-recoverable-errors", type=int, default=3)
    parser.add_argument("--capacity-wait-seconds", type=_finite_float, default=300.0)


def _rollout_args(sub, common) -> None:
    p = sub.add_parser("rollout", parents=[common], help="collect seed-matched OpenEnv episodes with Kiln's model",
                       description="Collect groups x candidates of stateful episodes and publish canonical "
                                   "AgenticGroup JSONL, the replay transcript and the summary together.")
    _environment_args(p)
    p.add_argument("--adapter", default="base", help="behavior adapter (base, none or null: the base model)")
    collection_args(p)
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


class _Tally:
    """Counts finished episodes and complete groups from the collector's progress callback (labels
    `group G candidate C`), passing each call on to the progress bar, if any."""

    _LABEL = re.compile(r"^group (\d+) candidate \d+$")

    def __init__(self, groups: int, group_size: int, forward=None):
        self.groups, self.group_size, self.forward = groups, group_size, forward
        self.episodes, self.total = 0, groups * group_size
        self.per_group: dict[int, int] = {}

    def __call__(self, done: int, total: int, label: str) -> None:
        self.episodes, self.total = done, total
        match = self._LABEL.match(label)
        if match:
            group = int(match.group(1))
            self.per_group[group] = self.per_group.get(group, 0) + 1
        if self.forward is not None:
            self.forward(done, total, label)

    @property
    def complete_groups(self) -> int:
        return sum(1 for count in self.per_group.values() if count >= self.group_size)


def _interrupted(exc, tally: _Tally) -> CliError:
    """A collection failure as one line that also says how far the collection got and that nothing was
    written (publication writes the three files together or none): the client error alone, e.g.
    `GET /health failed: ConnectError`, does not say that the run stopped, nor what became of the files."""
    stage = getattr(exc, "stage", None)
    if stage not in ("collection", "identity_verification") or "nothing was published" in exc.message:
        return _cli_error(exc)  # before any episode, at publication, or an identity change: the message says enough
    if stage == "collection":
        where = (f"the collection was interrupted after {tally.episodes} of {tally.total} episodes "
                 f"({tally.complete_groups} of {tally.groups} groups complete)")
    else:
        where = f"the final check of the environment failed after all {tally.total} episodes"
    hint = "; ".join(part for part in ((exc.hint or "").rstrip(".; "), "then run kiln openenv rollout again") if part)
    return CliError(exc.code, f"{exc.message}; {where}; no files were written", hint)


def _rollout(args) -> int:
    from kiln_project.cli.client import KilnClient
    from kiln_project.cli.rollout_cmd import REQUEST_TIMEOUT_S
    from openenv.client import OpenEnvError, credentials_for_urls, normalize_url
    from openenv.collector import ChatCompletionPolicy, CollectionConfig, collect_and_publish
    from openenv.collector.config import adapter_name
    from openenv.collector.diagnosis import invalid_action_warning

    urls = [normalize_url(url).base_url for url in _urls(args)]
    if args.reset_options is not None and args.environment_reset_options:
        raise CliError("openenv_invalid_collection", "give --reset-options or --environment-reset-options, not both")
    per_environment = None
    if args.environment_reset_options:
        per_environment = [None if item == "-" else _reset_file(Path(item)) for item in args.environment_reset_options]
    client = KilnClient(args.url, timeout=REQUEST_TIMEOUT_S)
    config = CollectionConfig(
        environment_urls=urls, credentials=credentials_for_urls(urls, args.credential_env), kiln_url=client.url,
        adapter=args.adapter, groups=args.groups, group_size=args.group_size, seed_start=args.seed_start,
        max_steps=args.max_steps, concurrency=args.concurrency, max_action_tokens=args.max_action_tokens,
        temperature=args.temperature, thinking=args.thinking, thinking_budget_tokens=args.thinking_budget_tokens,
        protocol_error_reward=args.protocol_error_reward, max_recoverable_errors=args.max_recoverable_errors,
        capacity_wait_seconds=args.capacity_wait_seconds,
        reset_options=_reset_file(args.reset_options) if args.reset_options is not None else None,
        environment_reset_options=per_environment, output_path=args.output, replay_output_path=args.replay_output,
        summary_output_path=args.summary_output).check()
    for path in (config.output_path, config.replay_output_path, config.summary_output_path):
        check_output_path(path)  # before any episode: a device, FIFO or missing folder is refused
    policy = ChatCompletionPolicy(_kiln_post(client), adapter=adapter_name(args.adapter))
    bar, progress = _progress()
    tally = _Tally(config.groups, config.group_size, progress)
    try:
        bundle = asyncio.run(collect_and_publish(config, policy, on_progress=tally))
    except OpenEnvError as exc:
        raise _interrupted(exc, tally) from None
    finally:
        if bar is not None:
            bar.close()
    summary = bundle.summary_value
    stats = summary["stats"]
    warning = invalid_action_warning([json.loads(line) for line in bundle.dataset.splitlines() if line.strip()])
    if args.json:
        print_json({"output": summary["output_path"], "replay_output": summary["replay_output_path"],
                    "summary_output": summary["summary_output_path"], "dataset_sha256": summary["dataset_sha256"],
                    "stats": stats, "warnings": [warning] if warning else []})
        return 0
    print(f"wrote {summary['groups']} groups ({summary['rollout_count']} rollouts) to {summary['output_path']}")
    print(f"replay: {summary['replay_output_path']}")
    print(f"summary: {summary['summary_output_path']}")
    returns, episodes = openenv_run_text.stats_lines(stats)
    print(f"return {returns}; {episodes}")
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def _summary_path(args) -> Path:
    path = args.summary or (Path(args.summary_file) if args.summary_file else None)
    if path is None:
        raise CliError("openenv_verification_failed", "give the rollout summary", "kiln openenv verify --summary FILE")
    if not path.is_file():
        raise CliError("file_not_found", f"the summary {path} does not exist" if not path.exists()
                       else f"the summary {path} is not a file",
                       "give the rollout summary JSON the collection wrote (e.g. openenv.rollout-summary.json)")
    return path


# What a summary may be called, and what `kiln openenv rollout|train|artifact` call the other two files beside
# it (COLLECTION_OUTPUTS: openenv.rollouts.jsonl, openenv.replay.json, openenv.rollout-summary.json; the
# README's math-r001.rollouts.jsonl beside math-r001.summary.json).
SUMMARY_SUFFIXES = (".rollout-summary.json", ".summary.json", ".json")
DOWNLOAD_SUFFIXES = {"dataset": ".rollouts.jsonl", "replay": ".replay.json"}


def _stem(summary: Path) -> str | None:
    for suffix in SUMMARY_SUFFIXES:
        if summary.name.endswith(suffix) and len(summary.name) > len(suffix):
            return summary.name[: -len(suffix)]
    return None


def _given(path: Path | None, what: str) -> Path | None:
    if path is not None and not path.is_file():
        raise CliError("file_not_found", f"the {what} {path} does not exist" if not path.exists()
                       else f"the {what} {path} is not a file", f"give the collection's {what} file")
    return path


def _beside(summary: Path, stored, what: str, flag: str) -> tuple[Path | None, str | None]:
    """The summary's `what` file to check, and a note when it is not a file beside the summary:
    1. `<stem>.rollouts.jsonl` / `<stem>.replay.json` beside `<stem>.rollout-summary.json` (or
       `<stem>.summary.json`): the names downloads and collections give the three files;
    2. its recorded file name beside the summary (an archived copy of the three, as the README says);
    3. else the recorded path itself (the collecting machine's or the server's copy), said plainly."""
    if not isinstance(stored, str) or not stored:
        return None, None  # verify names the summary's broken field
    recorded = Path(stored)
    stem = _stem(summary)
    if stem is not None:  # the summary's own stem is the more specific match: it wins over a stray file
        download = summary.parent / (stem + DOWNLOAD_SUFFIXES[what])
        if download.is_file():
            return download, None
    neighbour = summary.parent / recorded.name
    if neighbour.is_file():
        return neighbour, None
    if recorded.is_file():
        whose = "the server's copy" if "/.openenv/runs/" in recorded.as_posix() else "the copy"
        return recorded, (f"checked {whose} of the {what} at its recorded path {recorded}, not a file beside the "
                          f"summary (pass {flag} FILE to check your own)")
    expected = recorded.name if stem is None else f"{recorded.name} or {stem}{DOWNLOAD_SUFFIXES[what]}"
    raise CliError("file_not_found", f"the summary's {what} is neither beside {summary} ({expected}) nor at its "
                   f"recorded path {recorded}", f"pass {flag} FILE")


def _artifact_paths(args) -> tuple[Path, Path | None, Path | None, list[str]]:
    """(summary, dataset, replay, notes) for verify and replay: the files given, else those beside the summary."""
    summary = _summary_path(args)
    dataset, replay = _given(args.dataset, "dataset"), _given(args.replay, "replay")
    notes = []
    if dataset is None or replay is None:
        try:
            recorded = json.loads(summary.read_bytes())
        except (OSError, ValueError):
            recorded = None  # verify reports what is wrong with the summary
        if isinstance(recorded, dict):
            for what, key, flag in (("dataset", "output_path", "--dataset"), ("replay", "replay_output_path", "--replay")):
                if (dataset if what == "dataset" else replay) is not None:
                    continue
                path, note = _beside(summary, recorded.get(key), what, flag)
                if what == "dataset":
                    dataset = path
                else:
                    replay = path
                if note:
                    notes.append(note)
    return summary, dataset, replay, notes


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

    summary, dataset, replay, notes = _artifact_paths(args)
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

    summary_path, dataset, replay, notes = _artifact_paths(args)
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
        message = (f"group {d['group_index']} candidate {d['candidate_index']} {step}: {d['field']} was "
                   f"{_clean(json.dumps(d['expected']))[:80]}, now {_clean(json.dumps(d['actual']))[:80]}")
        if args.json:
            return 1
        raise CliError("openenv_replay_diverged", message, "the environment's dynamics changed since the collection")
    return 0
