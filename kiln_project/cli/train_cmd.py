"""`kiln train grpo|status|cancel`: submit GRPO training from a file, follow it, cancel it."""

from __future__ import annotations

import sys
from pathlib import Path

from core.contracts.groups import JsonTextError, load_json
from kiln_project.cli.client import CliError, KilnClient, api_path, job_id_arg
from kiln_project.cli.output import follow, print_json, print_table


def add_parser(subparsers, common) -> None:
    train = subparsers.add_parser("train", help="GRPO training")
    sub = train.add_subparsers(dest="train_command", required=True)
    grpo = sub.add_parser("grpo", parents=[common], help="submit GRPO training from a JSON or JSONL file")
    grpo.add_argument("--file", required=True, type=Path,
                      help="JSONL (one group per line) or one JSON request/batch")
    grpo.add_argument("--adapter", help="output adapter name (config.output_name)")
    grpo.add_argument("--lora-rank", type=int)
    grpo.add_argument("--checkpoint-interval", type=int)
    grpo.add_argument("--resume-checkpoint")
    grpo.add_argument("--no-shared-prefix-reference", action="store_true")
    grpo.add_argument("--no-auto-load", action="store_true",
                      help="config.auto_load false: publish the adapter without activating it for serving")
    grpo.add_argument("--adapter-smoke-test", action="store_true",
                      help="after training, generate from the new adapter and fail on non-finite output")
    grpo.add_argument("--adapter-smoke-prompts-file", type=Path,
                      help="the smoke test's prompts: a JSON list of strings, or one prompt per line")
    grpo.add_argument("--detect-anomaly", action="store_true", help="torch anomaly detection (slow; for debugging)")
    grpo.add_argument("--follow", action="store_true", help="wait for a terminal state with a progress bar")
    grpo.add_argument("--dry-run", action="store_true",
                      help="validate and plan only (the server admits the request as a real one and queues nothing)")
    status = sub.add_parser("status", parents=[common], help="training jobs, or one job")
    status.add_argument("--job-id")
    status.add_argument("--follow", action="store_true")
    resume = sub.add_parser("resume", parents=[common],
                            help="resume an interrupted or cancelled training job from its latest checkpoint")
    resume.add_argument("--job-id", required=True)
    resume.add_argument("--checkpoint", help="the checkpoint to resume from (default: the job's latest_checkpoint)")
    resume.add_argument("--follow", action="store_true", help="wait for a terminal state with a progress bar")
    cancel = sub.add_parser("cancel", parents=[common], help="cancel a queued or running training job")
    cancel.add_argument("--job-id", required=True)
    train.set_defaults(handler=run)


REQUEST_SOURCES = ("groups", "agentic_groups", "dataset_path", "dataset")  # keys that make an object a request


def _read(path: Path) -> str:
    """The file as text; a leading UTF-8 BOM is dropped, as the server does for dataset files."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise CliError("file_unreadable", f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError:  # its message would quote the byte
        raise CliError("file_unreadable", f"cannot read {path}: not UTF-8 text") from None


def load_request(path: Path) -> tuple[dict, bool]:
    """(the request, whether the file is JSONL of groups): a JSON object with a source is a request;
    one group object or JSONL lines are groups, one per line (what the server's dataset_path reads);
    a JSON list is groups too, but not JSONL (the server would misread it as lines)."""
    text = _read(path)
    try:  # NaN passes, as on the server, whose reward check names the field
        whole = load_json(text, allow_nan=True)
    except JsonTextError:
        whole = None
    if isinstance(whole, dict) and any(k in whole for k in REQUEST_SOURCES):
        return whole, False
    if isinstance(whole, dict):
        return {"groups": [whole]}, True
    if isinstance(whole, list):
        return {"groups": whole}, False
    groups = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                groups.append(load_json(line, allow_nan=True))
            except JsonTextError as exc:
                raise CliError("invalid_jsonl", f"{path}:{number}: {exc}") from None
    if not groups:
        raise CliError("invalid_jsonl", f"{path} holds no groups")
    return {"groups": groups}, True


def build_request(args) -> dict:
    return _with_config(load_request(args.file)[0], args)


def _with_config(body: dict, args) -> dict:
    config = dict(body.get("config") or {})
    # The convenience command keeps the default behavior policy (no importance correction) unless the
    # request file chose one: recorded-policy corpora need an explicit config.behavior_policy.
    config.setdefault("behavior_policy", "no_importance_correction")
    overrides = {"output_name": args.adapter, "lora_rank": args.lora_rank,
                 "checkpoint_interval": args.checkpoint_interval, "resume_checkpoint": args.resume_checkpoint}
    if args.lora_rank is not None and "lora_alpha" not in config:
        # Keep the default alpha/rank ratio (2) rather than the default alpha, which the server's
        # LoRA scale limit would refuse for small ranks.
        config["lora_alpha"] = 2 * args.lora_rank
    for key, value in overrides.items():
        if value is not None and key in config and config[key] != value:
            # The flag wins, as flags do; say so, since the request file named another value.
            print(f"kiln: the command line's {key} {value!r} replaces {config[key]!r} from the request file",
                  file=sys.stderr)
    config.update({k: v for k, v in overrides.items() if v is not None})
    if args.no_shared_prefix_reference:
        config["shared_prefix_reference"] = False
    if getattr(args, "no_auto_load", False):
        config["auto_load"] = False
    if getattr(args, "adapter_smoke_prompts_file", None) is not None:
        if not args.adapter_smoke_test:
            raise CliError("invalid_arguments", "--adapter-smoke-prompts-file needs --adapter-smoke-test")
        config["adapter_smoke_prompts"] = _smoke_prompts(args.adapter_smoke_prompts_file)
    if getattr(args, "adapter_smoke_test", False):
        config["adapter_smoke_test"] = True
    if getattr(args, "detect_anomaly", False):
        config["detect_anomaly"] = True
    if getattr(args, "dry_run", False):
        return {**body, "config": config, "dry_run": True}
    return {**body, "config": config}


def _smoke_prompts(path: Path) -> list[str]:
    """A JSON list of strings, or one prompt per non-blank line."""
    text = _read(path)
    try:
        value = load_json(text)
    except JsonTextError:
        value = [line.strip() for line in text.splitlines() if line.strip()]
    if not isinstance(value, list) or not value or not all(isinstance(p, str) and p.strip() for p in value):
        raise CliError("invalid_arguments", f"{path}: give a JSON list of prompts, or one prompt per line")
    return value


def _training_label(status: dict) -> str:
    loss = status.get("current_loss")
    return status["state"] + (f" loss {loss:.4f}" if isinstance(loss, int | float) else "")


def follow_training(client: KilnClient, job_id: str) -> dict:
    """Follow the training, then, when it completed with a post_eval, its held-out gate until it decides:
    the guide's wait is for the adapter and its evaluation outcome, not for the training alone."""
    path = api_path("/v1/train/status", job_id)
    status = follow(lambda: client.get(path), _training_label)
    if status["state"] != "completed" or status.get("gate_outcome"):
        return status
    if not client.get(api_path("/v1/train/jobs", job_id)).get("post_eval"):
        return status

    def gate_status() -> dict:
        latest = client.get(path)
        # the training is done; what is followed now is the gate (its outcome ends the follow)
        return {**latest, "state": "completed" if latest.get("gate_outcome") else "evaluating",
                "progress": 1.0 if latest.get("gate_outcome") else 0.0}

    return {**follow(gate_status, lambda s: f"post-eval gate: {s.get('gate_outcome') or 'pending'}", poll_seconds=1.0),
            "state": "completed"}


def _when(value) -> str:
    return f" at {value}" if value else ""


def _text(value) -> str:
    """A status field for a person: "-" for none, `code: message` for an error object."""
    if value is None or value == "":
        return "-"
    if isinstance(value, dict) and "code" in value:
        return f"{value.get('code')}: {value.get('message') or ''}".rstrip(": ")
    return str(value)


def detail_lines(detail: dict) -> list[str]:
    """`kiln train status --job-id`: the job's status, then its three recorded states (training,
    evaluation, activation) with their times, then the gate's evidence (README, "Promotion")."""
    lines = [f"{key:14} {_text(detail.get(key))}" for key in (
        "job_id", "state", "progress", "current_loss", "adapter_name", "adapter_path", "elapsed_secs", "error",
        "gate_outcome", "post_eval_verdict")]
    states = detail.get("states") or {}
    training, evaluation, activation = (states.get(k) or {} for k in ("training", "evaluation", "activation"))
    if training:
        lines.append(f"{'training':14} {training.get('state')}{_when(training.get('at'))}")
    if states.get("evaluation"):
        outcome = f" ({evaluation['outcome']})" if evaluation.get("outcome") else ""
        eval_job = (f", eval job {evaluation['eval_job_id']} (kiln eval status ID)" if evaluation.get("eval_job_id")
                    else "")
        lines.append(f"{'evaluation':14} {evaluation.get('state')}{outcome}{_when(evaluation.get('at'))}, "
                     f"post-eval job {evaluation.get('job_id')}{eval_job}"
                     + (f": {evaluation['reason']}" if evaluation.get("reason") else ""))
    elif training and detail.get("post_eval"):
        lines.append(f"{'evaluation':14} not started (post_eval on suite {detail['post_eval'].get('suite')!r} "
                     "runs once the adapter publishes)")
    elif training:
        lines.append(f"{'evaluation':14} none (no post_eval)")
    if activation:
        how = [f"promotion {activation['promotion_id']}"] if activation.get("promotion_id") is not None else []
        if activation.get("activation_job_id"):
            how.append(f"activation job {activation['activation_job_id']}")
        if activation.get("demoted_to"):
            how.append(f"demoted to {activation['demoted_to']}")
        if activation.get("error"):
            how.append(f"error {activation['error'].get('code')}: {activation['error'].get('message')}")
        if activation.get("active"):
            when = _when(activation.get("at"))
        elif activation.get("deactivated_at"):
            when = f" since {activation['deactivated_at']} (active from {activation.get('at')})"
        else:
            when = ""  # never activated: no time to show
        lines.append(f"{'activation':14} {'active' if activation.get('active') else 'inactive'}{when}"
                     + (f" ({'; '.join(how)})" if how else ""))
    checkpoint = detail.get("latest_checkpoint")
    if isinstance(checkpoint, dict) and checkpoint.get("resume_checkpoint"):
        name = checkpoint["resume_checkpoint"]
        step = checkpoint.get("global_step") or (checkpoint.get("progress") or {}).get("global_step")
        how = (f"kiln train resume --job-id {detail.get('job_id')}" if detail.get("replay_request") else
               f"the same request again (its groups, config and post_eval) with config.resume_checkpoint {name}")
        # Only a run that did not finish can be resumed: a completed one published its adapter, and a
        # resume into that name is refused (adapter_revision_conflict).
        resumable = detail.get("state") == "failed"
        lines.append(f"{'checkpoint':14} {name}" + (f" (step {step})" if step is not None else "")
                     + (f"; resume with: {how}" if resumable else ""))
    elif detail.get("checkpoint_error"):
        lines.append(f"{'checkpoint':14} none usable: {detail['checkpoint_error']}")
    for evidence in detail.get("post_eval_gate_evidence") or []:
        if evidence.get("candidate_accuracy") is None:  # a gate that ended before any figure (outcome error)
            lines.append(f"{'evidence':14} {evidence.get('outcome')}: {evidence.get('reason') or 'no figures'}"
                         + (f", eval job {evidence['eval_job_id']}" if evidence.get("eval_job_id") else ""))
            continue
        lines.append(f"{'evidence':14} {evidence.get('outcome')}: accuracy {evidence.get('baseline_accuracy')} "
                     f"({evidence.get('baseline_adapter') or 'base'}) -> {evidence.get('candidate_accuracy')} "
                     f"(minimum {evidence.get('minimum_accuracy')}), improved {evidence.get('improved')} regressed "
                     f"{evidence.get('regressed')} tied {evidence.get('tied')} of {evidence.get('paired_examples')}, "
                     f"p {evidence.get('exact_sign_test_p_value')}, eval job {evidence.get('eval_job_id')}")
    return lines


def _final(status: dict, as_json: bool) -> int:
    if as_json:
        print_json(status)
    else:
        gate = f"  gate {status['gate_outcome']}" if status.get("gate_outcome") else ""
        print(f"{status['job_id']}  {status['state']}  adapter {_text(status.get('adapter_name'))}{gate}")
        if status.get("post_eval_verdict"):
            print(f"post-eval: {status['post_eval_verdict']}")
    if status["state"] != "completed":
        error = status.get("error") or {}
        raise CliError(error.get("code", f"job_{status['state']}"), error.get("message", status["state"]))
    return 0


def _note_unused_provenance(body: dict) -> None:
    """The command's default policy ignores the recorded provenance rollout-generate writes; say so,
    since the guide's recorded-policy workflow needs behavior_policy recorded in a request."""
    groups = body.get("groups") if isinstance(body.get("groups"), list) else []
    config = body.get("config") if isinstance(body.get("config"), dict) else {}
    recorded = any(isinstance(c, dict) and "provenance" in c for g in groups[:50] if isinstance(g, dict)
                   for c in (g.get("completions") or []) if isinstance(g.get("completions"), list))
    if recorded and "behavior_policy" not in config:
        print("kiln: note: these rollouts carry recorded provenance, which this command does not use "
              "(it trains with no_importance_correction); to train with behavior_policy recorded, send a "
              "request (POST /v1/train/grpo, or a request file with config.behavior_policy)", file=sys.stderr)


def _submit_grpo(client: KilnClient, args) -> dict:
    """A file of groups goes by the streamed route, as the guide says: the server reads the file
    (`dataset_path`), admits the whole corpus and pins a snapshot. When the server cannot read it
    (another machine, or outside its dataset roots) the groups go inline instead, and a note says so.
    A request file (an object with a source) is sent as written."""
    body, groups_jsonl = load_request(args.file)
    _note_unused_provenance(body)
    inline = _with_config(body, args)
    if not groups_jsonl:  # a request object or a JSON batch (list) is sent as written
        return client.post("/v1/train/grpo", json=inline)
    streamed = {**{k: v for k, v in inline.items() if k != "groups"}, "dataset_path": str(args.file.resolve())}
    try:
        return client.post("/v1/train/grpo", json=streamed)
    except CliError as exc:
        if not (exc.code == "training_invalid_request" and exc.message.startswith("dataset_path: not a readable file")):
            raise
        print(f"note: the server cannot read {args.file.resolve()} ({exc.hint or 'outside its dataset roots'}); "
              "sending the groups inline", file=sys.stderr)
    return client.post("/v1/train/grpo", json=inline)


def _dry_run_text(plan: dict) -> str:
    data = plan.get("training_data") or {}
    return (f"dry run: valid; nothing queued. It would publish {plan.get('would_publish')} (effective seed "
            f"{plan.get('effective_seed')}) from {data.get('rows')} groups / {data.get('rollouts')} rollouts, "
            f"{plan.get('groups_with_reward_contrast')} with reward contrast "
            f"({plan.get('groups_without_reward_contrast')} all-equal, dropped by dynamic sampling)"
            + _memory_text(plan.get("memory")))


def _memory_text(memory: dict | None) -> str:
    """The largest step's memory estimate (training.memory_preflight), against the budget when one is set."""
    if not memory:
        return ""
    largest = memory["largest_step"]
    budget = (f" of a {memory['budget_mib']:g} MiB budget ({memory['budget_source']})" if memory.get("budget_mib")
              else " (no budget set on this server: not checked)")
    return f"; its largest step needs at least {largest['total_mib']:g} MiB beyond the model{budget}"


def resume_request(detail: dict, checkpoint: str | None) -> tuple[str, dict]:
    """(route, body) that resumes a job: its own request (replay_request: the same source, effective
    config with its seed, and post_eval) with config.resume_checkpoint. A resume must be the same run
    (the server refuses another config or other data), so nothing here is rebuilt from flags."""
    replay, state = detail.get("replay_request"), detail.get("state")
    if state == "completed":  # its adapter is published under the name a resume would write again
        raise CliError("training_job_completed", f"training job {detail.get('job_id')} completed and published "
                       f"{detail.get('adapter_name')}; there is nothing to resume",
                       f"to train further, submit a new run with config.base_adapter {detail.get('adapter_name')} and "
                       "a new output name (a JSON request file for kiln train grpo --file, or the HTTP route)")
    if state not in ("failed", "cancelled"):  # a resume of a job still queued or running would race it
        raise CliError("training_job_not_stopped", f"training job {detail.get('job_id')} is {state}",
                       f"wait for it to end, or cancel it first: kiln train cancel --job-id {detail.get('job_id')}")
    name = checkpoint or (detail.get("latest_checkpoint") or {}).get("resume_checkpoint")
    if not name:
        interval = (detail.get("effective_config") or {}).get("checkpoint_interval")
        raise CliError("checkpoint_not_found", f"training job {detail.get('job_id')} has no checkpoint to resume from",
                       f"it stopped before its first checkpoint (every {interval} optimizer groups); it can only run "
                       "again" if interval else
                       "set config.checkpoint_interval so a run writes checkpoints; this one can only run again")
    if not replay:
        raise CliError("resume_needs_the_request", f"training job {detail.get('job_id')} was sent its groups inline; "
                       "the server keeps them only as a private snapshot",
                       f"send the same request again (its groups, config and post_eval) with "
                       f"config.resume_checkpoint {name}")
    body = dict(replay["body"])
    body["config"] = {**body["config"], "resume_checkpoint": name}
    return replay["route"], body


def _say_what_publication_does(response: dict) -> None:
    """What becomes of the adapter once published (active at once, gated, waiting for a reviewer, or kept
    for review), as the server says it: on stderr, so stdout stays the one `queued` line."""
    if response.get("after_publication"):
        print(f"kiln: note: once published, {response['after_publication']}", file=sys.stderr, flush=True)


def run(args) -> int:
    client = KilnClient(args.url)
    if args.train_command == "grpo":
        response = _submit_grpo(client, args)
        for warning in response.get("warnings") or []:  # e.g. a misspelt config key the server ignored
            print(f"kiln: warning: {warning}", file=sys.stderr)
        if response.get("dry_run"):  # a plan, not a job (--dry-run, or "dry_run": true in the request file)
            if args.json:
                print_json(response)
            else:
                print(_dry_run_text(response))
            return 0
        if args.follow:
            if not args.json:  # the id first: an interrupted follow leaves it on screen
                print(f"queued {response['job_id']} (effective seed {response['effective_seed']})", flush=True)
                _say_what_publication_does(response)
            return _final(follow_training(client, response["job_id"]), args.json)
        if args.json:
            print_json(response)
        else:
            print(f"queued {response['job_id']} (effective seed {response['effective_seed']})")
            _say_what_publication_does(response)
        return 0
    if args.train_command == "resume":
        detail = client.get(api_path("/v1/train/jobs", job_id_arg(args.job_id, "training job")))
        route, body = resume_request(detail, args.checkpoint)
        response = client.post(route, json=body)
        if args.follow:
            if not args.json:  # the id first: an interrupted follow leaves it on screen
                print(f"queued {response['job_id']}: resumes {detail.get('adapter_name')} from "
                      f"{body['config']['resume_checkpoint']}", flush=True)
            return _final(follow_training(client, response["job_id"]), args.json)
        if args.json:  # QA: `kiln train resume --json | jq -r .job_id` got the text line
            print_json({**response, "resumes": detail.get("adapter_name"),
                        "resume_checkpoint": body["config"]["resume_checkpoint"]})
        else:
            print(f"queued {response['job_id']}: resumes {detail.get('adapter_name')} from "
                  f"{body['config']['resume_checkpoint']}")
        return 0
    if args.train_command == "cancel":
        response = client.delete(api_path("/v1/train/queue", job_id_arg(args.job_id, "training job")))
        print_json(response) if args.json else print(f"{response['status']} {response['job_id']}")
        return 0
    if args.job_id is not None:
        args.job_id = job_id_arg(args.job_id, "training job")
        if args.follow:
            return _final(follow_training(client, args.job_id), args.json)
        detail = client.get(api_path("/v1/train/jobs", args.job_id))  # the status fields, states and evidence
        if args.json:
            print_json(detail)
        else:
            for line in detail_lines(detail):
                print(line)
        return 0
    statuses = client.get("/v1/train/status")
    if args.json:
        print_json(statuses)
    else:
        print_table([{**s, "progress": f"{s['progress'] * 100:.0f}%", "current_loss": _text(s.get("current_loss")),
                      "gate_outcome": _text(s.get("gate_outcome"))} for s in statuses],
                    ["job_id", "state", "progress", "current_loss", "adapter_name", "gate_outcome"])
    return 0
