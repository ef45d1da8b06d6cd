"""`kiln eval datasets ...` and `kiln eval suites ...`: datasets with their splits, and eval suites.

A thin client of /v1/eval/* (reference-spec §1.3, §1.4): it reads local files and sends them; the
server validates. Errors print one line and exit non-zero. Imports no Django and no torch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from urllib.parse import quote

from kiln_project.cli.client import CliError, KilnClient
from kiln_project.cli.output import print_json, print_table

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


def _percent(value: str) -> float | int:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    return int(number) if number.is_integer() else number


def add_parser(subparsers, common) -> None:
    evaluate = subparsers.add_parser("eval", help="evaluation datasets and suites")
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
    evaluate.set_defaults(handler=run)


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
    path = f"/v1/eval/datasets/{quote(args.name, safe='')}"
    if command == "show":
        return client.get(path)
    if command == "delete":
        return client.delete(path)
    if command == "split":
        body = _split_body(args)
        if args.preview:
            return client.post(f"{path}/preview", json=body)
        if not body:
            return client.get(path)
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
    path = f"/v1/eval/suites/{quote(args.name, safe='')}"
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


def run(args) -> int:
    client = KilnClient(args.url)
    result = _datasets(client, args) if args.eval_command == "datasets" else _suites(client, args)
    if args.json:
        print_json(result)
    else:
        _print_text(args, result)
    return 0
