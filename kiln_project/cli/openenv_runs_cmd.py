"""`kiln openenv start|runs|status|artifact|cancel`: persisted OpenEnv runs through the API (reference-spec §1.7).

Thin clients of /v1/openenv/runs (the server collects; these commands only talk to it):
- `start --request FILE [--follow]`: POST the JSON body (at most 1 MiB) as it is; an exact retry
  with the same idempotency_key answers the original run (a note on stderr says so: a new attempt
  needs a new key);
- `runs`: the tracked runs, newest first; `status RUN [--follow]`: one run;
- `--follow` polls until the run is terminal and prints its stage, groups and rollouts done, and
  the mean and range of return once published; it exits non-zero when the run failed or was
  cancelled (one line with the failure's code);
- `artifact RUN KIND --output F [--force]`: streams a manifest-bound artifact, checks its bytes and
  SHA-256 against the server's Content-Length and ETag, then publishes F atomically
  (`kiln.openenv-artifact-download.v1` with --json); an existing F needs --force;
- `cancel RUN`: DELETE, the run stops at the next boundary of its phase (in training: the training
  job stops at its next group boundary);
- `train --environment URL --output-adapter NAME [...]`: collect and train in one command: builds
  a kind-train request from the guide's flags (a fresh idempotency key unless given), posts it and
  follows it like `start --follow`, with the trainer's state, progress and loss once training runs,
  then the environment evaluation's side and groups, then the selection warnings, the published
  adapter and the gate's verdict; `--eval-groups/--eval-group-size/--eval-seed-start` add a
  held-out environment evaluation and `--gate` (or a `--gate-min-*` threshold) lets its paired
  sign test own promotion; once the run published its collection, the episodes, replay and summary
  are downloaded (checked by SHA-256) to `--output`, `--replay-output` and `--summary-output`,
  rollout's flags and defaults, so `kiln openenv verify` can audit them offline.
All take `--json`. Errors print one line with the server's stable code and exit non-zero.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from kiln_project.cli.client import CliError, KilnClient, api_path, raise_for_stream_error
from kiln_project.cli.openenv_run_text import (
    failure_lines,
    post_eval_text,
    progress_line,
    stats_lines,
    trainer_text,
)
from kiln_project.cli.output import check_output_path, fetch_through_restarts, print_json, print_table

COMMANDS = ("start", "runs", "status", "artifact", "cancel", "train")
MAX_REQUEST_BYTES = 1024 * 1024
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024
TERMINAL = frozenset({"rollout_ready", "completed", "failed", "cancelled"})
POLL_SECONDS = 0.5
TRANSFER_TIMEOUT = 600.0
DOWNLOAD_SCHEMA = "kiln.openenv-artifact-download.v1"
# artifact kind -> (the `train` flag that names its local copy, its default): rollout's names (spec §1.7)
COLLECTION_OUTPUTS = {"dataset": ("--output", "openenv.rollouts.jsonl"),
                      "replay": ("--replay-output", "openenv.replay.json"),
                      "summary": ("--summary-output", "openenv.rollout-summary.json")}


def _train_parser(sub, common) -> None:
    from kiln_project.cli.openenv_cmd import collection_args
    from kiln_project.cli.rollout_cmd import parse_bool, positive_int

    p = sub.add_parser("train", parents=[common], help="collect OpenEnv episodes, then train a LoRA with GRPO",
                       description="Submit a persisted kind-train run (POST /v1/openenv/runs): the server "
                                   "preflights and seals the training contract, collects, selects, trains with "
                                   "native GRPO and publishes the adapter; this command follows it.")
    p.add_argument("target", nargs="?", metavar="URL", help="environment URL (or use --environment)")
    p.add_argument("--environment", action="append", default=[], metavar="URL", help="environment URL (repeat)")
    credentials = p.add_mutually_exclusive_group()
    credentials.add_argument("--credential-id", action="append", default=[], metavar="ID|-",
                             help="the server's credential handle for the aligned --environment; - = public")
    credentials.add_argument("--credential-env", action="append", default=[], metavar="VAR|-",
                             help="as on rollout, for the aligned --environment (- = public): the server "
                                  "collects, so this names its [openenv.credentials] entry with "
                                  "bearer_token_env = VAR for that URL's origin")
    p.add_argument("--adapter", default="base", help="behavior adapter (base, none or null: the base model)")
    p.add_argument("--output-adapter", required=True, help="the name of the LoRA to train (a new revision)")
    collection_args(p)  # the flags `kiln openenv rollout` takes too
    p.add_argument("--lora-rank", type=positive_int, default=None, help="LoRA rank (default: the trainer's)")
    p.add_argument("--training-config", type=Path, metavar="FILE", help="GRPO overrides (a GrpoConfig JSON object)")
    p.add_argument("--post-eval-suite", metavar="SUITE", help="prove it after training: an installed eval suite")
    p.add_argument("--post-eval-min-accuracy", type=float, default=None, metavar="X",
                   help="with --post-eval-suite: the held-out accuracy gate in [0, 1], which then owns promotion "
                        "(not with --gate)")
    p.add_argument("--post-eval-scope", choices=("held-out", "train-set-eval"), default=None,
                   help="with --post-eval-suite: the suite's data_scope (default held-out; train-set-eval takes "
                        "no gate)")
    evaluation = p.add_argument_group("environment evaluation (held-out seeds, after training)")
    evaluation.add_argument("--eval-groups", type=positive_int, default=None, metavar="N",
                            help="evaluate baseline and candidate on N seed groups (default 20 when any eval flag)")
    evaluation.add_argument("--eval-group-size", type=positive_int, default=None, metavar="N", help="default 1")
    evaluation.add_argument("--eval-seed-start", type=int, default=None, metavar="N",
                            help="default: right after the training seeds (they must not overlap)")
    evaluation.add_argument("--gate", action="store_true",
                            help="let the paired sign test own promotion (needs at least 20 groups)")
    evaluation.add_argument("--gate-min-mean-improvement", type=float, default=None, metavar="X",
                            help="the gate's least mean return improvement (implies --gate; default 0)")
    evaluation.add_argument("--gate-min-mean-return", type=float, default=None, metavar="X",
                            help="the gate's least candidate mean return (implies --gate)")
    p.add_argument("--auto-load", type=parse_bool, default=True, metavar="BOOL", help="default true")
    p.add_argument("--idempotency-key", help="a non-secret retry key (default: a fresh one per invocation)")
    p.add_argument("--no-follow", action="store_true", help="submit and print the run, without waiting")
    copies = p.add_argument_group("the collected episodes, downloaded once published (as `kiln openenv rollout` "
                                  "writes them; not with --no-follow)")
    for flag, default in COLLECTION_OUTPUTS.values():
        copies.add_argument(flag, type=Path, default=Path(default), metavar="F", help=f"default {default}")


def handles_for_variables(urls: list[str], variables: list[str], table: dict) -> list[str | None]:
    """`--credential-env VAR|-` per URL -> the server's credential handles. A train run collects on the
    server, which reads tokens from its own environment and never receives one from a client, so
    VAR names the server entry (`[openenv.credentials.<id>]`, from GET /v1/config) whose
    bearer_token_env is VAR and whose origin is the URL's; `-` is a public slot."""
    from openenv.client.errors import OpenEnvError
    from openenv.client.urls import as_endpoint

    if len(variables) != len(urls):
        raise CliError("openenv_credential_invalid", f"{len(variables)} --credential-env for {len(urls)} "
                       "environment URLs", "repeat --credential-env once per --environment, using - for a public one")
    handles: list[str | None] = []
    for url, variable in zip(urls, variables, strict=True):
        if variable == "-":
            handles.append(None)
            continue
        try:
            origin = as_endpoint(url).origin
        except OpenEnvError as exc:
            raise CliError(exc.code, exc.message, exc.hint) from None
        matches = sorted(handle for handle, entry in table.items()
                         if entry.get("bearer_token_env") == variable and entry.get("origin") == origin)
        if not matches:
            raise CliError("openenv_credential_not_found",
                           f"the Kiln server has no credential reading ${variable} for {origin}",
                           "the server collects train runs with tokens from its own environment: add "
                           f"[openenv.credentials.<id>] origin = \"{origin}\", bearer_token_env = \"{variable}\" to "
                           "its kiln.toml, export the variable where it runs and restart it, or pass --credential-id ID")
        handles.append(matches[0])
    return handles


def train_request(args, credential_table: dict | None = None) -> dict:
    """The kind-train OpenEnvRunRequest the flags describe (`credential_table`: the server's
    `openenv_credentials`, needed only for --credential-env)."""
    import uuid

    from kiln_project.cli.openenv_cmd import _reset_file

    urls = ([args.target] if args.target else []) + list(args.environment)
    if not urls:
        raise CliError("openenv_invalid_url", "give an environment URL", "kiln openenv train --environment URL ...")
    if args.reset_options is not None and args.environment_reset_options:
        raise CliError("openenv_invalid_request", "give --reset-options or --environment-reset-options, not both")
    body = {"kind": "train", "idempotency_key": args.idempotency_key or f"cli:{uuid.uuid4()}",
            "environment_urls": urls, "adapter": args.adapter, "output_adapter": args.output_adapter,
            "groups": args.groups, "group_size": args.group_size, "seed_start": args.seed_start,
            "max_steps": args.max_steps, "concurrency": args.concurrency, "max_action_tokens": args.max_action_tokens,
            "temperature": args.temperature, "thinking": args.thinking,
            "protocol_error_reward": args.protocol_error_reward, "max_recoverable_errors": args.max_recoverable_errors,
            "capacity_wait_seconds": args.capacity_wait_seconds, "auto_load": args.auto_load}
    if args.credential_id:
        body["credential_ids"] = [None if handle == "-" else handle for handle in args.credential_id]
    elif args.credential_env:
        body["credential_ids"] = handles_for_variables(urls, args.credential_env, credential_table or {})
    if args.thinking_budget_tokens is not None:
        body["thinking_budget_tokens"] = args.thinking_budget_tokens
    if args.reset_options is not None:
        body["reset_options"] = _reset_file(args.reset_options)
    if args.environment_reset_options:
        body["environment_reset_options"] = [None if item == "-" else _reset_file(Path(item))
                                             for item in args.environment_reset_options]
    config = {}
    if args.training_config is not None:
        try:
            config = json.loads(args.training_config.read_bytes())
        except (OSError, ValueError) as exc:
            raise CliError("training_invalid_request", f"cannot read {args.training_config}: {exc}") from None
        if not isinstance(config, dict):
            raise CliError("training_invalid_request", f"{args.training_config} must hold one JSON object")
    if args.lora_rank is not None:
        config["lora_rank"] = args.lora_rank
        config.setdefault("lora_alpha", 2 * args.lora_rank)  # as kiln train grpo: keep alpha/rank at 2
    if config:
        body["training_config"] = config
    post_eval = {"min_accuracy": args.post_eval_min_accuracy, "data_scope": args.post_eval_scope}
    if args.post_eval_suite:
        body["post_eval"] = {"suite": args.post_eval_suite,
                             **{key: value for key, value in post_eval.items() if value is not None}}
    elif any(value is not None for value in post_eval.values()):
        raise CliError("training_invalid_request", "--post-eval-min-accuracy and --post-eval-scope need "
                       "--post-eval-suite SUITE")
    evaluation = _environment_eval(args)
    if evaluation is not None:
        body["environment_eval"] = evaluation
    return body


def _environment_eval(args) -> dict | None:
    """The request's `environment_eval` from the eval flags (None when none is given)."""
    gate = {}
    if args.gate_min_mean_improvement is not None:
        gate["min_mean_improvement"] = args.gate_min_mean_improvement
    if args.gate_min_mean_return is not None:
        gate["min_mean_return"] = args.gate_min_mean_return
    given = (args.eval_groups, args.eval_group_size, args.eval_seed_start)
    if not args.gate and not gate and all(value is None for value in given):
        return None
    evaluation = {"groups": args.eval_groups or 20, "group_size": args.eval_group_size or 1}
    if args.eval_seed_start is not None:
        evaluation["seed_start"] = args.eval_seed_start
    if args.gate or gate:
        evaluation["gate"] = gate
    return evaluation


def _collection_outputs(args) -> dict[str, Path]:
    """artifact kind -> the local path of its copy; checked before the run is submitted, so a FIFO or
    device (or one path given twice) fails before any episode is spent."""
    outputs = {kind: getattr(args, flag[2:].replace("-", "_")) for kind, (flag, _) in COLLECTION_OUTPUTS.items()}
    if len({path.resolve() for path in outputs.values()}) != len(outputs):
        raise CliError("openenv_invalid_request", "--output, --replay-output and --summary-output must be "
                       "three different files")
    for path in outputs.values():
        check_output_path(path)
    return outputs


def _download_collection(client: KilnClient, final: dict, outputs: dict[str, Path]) -> list[str]:
    """Copy the run's published dataset, replay and summary to the train command's output paths (each
    checked against its SHA-256 and published atomically); nothing when the run published none
    (it failed or was cancelled before its collection was published). Returns the lines to print."""
    published = {artifact["kind"] for artifact in final.get("artifacts") or []}
    if not set(outputs) <= published:
        return []
    written = {kind: download_artifact(client, final["run_id"], kind, path)[1] for kind, path in outputs.items()}
    lines = [f"{label:<9} {outputs[kind]} ({written[kind]})"
             for kind, label in (("dataset", "episodes"), ("replay", "replay"), ("summary", "summary"))]
    lines.append(f"verify    kiln openenv verify --summary {outputs['summary']} --dataset {outputs['dataset']} "
                 f"--replay {outputs['replay']}")
    return lines


def _train(client: KilnClient, args) -> int:
    outputs = None if args.no_follow else _collection_outputs(args)
    table = client.get("/v1/config")["config"].get("openenv_credentials") or {} if args.credential_env else None
    status, created = post_run(client, train_request(args, table))
    if not created:
        print(f"kiln: note: {retained_note(status)}", file=sys.stderr, flush=True)
    if args.no_follow:
        return _show(status, args)
    if not args.json:
        contract = status.get("training_contract") or {}
        config = contract.get("effective_config") or {}
        policy = contract.get("behavior_policy") or {}
        print(f"run {status['run_id']} {status['state']} (sequence {status['admission']['sequence']})")
        print(f"contract  {status.get('training_contract_sha256')}: rank {config.get('lora_rank')}, "
              f"{(config.get('optimizer') or {}).get('kind')}, output {config.get('output_name')}, "
              f"auto_load {str(config.get('auto_load')).lower()}, policy {policy.get('served_model_id')}"
              + (f"+{policy['adapter']['name']}" if policy.get("adapter") else ""))
    # QA: a run that failed after publishing its collection (the environment died during the held-out
    # evaluation) printed only the failure: its episodes, warnings and published adapter stay the user's
    try:
        code, ended = _follow(client, status, args), None
    except CliError as error:
        code, ended = 1, error
    final = client.get(_path(status["run_id"]))
    copies = _download_collection(client, final, outputs)
    if not args.json:
        for line in copies:
            print(line)
        for warning in final.get("warnings") or []:
            print(f"warning   {warning}")
        training = final.get("training") or {}
        if training.get("adapter_name") and _published_adapter(final):
            print(f"adapter   {training['adapter_name']} (training job {training['job_id']}; receipt: kiln openenv "
                  f"artifact {final['run_id']} train_receipt --output train_receipt.json)")
        elif final["state"] == "completed" and final.get("error"):
            print(f"reason    {final['error']}")
        verdict = (final.get("environment_evaluation") or {}).get("verdict")
        if verdict:
            print(f"env eval  {verdict}")
    if ended is not None:
        raise ended
    return code


def _published_adapter(final: dict) -> bool:
    """The run's training published its adapter (a run that failed later, at its held-out evaluation, too)."""
    return final["state"] == "completed" or "adapter_manifest" in {a["kind"] for a in final.get("artifacts") or []}


def add_parsers(sub, common) -> None:
    _train_parser(sub, common)
    start = sub.add_parser("start", parents=[common], help="submit a persisted OpenEnv run (POST /v1/openenv/runs)")
    start.add_argument("--request", type=Path, required=True, metavar="FILE", help="the JSON request body (≤ 1 MiB)")
    start.add_argument("--follow", action="store_true", help="wait for a terminal state, printing progress")
    sub.add_parser("runs", parents=[common], help="the server's OpenEnv runs, newest first")
    status = sub.add_parser("status", parents=[common], help="one OpenEnv run's status")
    status.add_argument("run_id", metavar="RUN")
    status.add_argument("--follow", action="store_true", help="wait for a terminal state, printing progress")
    artifact = sub.add_parser("artifact", parents=[common], help="download a run's artifact, checked by SHA-256")
    artifact.add_argument("run_id", metavar="RUN")
    artifact.add_argument("kind", metavar="KIND",
                          help="dataset, replay, summary; train_receipt, adapter_manifest; an environment eval's "
                               "environment_eval_{baseline,candidate}_{dataset,replay,summary} and "
                               "environment_eval_receipt (`kiln openenv status RUN` lists a run's)")
    artifact.add_argument("--output", type=Path, required=True, metavar="F")
    artifact.add_argument("--force", action="store_true", help="replace an existing output file")
    cancel = sub.add_parser("cancel", parents=[common], help="cancel a run at the next boundary of its phase")
    cancel.add_argument("run_id", metavar="RUN")


def run(args) -> int:
    client = KilnClient(args.url)
    command = args.openenv_command
    if command == "start":
        return _start(client, args)
    if command == "runs":
        return _runs(client, args)
    if command == "status":
        status = client.get(_path(args.run_id))
        return _follow(client, status, args) if args.follow else _show(status, args)
    if command == "artifact":
        return _artifact(client, args)
    if command == "train":
        return _train(client, args)
    return _show(client.delete(_path(args.run_id)), args)


def _path(run_id: str) -> str:
    if not run_id or "/" in run_id or len(run_id) > 64:
        raise CliError("openenv_run_not_found", f"{run_id[:64]!r} is not a run id", "list runs: kiln openenv runs")
    return api_path("/v1/openenv/runs", run_id)


def post_run(client: KilnClient, body: dict) -> tuple[dict, bool]:
    """POST /v1/openenv/runs; (the status, whether it created a run: 202 new, 200 the run that the
    request's idempotency_key already names)."""
    status, code = client.post("/v1/openenv/runs", json=body, with_status=True)
    return status, code == 202


def retained_note(status: dict) -> str:
    """What to say when the POST answered the run its idempotency key already names."""
    run_id, state, key = status["run_id"], status["state"], status.get("idempotency_key")
    failure = status.get("failure") or {}
    how = f"{state}: {failure['code']} at {failure['stage']}" if failure else state
    tail = ("a new attempt needs a new idempotency_key" if state in TERMINAL
            else f"it is still running; follow it with kiln openenv status {run_id} --follow")
    return (f"idempotency key {key!r} already names run {run_id} ({how}); this is that original run, not a "
            f"new one: {tail}")


def _start(client: KilnClient, args) -> int:
    from kiln_project.cli.openenv_cmd import json_object_file

    body = json_object_file(args.request, "openenv_invalid_request", MAX_REQUEST_BYTES)
    status, created = post_run(client, body)
    if not created:  # stderr: --json keeps stdout one JSON document
        print(f"kiln: note: {retained_note(status)}", file=sys.stderr, flush=True)
    if args.follow:
        if not args.json:
            print(f"run {status['run_id']} {status['state']} (sequence {status['admission']['sequence']})")
        return _follow(client, status, args)
    return _show(status, args)


def _follow(client: KilnClient, status: dict, args) -> int:
    path = _path(status["run_id"])
    last = None
    while True:
        line = progress_line(status)
        if line != last and not args.json:
            print(line, flush=True)
            last = line
        if status["state"] in TERMINAL:
            break
        time.sleep(POLL_SECONDS)
        status = fetch_through_restarts(lambda: client.get(path))
    if args.json:
        print_json(status)
    return _outcome(status)


def _outcome(status: dict) -> int:
    failure = status.get("failure")
    if status["state"] == "failed":
        code = failure["code"] if failure else "openenv_run_failed"
        raise CliError(code, f"run {status['run_id']} failed at {status.get('stage')}: "
                       f"{(failure or {}).get('message') or status.get('error', '')}", (failure or {}).get("hint", ""))
    if status["state"] == "cancelled":
        raise CliError("openenv_run_cancelled", f"run {status['run_id']} was cancelled: {status.get('error', '')}")
    return 0


def _show(status: dict, args) -> int:
    if args.json:
        print_json(status)
        return 0
    print(f"run       {status['run_id']}  ({status['kind']}, sequence {status['admission']['sequence']})")
    print(f"state     {progress_line(status)}")
    if status.get("cancel_requested") and status["state"] not in TERMINAL:
        print("cancel    requested: stops at the next boundary of its phase")
    stats = status.get("rollout_stats")
    if stats:
        returns, episodes = stats_lines(stats)
        print(f"return    {returns}")
        print(f"outcomes  {episodes}")
    if status.get("training_contract_sha256"):
        print(f"contract  {status['training_contract_sha256']}")
    if status.get("training"):
        training = status["training"]
        print(f"training  job {training['job_id']} → {training.get('adapter_name')}: {training['state']}"
              f"{trainer_text(status).split(training['state'], 1)[-1]}")
    for evaluation in status.get("post_evaluations") or []:
        print(f"post-eval {post_eval_text(evaluation)}")
    for warning in status.get("warnings") or []:
        print(f"warning   {warning}")
    artifacts = status.get("artifacts") or []
    width = max((len(artifact["kind"]) for artifact in artifacts), default=0)  # one column for every kind
    for artifact in artifacts:
        print(f"artifact  {artifact['kind']:<{width}} {artifact['bytes']:>10} B  {artifact['sha256']}")
    if status.get("failure"):
        for line in failure_lines(status["failure"]):
            print(line)
    elif status.get("error"):
        print(f"reason    {status['error']}")
    return 0


def _runs(client: KilnClient, args) -> int:
    listing = client.get("/v1/openenv/runs")
    if args.json:
        print_json(listing)
        return 0
    rows = []
    for status in listing["runs"]:
        p = status.get("progress") or {}
        stats = status.get("rollout_stats") or {}
        rows.append({"run": status["run_id"], "kind": status["kind"], "state": status["state"],
                     "seq": status["admission"]["sequence"],
                     "rollouts": f"{p.get('rollouts_completed', 0)}/{p.get('rollouts_total', 0)}",
                     "mean_return": "" if "mean_episode_return" not in stats else
                     f"{stats['mean_episode_return']:.4g}"})
    print_table(rows, ["run", "kind", "state", "seq", "rollouts", "mean_return"])
    return 0


def download_artifact(client: KilnClient, run_id: str, kind: str, output: Path) -> tuple[str, str, int]:
    """Stream one of a run's artifacts to `output`, check its bytes and SHA-256 against the server's
    Content-Length and ETag, then publish it atomically (a failed or short transfer leaves `output`
    as it was). Returns (the source route, the sha256, the bytes)."""
    import httpx

    check_output_path(output)
    source = f"{_path(run_id)}/artifacts/{kind}"
    partial = output.with_name(f".{output.name}.part")
    digest, size = hashlib.sha256(), 0
    try:
        with client._http.stream("GET", source, timeout=TRANSFER_TIMEOUT) as response:
            raise_for_stream_error(response)
            expected = response.headers.get("etag", "").strip('"')
            length = int(response.headers.get("content-length", "-1"))
            with open(partial, "wb") as fh:
                for chunk in response.iter_bytes():
                    size += len(chunk)
                    if size > MAX_ARTIFACT_BYTES:
                        raise CliError("openenv_artifact_integrity_failed", f"more than {MAX_ARTIFACT_BYTES} bytes")
                    digest.update(chunk)
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
        actual = "sha256:" + digest.hexdigest()
        if actual != expected or size != length:
            raise CliError("openenv_artifact_integrity_failed",
                           f"received {size} bytes hashing to {actual}; the server announced {length} bytes, {expected}")
        os.replace(partial, output)
    except httpx.TransportError as exc:
        raise CliError("connection_failed", f"cannot reach Kiln at {client.url}: {exc}",
                       "is `kiln serve` running? pass --url or set KILN_URL") from None
    finally:
        partial.unlink(missing_ok=True)
    return source, actual, size


def _artifact(client: KilnClient, args) -> int:
    output = args.output
    check_output_path(output)  # a folder or a device is refused as such, before --force is suggested
    if (output.exists() or output.is_symlink()) and not args.force:
        raise CliError("openenv_artifact_output_exists", f"{output} exists", "pass --force to replace it")
    source, actual, size = download_artifact(client, args.run_id, args.kind, output)
    report = {"schema": DOWNLOAD_SCHEMA, "run_id": args.run_id, "kind": args.kind, "source_url": source,
              "output_path": str(output.resolve()), "sha256": actual, "bytes": size}
    if args.json:
        print_json(report)
    else:
        print(f"wrote {size} bytes to {output} ({actual})", file=sys.stdout)
    return 0
