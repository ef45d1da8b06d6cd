"""`kiln rollout-generate`: sample, validate and score recorded-policy GRPO rollouts (reference-spec §1.7).

For every task and seed it sends one /v1/chat/completions request (the rendered request template,
with the seed, adapter, n=1, stream=false, rollout provenance and enable_thinking owned by the
command), validates the response and its kiln.rollout-provenance.v1 record, and runs the scorer
in the sandbox (`evaluations.sandbox`). Only when every record validated does it publish the
canonical GRPO JSONL (ready for POST /v1/train/grpo with behavior_policy "recorded") and the
summary, atomically and together; any failure prints one line naming the task, the seed and the
check, exits non-zero, and leaves existing output files untouched. A request refused because the GPU
worker is gone or restarting is sent again after a bounded wait (generate.ResendPolicy): it is seeded.

A client of the API: imports no Django and no torch (the pure core is `evaluations.generation`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from datetime import UTC, datetime
from pathlib import Path

from core.canonical import sha256_digest
from core.contracts.sampling import MAX_SEED
from evaluations.generation.corpus import build_groups, build_summary, corpus_bytes
from evaluations.generation.errors import RolloutError
from evaluations.generation.generate import ResendPolicy, check_plan_size, plan_requests, run_requests
from evaluations.generation.publish import check_not_inputs, check_targets, publish_together
from evaluations.generation.template import RenderOptions, load_tasks, load_template, template_warnings
from evaluations.generation.validation import check_consistency
from kiln_project.cli.client import CliError, KilnClient
from kiln_project.cli.output import ProgressBar, print_json

TRUE, FALSE = ("true", "1", "yes", "on"), ("false", "0", "no", "off")
REQUEST_TIMEOUT_S = 900.0  # the server waits up to 300 s for a busy GPU worker, then decodes


def parse_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in TRUE:
        return True
    if lowered in FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {value!r}")


def parse_budget(value: str, unit: str = "token") -> int | None:
    if value.strip().lower() == "unlimited":
        return None
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'unlimited', got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"the thinking budget must be at least 1 {unit}")
    return number


def parse_budget_ms(value: str) -> int | None:
    return parse_budget(value, "millisecond")


def finite_float(value: str) -> float:
    """A float option that refuses nan and inf at parsing: a bound check (`not low <= x <= high`) lets
    nan through, and the refusal that follows reads as someone else's fault."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {value!r}")
    return number


def positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return number


def add_parser(subparsers, common) -> None:
    p = subparsers.add_parser(
        "rollout-generate", parents=[common],
        help="generate, validate and score recorded-policy GRPO rollouts",
        description="Sample every task once per seed through /v1/chat/completions, validate each response's "
                    "rollout provenance, score it with the sandboxed scorer, and publish the GRPO JSONL and a "
                    "summary together, only when everything validated.")
    p.add_argument("--adapter", required=True, help="'base' for the base model, or a published adapter name")
    p.add_argument("--thinking", type=parse_bool, default=False, metavar="BOOL",
                   help="chat_template_kwargs.enable_thinking for every request (default false)")
    p.add_argument("--thinking-budget-tokens", type=parse_budget, default=None, metavar="N|unlimited",
                   help="reasoning tokens before </think> is forced (needs --thinking true)")
    p.add_argument("--thinking-budget-ms", type=parse_budget_ms, default=None, metavar="N|unlimited",
                   help="milliseconds of reasoning before </think> is forced (needs --thinking true)")
    p.add_argument("--tasks", required=True, type=Path, help="JSONL, one task object with a unique id per line")
    p.add_argument("--request-template", required=True, type=Path,
                   help="chat-completions body with {{prompt}}, {{task.FIELD}}, {{seed}}, {{adapter_label}}, "
                        "{{thinking_enabled}} placeholders")
    p.add_argument("--scorer", required=True, type=Path,
                   help="executable reading one JSON object on stdin, printing a number or {reward|score|value}")
    p.add_argument("--seeds", type=positive_int, default=1, help="completions per task (default 1)")
    p.add_argument("--seed-start", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--output", type=Path, default=Path("rollouts.scored.jsonl"),
                   help="GRPO groups JSONL (default rollouts.scored.jsonl)")
    p.add_argument("--summary-output", type=Path, default=Path("rollout_summary.json"),
                   help="summary JSON (default rollout_summary.json)")
    p.add_argument("--concurrency", type=positive_int, default=4, help="requests in flight (default 4)")
    p.add_argument("--unsandboxed-scorer", action="store_true",
                   help="run the scorer without the sandbox (recorded in the summary; trusted scorers only)")
    p.set_defaults(handler=run)


def _say(line: str) -> None:
    """A resend after the GPU worker was lost: said on stderr, so a pause is never silent."""
    print(f"kiln: {line}", file=sys.stderr, flush=True)


def _file_digest(path: Path) -> str:
    return sha256_digest(path.read_bytes())


def _check_scorer(path: Path) -> Path:
    if not path.is_file():
        raise RolloutError("scorer_not_found", f"scorer {path} does not exist or is not a file")
    if not os.access(path, os.X_OK):
        raise RolloutError("scorer_not_executable", f"scorer {path} is not executable", hint=f"chmod +x {path}")
    return path.resolve()


def _scorer_runner(scorer: Path, unsandboxed: bool):
    try:
        from evaluations.sandbox import ScorerLimits, run_scorer
    except ImportError as exc:
        raise RolloutError("scorer_sandbox_unavailable", f"the scorer sandbox (evaluations.sandbox) cannot be "
                           f"imported: {exc}") from None
    limits = ScorerLimits()

    def score(payload: dict):
        return run_scorer(scorer, payload, limits=limits, unsandboxed=unsandboxed, cwd=None)

    return score


def generate(args) -> dict:
    """Run the whole command; returns the summary that was published. Raises RolloutError or CliError."""
    options = RenderOptions(adapter=args.adapter, thinking=args.thinking,
                            thinking_budget_tokens=args.thinking_budget_tokens,
                            thinking_budget_ms=args.thinking_budget_ms)
    if not args.adapter.strip():
        raise RolloutError("invalid_argument", "--adapter needs 'base' or an adapter name")
    options.check_budgets()
    if args.seed_start < 0 or args.seed_start + args.seeds - 1 > MAX_SEED:
        raise RolloutError("invalid_argument", f"seeds must lie within 0..{MAX_SEED}")
    check_plan_size(0, args.seeds)  # before the tasks are even read
    output, summary_path = check_targets([args.output, args.summary_output])
    check_not_inputs({"--output": output, "--summary-output": summary_path},
                     {"--tasks": args.tasks, "--request-template": args.request_template, "--scorer": args.scorer})
    scorer = _check_scorer(args.scorer)
    tasks = load_tasks(args.tasks)
    template = load_template(args.request_template)
    for warning in template_warnings(template):
        print(f"warning: {warning}", file=sys.stderr)
    seeds = list(range(args.seed_start, args.seed_start + args.seeds))
    planned = plan_requests(template, tasks, seeds, options)  # every refusal before the first request
    score = _scorer_runner(scorer, args.unsandboxed_scorer)
    if args.unsandboxed_scorer:
        print("warning: --unsandboxed-scorer: the scorer runs WITHOUT a sandbox, with your privileges, on "
              "model output; the summary records this", file=sys.stderr)

    client = KilnClient(args.url, timeout=REQUEST_TIMEOUT_S)
    bar = ProgressBar() if sys.stderr.isatty() else None

    def post(body: dict) -> dict:
        return client.post("/v1/chat/completions", json=body)

    def progress(done: int, total: int, label: str) -> None:
        if bar is not None:
            bar.update(done / total, f"{done}/{total} {label}")

    try:
        scored = run_requests(planned, post=post, score=score, options=options, concurrency=args.concurrency,
                              on_progress=progress, resend=ResendPolicy(notify=_say))
    finally:
        if bar is not None:
            bar.close()
    identity = check_consistency([r.checked for r in scored], {t.id: t for t in tasks})
    groups, group_rows = build_groups(scored)
    data = corpus_bytes(groups)
    run_info = {
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "server_url": client.url,
        "adapter": "base" if options.is_base else options.adapter,
        "thinking": {"enabled": options.thinking, "budget_tokens": options.thinking_budget_tokens,
                     "budget_ms": options.thinking_budget_ms},
        "seeds": {"start": seeds[0], "count": len(seeds), "last": seeds[-1]},
        "concurrency": args.concurrency,
        "inputs": {
            "tasks": {"path": str(args.tasks.resolve()), "sha256": _file_digest(args.tasks), "count": len(tasks)},
            "request_template": {"path": str(args.request_template.resolve()),
                                 "sha256": _file_digest(args.request_template)},
        },
        "scorer": {"path": str(scorer), "sha256": _file_digest(scorer)},
        "output": {"path": str(output)},
    }
    summary = build_summary(scored=scored, group_rows=group_rows, identity=identity, corpus=data, run=run_info,
                            unsandboxed_requested=args.unsandboxed_scorer)
    summary_bytes = (json.dumps(summary, indent=2, ensure_ascii=False) + "\n").encode()
    publish_together([(output, data), (summary_path, summary_bytes)])
    return {**summary, "summary_path": str(summary_path), "root_warning": _dataset_root_warning(client, output)}


def _dataset_root_warning(client: KilnClient, output: Path) -> str | None:
    """The guide's next step trains on this file by path (`dataset_path`, read by the server, which reads
    only under its dataset roots): when the server on this machine would refuse it, say so now, not then."""
    from urllib.parse import urlparse

    from core.confined_paths import ROOTS_SETTING
    from openenv.client.urls import is_loopback_host

    if not is_loopback_host(urlparse(client.url).hostname or ""):
        return None  # another machine's server: its roots are paths there
    try:
        roots = client.get("/v1/config")["config"]["dataset_roots"]
    except (CliError, KeyError, TypeError):
        return None
    real = output.resolve()
    if not isinstance(roots, list) or any(real.is_relative_to(Path(str(root)).resolve()) for root in roots):
        return None
    return (f"{output} lies outside the server's dataset roots ({', '.join(map(str, roots))}), so POST "
            f"/v1/train/grpo with it as dataset_path will be refused: write it under one of them, or add its "
            f"folder to {ROOTS_SETTING} and restart")


def run(args) -> int:
    try:
        summary = generate(args)
    except RolloutError as exc:
        raise CliError(exc.code, exc.message, exc.hint) from None
    stats = summary["stats"]
    warnings = []
    if stats["groups_without_contrast"] == stats["groups"]:
        warnings.append("every group has identical rewards; GRPO has no relative signal here. Improve generation "
                        "diversity or the reward shape before training.")
    if not summary["scorer"]["sandboxed"]:
        warnings.append(summary["scorer"]["warning"])
    if summary.get("root_warning"):
        warnings.append(summary["root_warning"])
    if args.json:  # the warnings in the JSON too: a script reading stdout alone would not see them
        print_json({"output": summary["output"], "summary_output": summary["summary_path"],
                    "stats": {k: stats[k] for k in ("count", "mean_reward", "min_reward", "max_reward",
                                                    "groups", "groups_without_contrast",
                                                    "groups_without_contrast_ids")},
                    "warnings": warnings})
    else:
        out = summary["output"]
        print(f"wrote {out['groups']} groups ({out['rollouts']} rollouts) to {out['path']}")
        print(f"summary: {summary['summary_path']}")
        print(f"reward mean {stats['mean_reward']:.4g}  min {stats['min_reward']:.4g}  "
              f"max {stats['max_reward']:.4g}  ({stats['groups_without_contrast']} of {stats['groups']} groups "
              "without reward contrast)")
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0
