"""`kiln eval datasets ...`, `kiln eval suites ...` and the eval jobs: `kiln eval run|compare|status|
rerun|replay`.

A thin client of /v1/eval/* (reference-spec §1.3, §1.4): it reads local files and sends them; the
server validates. Errors print one line and exit non-zero. `--follow` polls /v1/jobs/{id} with a
progress bar (a line per change when not on a terminal), then prints the eval result; it exits
non-zero when the job fails or is cancelled, and a replay also when it does not answer `matched`.
Imports no Django and no torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kiln_project.cli.client import CliError, KilnClient, api_path, job_id_arg
from kiln_project.cli.output import TERMINAL_STATES, follow, print_json, print_table

PARTITIONS = ("train", "validation", "holdout")
FORMATS = ("grpo_groups", "sft_chat", "raw")


def _json_object(value: str) -> dict:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc.msg})") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError('expected a JSON object such as {"type": "exact"}')
    return parsed


def parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes", "on"):
        return True
    if lowered in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def _percent(value: str) -> float | int:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    return int(number) if number.is_integer() else number


def add_parser(subparsers, common) -> None:
    evaluate = subparsers.add_parser("eval", help="evaluation datasets, suites and eval jobs")
    sub = evaluate.add_subparsers(dest="eval_command", required=True)

    datasets = sub.add_parser("datasets", help="datasets with deterministic train/validation/holdout splits")
    dsub = datasets.add_subparsers(dest="datasets_command", required=True)
    upload = dsub.add_parser("upload", parents=[common], help="upload a JSONL file as a named dataset")
    upload.add_argument("name")
    upload.add_argument("file", type=Path)
    upload.add_argument("--format", required=True, choices=FORMATS)
    upload.add_argument("--description", default="")
    dsub.add_parser("list", parents=[common], help="datasets with their split counts")
    show = dsub.add_parser("show", parents=[common], help="one dataset's manifest")
    show.add_argument("name")
    delete = dsub.add_parser("delete", parents=[common], help="delete a dataset")
    delete.add_argument("name")
    split = dsub.add_parser("split", parents=[common],
                            help="show the split, or re-split with --seed/--train-percent/--validation-percent")
    split.add_argument("name")
    split.add_argument("--seed", help="decimal u64 seed")
    split.add_argument("--train-percent", type=_percent)
    split.add_argument("--validation-percent", type=_percent)
    split.add_argument("--preview", action="store_true", help="print the counts the new split would give; write nothing")
    synth = dsub.add_parser("synthesize", parents=[common], help="create an eval suite from one partition")
    synth.add_argument("name")
    synth.add_argument("--suite", required=True, help="the new suite's name")
    synth.add_argument("--source-split", choices=PARTITIONS, default="holdout")
    synth.add_argument("--strategy", help="reference | best_completion (grpo_groups), last_assistant (sft_chat), "
                                          "fields (raw); default: the format's first")
    synth.add_argument("--scorer", type=_json_object, help='scorer spec as JSON (default {"type": "exact"})')
    synth.add_argument("--head-n", type=int, help="only the first N rows of the partition")
    synth.add_argument("--force", action="store_true", help="replace a suite of the same name")

    suites = sub.add_parser("suites", help="eval suites")
    ssub = suites.add_subparsers(dest="suites_command", required=True)
    create = ssub.add_parser("create", parents=[common], help="register a suite from a JSON file")
    create.add_argument("file", type=Path)
    create.add_argument("--force", action="store_true", help="replace a suite of the same name")
    ssub.add_parser("list", parents=[common], help="registered suites")
    sshow = ssub.add_parser("show", parents=[common], help="one suite with its examples")
    sshow.add_argument("name")
    sdelete = ssub.add_parser("delete", parents=[common], help="delete a suite")
    sdelete.add_argument("name")
    _add_job_parsers(sub, common)
    evaluate.set_defaults(handler=run)


def _generation_flags(parser) -> None:
    parser.add_argument("--temperature", type=float, help="default 0")
    parser.add_argument("--max-tokens", type=int, help="default 256")
    parser.add_argument("--top-p", type=float, help="default 1")
    parser.add_argument("--seed", help="decimal u64 (default: derived from the suite hash)")
    parser.add_argument("--thinking", type=parse_bool, metavar="BOOL", help="enable thinking (default false)")
    parser.add_argument("--follow", action="store_true", help="wait for the job, showing progress")


def _add_job_parsers(sub, common) -> None:
    run_p = sub.add_parser("run", parents=[common], help="evaluate a suite against the base model or one adapter")
    suite = run_p.add_mutually_exclusive_group(required=True)
    suite.add_argument("--suite", help="a registered suite's name")
    suite.add_argument("--suite-file", type=Path, help="an inline suite (a kiln.eval-suite.v1 JSON file)")
    run_p.add_argument("--adapter", help="an adapter name (default: the base model)")
    _generation_flags(run_p)
    compare = sub.add_parser("compare", parents=[common], help="one suite against up to 8 targets, per example")
    csuite = compare.add_mutually_exclusive_group(required=True)
    csuite.add_argument("--suite", help="a registered suite's name")
    csuite.add_argument("--suite-file", type=Path, help="an inline suite (a kiln.eval-suite.v1 JSON file)")
    compare.add_argument("--adapter", action="append", required=True, dest="adapters",
                         help="a target (repeat, up to 8); 'base' is the base model")
    _generation_flags(compare)
    status = sub.add_parser("status", parents=[common], help="eval jobs, or one job's result")
    status.add_argument("job_id", nargs="?")
    status.add_argument("--follow", action="store_true", help="wait for the job, showing progress")
    rerun = sub.add_parser("rerun", parents=[common], help="a new job over a job's examples with chosen outcomes")
    rerun.add_argument("job_id")
    rerun.add_argument("--adapter", help="another target ('base' for the base model; default: the job's)")
    rerun.add_argument("--outcome-kinds", help="comma-separated (default fail,invalid,error)")
    rerun.add_argument("--include-pass", action="store_true", help="also rerun the passing examples")
    rerun.add_argument("--seed", help="decimal u64 (default: the job's seed)")
    rerun.add_argument("--follow", action="store_true", help="wait for the job, showing progress")
    replay = sub.add_parser("replay", parents=[common], help="strict replay of a completed job: matched or mismatch")
    replay.add_argument("job_id")
    replay.add_argument("--follow", action="store_true", help="wait for the verdict (exit 1 unless matched)")


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise CliError("file_unreadable", f"cannot read {path}: {exc.strerror}") from None


def _counts(manifest: dict) -> str:
    counts = manifest.get("split_counts") or {}
    return "/".join(str(counts.get(p, 0)) for p in PARTITIONS)


def _print_manifest(manifest: dict) -> None:
    for key in ("name", "format", "description", "rows", "corpus_sha256", "normalized_corpus_sha256",
                "split_manifest_sha256", "num_groups", "num_sessions", "created_at"):
        print(f"{key:25} {manifest.get(key)}")
    config = manifest.get("split_config") or {}
    print(f"{'split_config':25} seed {config.get('seed')}, train {config.get('train_percent')}%, "
          f"validation {config.get('validation_percent')}%")
    print(f"{'split_counts':25} train {manifest['split_counts']['train']}, validation "
          f"{manifest['split_counts']['validation']}, holdout {manifest['split_counts']['holdout']}")


def _split_body(args) -> dict:
    body = {"seed": args.seed, "train_percent": args.train_percent, "validation_percent": args.validation_percent}
    return {k: v for k, v in body.items() if v is not None}


def _datasets(client: KilnClient, args) -> object:
    command = args.datasets_command
    if command == "upload":
        content = _read(args.file)
        return client.post("/v1/eval/datasets/upload",
                           data={"name": args.name, "format": args.format, "description": args.description},
                           files={"file": (args.file.name, content, "application/x-ndjson")})
    if command == "list":
        return client.get("/v1/eval/datasets")
    path = api_path("/v1/eval/datasets", args.name)
    if command == "show":
        return client.get(path)
    if command == "delete":
        return client.delete(path)
    if command == "split":
        body = _split_body(args)
        if not body and not args.preview:
            return client.get(path)
        # The flags given change the current split; the others keep its values (the API's PUT takes a
        # whole config, and a missing field is its default: `--seed 9` alone reset 70/15 to 80/10).
        current = client.get(path).get("split_config") or {}
        body = {**{k: current[k] for k in ("seed", "train_percent", "validation_percent") if k in current}, **body}
        if args.preview:
            return client.post(f"{path}/preview", json=body)
        return client.request("PUT", f"{path}/split", json=body)
    body = {"suite_name": args.suite, "source_split": args.source_split, "force": args.force}
    for key, value in (("strategy", args.strategy), ("scorer", args.scorer), ("head_n", args.head_n)):
        if value is not None:
            body[key] = value
    return client.post(f"{path}/synthesize", json=body)


def _suites(client: KilnClient, args) -> object:
    command = args.suites_command
    if command == "create":
        try:
            body = json.loads(_read(args.file))
        except ValueError as exc:
            raise CliError("invalid_json", f"{args.file}: not valid JSON ({exc})") from None
        return client.post("/v1/eval/suites", params={"force": "true"} if args.force else None, json=body)
    if command == "list":
        return client.get("/v1/eval/suites")
    path = api_path("/v1/eval/suites", args.name)
    return client.get(path) if command == "show" else client.delete(path)


def _print_text(args, result) -> None:
    group = args.eval_command
    command = args.datasets_command if group == "datasets" else args.suites_command
    if command == "list" and group == "datasets":
        print_table([{**m, "train/validation/holdout": _counts(m)} for m in result],
                    ["name", "format", "rows", "train/validation/holdout", "num_groups", "num_sessions"])
    elif command == "list":
        print_table(result, ["name", "examples", "suite_hash"])
    elif command == "delete":
        print(f"deleted {result['name']}")
    elif group == "datasets" and command == "split" and args.preview:
        counts = result["split_counts"]
        print(f"{result['dataset']}: would give train {counts['train']}, validation {counts['validation']}, "
              f"holdout {counts['holdout']} ({result['num_components']} components)")
    elif group == "datasets" and command in ("upload", "show", "split"):
        _print_manifest(result)
    elif group == "datasets" or command == "create":
        print(f"suite {result['name']}: {result['examples']} examples, {result['suite_hash']}")
    else:  # suites show
        print(f"suite {result['name']} ({len(result['examples'])} examples) {result['suite_hash']}")
        print(f"scorer {json.dumps(result['scorer'], sort_keys=True)}")
        for example in result["examples"]:
            print(f"  {example['id']}: target {example.get('target')!r}")


def _suite_fields(args) -> dict:
    if args.suite_file is None:
        return {"suite_name": args.suite}
    try:
        return {"suite": json.loads(_read(args.suite_file))}
    except ValueError as exc:
        raise CliError("invalid_json", f"{args.suite_file}: not valid JSON ({exc})") from None


def _generation(args) -> dict:
    fields = {"temperature": args.temperature, "max_tokens": args.max_tokens, "top_p": args.top_p,
              "seed": args.seed, "thinking": args.thinking}
    return {k: v for k, v in fields.items() if v is not None}


def _target(name: str | None):
    return None if name in (None, "", "base") else name


def _job_label(job: dict) -> str:
    if job["state"] == "queued" and job.get("queue_position"):
        return f"queued (position {job['queue_position']})"
    return job["state"] + (f": {job['progress_message']}" if job.get("progress_message") else "")


def _print_result(result: dict) -> None:
    print(f"{result['job_id']}  eval {result['mode']}  {result['state']}  suite {result['suite_name']} "
          f"({result['suite_hash']})")
    print(f"generation {result['effective_generation_hash']}  seed {result['generation']['seed']}")
    for target in result["targets"]:
        counts = target.get("counts")
        if counts:
            accuracy = target.get("accuracy")
            print(f"  {target['label']:24} " + "  ".join(f"{k} {v}" for k, v in counts.items())
                  + (f"  accuracy {accuracy:.4f}" if accuracy is not None else ""))
        else:
            print(f"  {target['label']:24} {result['progress'] * 100:.0f}% {result.get('progress_message') or ''}")
    replay = result.get("replay")
    if replay:
        line = f"replay of {replay.get('of')}: {replay['status']}"
        first = replay.get("first_mismatch")
        if first:
            line += (f" at example {first['example_id']} ({first.get('target')}), token {first.get('token_index')}, "
                     f"char {first.get('char_index')}")
        if replay.get("message"):
            line += f" ({replay['message']})"
        print(line)
    if result.get("error"):
        print(f"error {result['error']['code']}: {result['error']['message']}")


def _settle(client: KilnClient, job_id: str, follow_it: bool, as_json: bool) -> int:
    job_path = api_path("/v1/eval/jobs", job_id)
    if follow_it:
        job = follow(lambda: client.get(api_path("/v1/jobs", job_id)), _job_label)
        if job["state"] not in TERMINAL_STATES:  # pragma: no cover - follow returns terminal states only
            return 1
    result = client.get(job_path)
    if as_json:
        print_json(result)
    else:
        _print_result(result)
    if not follow_it:
        return 0
    if result["state"] == "failed":
        error = result.get("error") or {}
        raise CliError(error.get("code", "job_failed"), error.get("message", "the eval job failed"))
    if result["state"] == "cancelled":
        raise CliError("job_cancelled", f"eval job {job_id} was cancelled")
    replay = result.get("replay")
    if replay and replay.get("status") != "matched":
        raise CliError(f"replay_{replay.get('status')}", f"replay of {replay.get('of')} answered {replay.get('status')}")
    return 0


def _accuracy_cell(job: dict) -> str:
    """A comparison shows each target's accuracy (in the targets' order), never one pooled figure."""
    per_target = job.get("target_accuracies")
    if per_target and len(per_target) > 1:
        return "/".join("-" if a is None else f"{a:.4f}" for a in per_target)
    return "" if job.get("accuracy") is None else f"{job['accuracy']:.4f}"


def _jobs(client: KilnClient, args) -> int:
    command = args.eval_command
    if getattr(args, "job_id", None) is not None:  # status, rerun, replay: an id is a UUID
        args.job_id = job_id_arg(args.job_id, "eval job")
    if command == "status" and not args.job_id:
        jobs = client.get("/v1/eval/jobs")
        if args.json:
            print_json(jobs)
        else:
            rows = [{**j, "targets": ",".join(j["targets"]), "progress": f"{j['progress'] * 100:.0f}%",
                     "accuracy": _accuracy_cell(j)} for j in jobs]
            print_table(rows, ["job_id", "mode", "state", "progress", "suite_name", "targets", "accuracy"])
        return 0
    if command == "status":
        return _settle(client, args.job_id, args.follow, args.json)
    if command in ("run", "compare"):
        body = {**_suite_fields(args), "generation": _generation(args)}
        if command == "run":
            body["adapter"] = _target(args.adapter)
        else:
            body["adapters"] = [_target(a) for a in args.adapters]
        queued = client.post(f"/v1/eval/{command}", json=body)
    elif command == "rerun":
        body = {"include_pass": args.include_pass}
        if args.adapter is not None:
            body["adapter"] = _target(args.adapter)
        if args.outcome_kinds:
            body["outcome_kinds"] = [k.strip() for k in args.outcome_kinds.split(",") if k.strip()]
        if args.seed is not None:
            body["seed"] = args.seed
        queued = client.post(api_path("/v1/eval/jobs", args.job_id, "rerun"), json=body)
    else:
        queued = client.post(api_path("/v1/eval/jobs", args.job_id, "replay"), json={})
    if not args.follow:
        if args.json:
            print_json(queued)
        else:
            print(f"queued eval {queued['mode']} {queued['job_id']}: suite {queued['suite_name']} "
                  f"({queued['suite_hash']}), generation {queued['effective_generation_hash']}, seed {queued['seed']}")
        return 0
    if not args.json:
        print(f"queued eval {queued['mode']} {queued['job_id']}")
    return _settle(client, queued["job_id"], True, args.json)


def run(args) -> int:
    client = KilnClient(args.url)
    if args.eval_command not in ("datasets", "suites"):
        return _jobs(client, args)
    result = _datasets(client, args) if args.eval_command == "datasets" else _suites(client, args)
    if args.json:
        print_json(result)
    else:
        _print_text(args, result)
    return 0
