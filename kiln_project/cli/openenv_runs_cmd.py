"""`kiln openenv start|runs|status|artifact|cancel`: persisted OpenEnv runs through the API (reference-spec §1.7).

Thin clients of /v1/openenv/runs (the server collects; these commands only talk to it; `train`'s flags
and request body are openenv_train_request.py's):
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
from kiln_project.cli.openenv_train_request import (
    collection_outputs,
    train_parser,
    train_request,
)
from kiln_project.cli.output import check_output_path, fetch_through_restarts, print_json, print_table

COMMANDS = ("start", "runs", "status", "artifact", "cancel", "train")
MAX_REQUEST_BYTES = 1024 * 1024
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024
TERMINAL = frozenset({"rollout_ready", "completed", "failed", "cancelled"})
POLL_SECONDS = 0.5
TRANSFER_TIMEOUT = 600.0
DOWNLOAD_SCHEMA = "kiln.openenv-artifact-download.v1"
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
    outputs = None if args.no_follow else collection_outputs(args)
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
    # A run can fail after publishing its collection and adapter (the environment dying during the held-out
    # evaluation): its episodes, warnings and adapter are still the user's, then the failure is reported
    try:
        code, ended = _follow(client, status, args), None
    except CliError as error:
        code, ended = 1, error
    final = client.get(_path(status["run_id"]))
    try:
        copies = _download_collection(client, final, outputs)
    except CliError as error:
        if ended is None:
            raise
        copies = [f"warning   the run's collection could not be copied: {error.line()}"]  # the failure stays first
    if not args.json:
        adapter_lines = []
        training = final.get("training") or {}
        if training.get("adapter_name") and _published_adapter(final):
            adapter_lines.append(f"adapter   {training['adapter_name']} (training job {training['job_id']}; receipt: "
                                 f"kiln openenv artifact {final['run_id']} train_receipt --output train_receipt.json)")
            if final["state"] != "completed":  # published before the run failed; auto_load may have made it serve
                how = "was cancelled" if final["state"] == "cancelled" else final["state"]
                adapter_lines.append(f"          it was published before the run {how}; kiln adapters list shows "
                                     "whether it serves")
        for line in [*copies, *_closing_lines(final, adapter_lines)]:
            print(line)
    if ended is not None:
        raise ended
    return code


def _published_adapter(final: dict) -> bool:
    """The run's training published its adapter (a run that failed later, at its held-out evaluation, too)."""
    return final["state"] == "completed" or "adapter_manifest" in {a["kind"] for a in final.get("artifacts") or []}


def add_parsers(sub, common) -> None:
    train_parser(sub, common)
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
    artifact.add_argument("--output", type=Path, required=True, metavar="F",
                          help="the file to write (published once its SHA-256 checks), or - for standard output")
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
    if not args.follow:
        return _show(status, args)
    if not args.json:
        print(f"run {status['run_id']} {status['state']} (sequence {status['admission']['sequence']})")
    final = _follow_to_end(client, status, args)
    if args.json:
        print_json(final)
    elif final["state"] == "completed":  # what `kiln openenv train` says at its end (QA: start ended silent)
        for line in _closing_lines(final):
            print(line)
    return _outcome(final)


def _follow_to_end(client: KilnClient, status: dict, args) -> dict:
    """Print each new progress line (not with --json) until the run ends; its last status."""
    path = _path(status["run_id"])
    last = None
    while True:
        line = progress_line(status)
        if line != last and not args.json:
            print(line, flush=True)
            last = line
        if status["state"] in TERMINAL:
            return status
        time.sleep(POLL_SECONDS)
        status = fetch_through_restarts(lambda: client.get(path))


def _follow(client: KilnClient, status: dict, args) -> int:
    final = _follow_to_end(client, status, args)
    if args.json:
        print_json(final)
    return _outcome(final)


def _closing_lines(final: dict, adapter_lines: list[str] = ()) -> list[str]:
    """A followed run's last words: its warnings, the adapter it published (train's lines) or else why a
    completed run trained nothing, and the held-out evaluation's verdict, or why it never ran."""
    lines = [f"warning   {warning}" for warning in final.get("warnings") or []]
    lines += adapter_lines
    if not adapter_lines and final["state"] == "completed" and final.get("error"):
        lines.append(f"reason    {final['error']}")
    verdict = (final.get("environment_evaluation") or {}).get("verdict") or _environment_eval_skipped(final)
    if verdict:
        lines.append(f"env eval  {verdict}")
    return lines


def _environment_eval_skipped(status: dict) -> str | None:
    """Why a held-out evaluation the request asked for never ran (nothing was trained, so there is no
    candidate); None when it ran, runs, or was not asked for."""
    asked = (status.get("request") or {}).get("environment_eval")
    if asked and not status.get("environment_evaluation") and status["state"] == "completed" \
            and not status.get("training"):
        gate = " and its gate" if isinstance(asked, dict) and asked.get("gate") is not None else ""
        return f"not run{gate}: no training job was created, so there is no candidate adapter to evaluate"
    return None


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
    skipped = _environment_eval_skipped(status)
    if skipped:
        print(f"env eval  {skipped}")
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


def _artifact_to_stdout(client: KilnClient, args) -> int:
    """`--output -`: the artifact on standard output, written only once its bytes are checked (so a
    short or altered transfer writes nothing); the report goes to standard error."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kiln-artifact-") as folder:
        staged = Path(folder) / "artifact"
        source, actual, size = download_artifact(client, args.run_id, args.kind, staged)
        with open(staged, "rb") as fh:
            shutil.copyfileobj(fh, sys.stdout.buffer)
        sys.stdout.buffer.flush()
    print(f"wrote {size} bytes to standard output ({actual}, from {source})", file=sys.stderr)
    return 0


def _artifact(client: KilnClient, args) -> int:
    output = args.output
    if str(output) == "-":  # the usual spelling of standard output (QA: it wrote a file named "-")
        return _artifact_to_stdout(client, args)
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
