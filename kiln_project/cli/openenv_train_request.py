"""`kiln openenv train`'s request: its flags (the guide's collection flags, the training overrides,
the held-out environment evaluation and post-eval) and the kind-train `POST /v1/openenv/runs` body they
make, the `--credential-env` variables as the server's credential handles, and the local copies of the
collection the command downloads (checked before anything is submitted). Following the run is
openenv_runs_cmd.py's."""

from __future__ import annotations

import json
from pathlib import Path

from kiln_project.cli.client import CliError
from kiln_project.cli.output import check_output_path

# artifact kind -> (the `train` flag that names its local copy, its default): rollout's names (spec §1.7)
COLLECTION_OUTPUTS = {"dataset": ("--output", "openenv.rollouts.jsonl"),
                      "replay": ("--replay-output", "openenv.replay.json"),
                      "summary": ("--summary-output", "openenv.rollout-summary.json")}


def train_parser(sub, common) -> None:
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


def collection_outputs(args) -> dict[str, Path]:
    """artifact kind -> the local path of its copy; checked before the run is submitted, so a FIFO or
    device (or one path given twice) fails before any episode is spent."""
    outputs = {kind: getattr(args, flag[2:].replace("-", "_")) for kind, (flag, _) in COLLECTION_OUTPUTS.items()}
    if len({path.resolve() for path in outputs.values()}) != len(outputs):
        raise CliError("openenv_invalid_request", "--output, --replay-output and --summary-output must be "
                       "three different files")
    for path in outputs.values():
        check_output_path(path)
    return outputs
