"""The `eval.run` job (control queue): sample every example of a pinned suite from each target, score
it, and publish the outcomes atomically.

For each target (an adapter, or the base model) and each example, in suite order and one request at
a time, one chat completion goes through `adapters.serving.sync_client.chat_completion_sync` (the
`infer` actor: the GPU worker's batched sampler, behind its writer lock like any inference) with
the job's generation settings, `seed = example_seed(job seed, example id)` and
`rollout_provenance: true`. The provenance record gives the completion's token ids and is held to
the job: its seed, the base model's sha256 and inference config, and the adapter's content_sha256
recorded at submission (a change fails the job: `eval_model_changed`, `eval_adapter_changed`).
The completion is scored with `example_scorers.score_example`, or a registered scorer program run
in the sandbox (`evaluations.sandbox.run_scorer`, its sha256 re-checked) and mapped with
`outcome_from_program`. A request the model service refuses as a bad request (4xx, e.g. a prompt
longer than the context) is that example's `error`; an unavailable service fails the job.

Progress is reported per example; cancellation is honoured between examples; the results file
(`HomeLayout.eval_job(uuid)/results.json`, `kiln.eval-results.v1`) is written only once every
example is scored, so a failed or cancelled job publishes nothing. A replay compares its records
with the original's (`eval_payloads.replay_verdict`) before publishing. Imports no torch.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from adapters.serving.selectors import wait_for_inference_ready
from core.artifacts import ensure_dir, json_bytes, write_file
from core.canonical import sha256_digest
from core.errors import KilnError
from evaluations.eval_payloads import (
    OUTCOME_KINDS,
    EvalJobPayload,
    example_seed,
    replay_verdict,
    target_label,
)
from evaluations.eval_selectors import (
    RESULTS_SCHEMA,
    eval_job_get,
    eval_records,
    eval_results_path,
    pinned_suite,
)
from evaluations.example_scorers import (
    outcome_from_program,
    parse_scorer_spec,
    program_payload,
    score_example,
)

REQUEST_TIMEOUT_S = 900.0


def request_body(example: dict, *, adapter: str | None, generation: dict, seed: int) -> dict:
    """The exact /v1/chat/completions body for one example (pure; unit-tested)."""
    body = {
        "model": "kiln", "messages": example["messages"], "n": 1, "stream": False, "seed": seed,
        "max_tokens": generation["max_tokens"], "temperature": generation["temperature"],
        "top_p": generation["top_p"], "top_k": generation["top_k"], "min_p": generation["min_p"],
        "repetition_penalty": generation["repetition_penalty"],
        "presence_penalty": generation["presence_penalty"], "frequency_penalty": generation["frequency_penalty"],
        "stop": list(generation["stop"]), "adapter": adapter,
        "chat_template_kwargs": {"enable_thinking": bool(generation["thinking"])},
        "rollout_provenance": True,
    }
    if generation.get("thinking_budget_tokens") is not None:
        body["thinking_budget_tokens"] = generation["thinking_budget_tokens"]
    return body


def check_provenance(provenance, *, seed: int, model: dict, target: dict) -> list[int] | None:
    """The completion's token ids from its provenance record, after holding the record to the job."""
    if not isinstance(provenance, dict):
        return None
    policy = provenance.get("behavior_policy") or {}
    if policy.get("base_model_sha256") != model["base_model_sha256"] or \
            policy.get("inference_config_sha256") != model["inference_config_sha256"]:
        raise KilnError("eval_model_changed", f"the GPU worker now serves {policy.get('base_model_sha256')} "
                        f"({policy.get('inference_config_sha256')}); the job was submitted for "
                        f"{model['base_model_sha256']} ({model['inference_config_sha256']})")
    served = (policy.get("adapter") or {}).get("content_sha256")
    if target.get("adapter") is None and served is not None:
        raise KilnError("eval_adapter_changed", "the base model was asked for, but an adapter answered")
    if target.get("adapter") is not None and target.get("content_sha256") and served != target["content_sha256"]:
        raise KilnError("eval_adapter_changed", f"adapter {target['adapter']!r} is now {served}; the job was "
                        f"submitted for {target['content_sha256']}")
    if int(provenance.get("seed", -1)) != seed:
        raise KilnError("eval_seed_mismatch", f"the response was sampled with seed {provenance.get('seed')}, not {seed}")
    ids = provenance.get("input_token_ids") or []
    return [int(t) for t in ids[int(provenance.get("prompt_token_count", 0)):]]


def _scorers(payload: EvalJobPayload) -> dict[str, Path]:
    from evaluations.selectors import scorer_get, scorer_path

    paths = {}
    for name, pinned in (payload.suite.get("scorers") or {}).items():
        scorer = scorer_get(name=name)
        if scorer is None:
            raise KilnError("scorer_not_found", f"no registered scorer named {name!r}")
        path = scorer_path(scorer=scorer)
        try:
            digest = sha256_digest(path.read_bytes())
        except OSError as exc:
            raise KilnError("scorer_not_found", f"the scorer file {path} cannot be read: {exc}") from None
        if digest != pinned or digest != scorer.sha256:
            raise KilnError("scorer_changed", f"scorer {name!r} is not the file pinned at submission ({pinned})")
        paths[name] = path
    return paths


def score(spec, completion: str, example: dict, scorers: dict[str, Path]):
    """One outcome: a built-in scorer, or the registered program in the sandbox."""
    target = example.get("target")
    target = None if target is None else str(target)
    if not spec.needs_program:
        return score_example(spec, completion, target, example)
    from evaluations.sandbox import ScorerLimits, run_scorer

    try:
        verdict = run_scorer(scorers[spec.scorer], program_payload(example, completion, target),
                             limits=ScorerLimits(), unsandboxed=False, cwd=None)
    except Exception as exc:  # noqa: BLE001 - ScorerError and anything else: that example's error
        verdict = exc
    return outcome_from_program(verdict, spec.to_dict())


def _sample(body: dict) -> tuple[dict | None, KilnError | None]:
    from adapters.serving.sync_client import chat_completion_sync

    try:
        return chat_completion_sync(body, timeout=REQUEST_TIMEOUT_S), None
    except KilnError as exc:
        if exc.status >= 500:
            raise
        return None, exc


def evaluate_one(example: dict, *, index: int, target: dict, payload: EvalJobPayload, spec,
                 scorers: dict[str, Path]) -> dict:
    seed = example_seed(payload.seed, example["id"])
    record = {"target_index": index, "target": target_label(target.get("adapter")), "example_id": example["id"],
              "seed": str(seed)}
    response, refused = _sample(request_body(example, adapter=target.get("adapter"), generation=payload.generation,
                                             seed=seed))
    if refused is not None and refused.code == "adapter_not_found" and target.get("adapter"):
        # Deleted while the job ran: its remaining examples would all read `error` and the job still end
        # `completed`, with an accuracy of 0 for an adapter that was never asked.
        raise KilnError("eval_adapter_changed", f"adapter {target['adapter']!r} was deleted while the job ran; the "
                        f"job was submitted for {target.get('content_sha256')}")
    if refused is not None:
        return {**record, "outcome": "error", "detail": f"request refused ({refused.code}): {refused.message}"[:500],
                "completion": None, "completion_token_ids": None, "finish_reason": None, "usage": None}
    choice = response["choices"][0]
    message = choice.get("message") or {}
    completion = message.get("content") or ""
    token_ids = check_provenance(choice.get("rollout_provenance"), seed=seed, model=payload.model, target=target)
    outcome = score(spec, completion, example, scorers)
    record.update({"outcome": outcome.kind, "detail": outcome.detail, "completion": completion,
                   "completion_token_ids": token_ids, "finish_reason": choice.get("finish_reason"),
                   "usage": response.get("usage")})
    if message.get("reasoning_content") is not None:
        record["reasoning_content"] = message["reasoning_content"]
    return record


def summarize(records: list[dict], labels: list[str]) -> dict:
    """Counts per outcome (all targets together and per target) and accuracy = pass / total."""
    def block(rows):
        counts = {k: 0 for k in OUTCOME_KINDS}
        for row in rows:
            counts[row["outcome"]] += 1
        total = len(rows)
        return {"counts": counts, "total": total, "accuracy": counts["pass"] / total if total else None}

    per_target = [{"index": i, "label": label, **block([r for r in records if r["target_index"] == i])}
                  for i, label in enumerate(labels)]
    return {**block(records), "targets": per_target}


def outcome_table(records: list[dict], n_targets: int) -> list[dict]:
    """One row per example id (suite order): its outcome for each target, paired by example id."""
    rows: dict[str, list] = {}
    for record in records:
        rows.setdefault(record["example_id"], [None] * n_targets)[record["target_index"]] = record["outcome"]
    return [{"example_id": example_id, "outcomes": outcomes,
             "agree": len(set(outcomes)) == 1} for example_id, outcomes in rows.items()]


def _replay_source(payload: EvalJobPayload) -> list[dict]:
    source = eval_job_get(job_id=(payload.origin or {}).get("job_id", ""))
    records = eval_records(job=source) if source is not None else None
    if records is None:
        raise KilnError("eval_replay_source_missing", f"the results of job {(payload.origin or {}).get('job_id')} "
                        "cannot be read (deleted, or the file changed)")
    return records


def _progress(ctx, done: int, total: int, records: list[dict], label: str) -> None:
    counts = {k: 0 for k in OUTCOME_KINDS}
    for record in records:
        counts[record["outcome"]] += 1
    metrics = {"examples_done": done, "examples_total": total, **counts}
    if done:
        metrics["accuracy"] = counts["pass"] / done
    ctx.report_progress(0.02 + 0.95 * done / total, f"{done}/{total} scored · {label}", metrics=metrics)


def run_eval_job(ctx) -> dict:
    """Sample, score and publish every (target, example) of the job; returns the summary."""
    payload = EvalJobPayload.of(ctx.job)
    document = pinned_suite(payload=payload)
    if document is None:
        raise KilnError("eval_suite_changed", f"the pinned suite {payload.suite['path']} is missing or no longer "
                        f"hashes to {payload.suite['sha256']}")
    examples = document["examples"]
    specs = [parse_scorer_spec(e.get("scorer") or document["scorer"]) for e in examples]
    scorers = _scorers(payload)
    original = _replay_source(payload) if payload.mode == "replay" else None
    output = eval_results_path(job_id=ctx.job_id)
    if output.exists():
        raise KilnError("eval_results_exist", f"{output} already exists")
    wait_for_inference_ready(ctx)
    total = len(examples) * len(payload.targets)
    records: list[dict] = []
    _progress(ctx, 0, total, records, "sending requests")
    for index, target in enumerate(payload.targets):
        for example, spec in zip(examples, specs, strict=True):
            ctx.raise_if_stopped()
            records.append(evaluate_one(example, index=index, target=target, payload=payload, spec=spec,
                                        scorers=scorers))
            _progress(ctx, len(records), total, records, f"{target_label(target.get('adapter'))} · {example['id']}")
    summary = summarize(records, payload.labels)
    results = {
        "schema": RESULTS_SCHEMA, "job_id": ctx.job_id, "mode": payload.mode,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "suite": payload.suite, "targets": [{**t, "index": i, "label": target_label(t.get("adapter"))}
                                            for i, t in enumerate(payload.targets)],
        "generation": payload.generation, "model": payload.model,
        "effective_generation_hash": payload.effective_generation_hash, "origin": payload.origin,
        "summary": summary, "table": outcome_table(records, len(payload.targets)), "records": records,
    }
    if original is not None:
        results["replay"] = replay_verdict(original, records)
    data = json_bytes(results)
    ctx.begin_publishing()  # a cancelled job publishes nothing; a later cancel is refused
    ctx.report_progress(0.98, "publishing results.json")
    ensure_dir(output.parent)
    write_file(output, data, mode=0o444, exclusive=True)
    result = {"results_path": str(output), "results_sha256": sha256_digest(data), "mode": payload.mode,
              "suite_name": payload.suite["name"], "suite_hash": payload.suite["suite_hash"],
              "effective_generation_hash": payload.effective_generation_hash, **summary}
    if original is not None:
        result["replay"] = results["replay"]
    accuracy = summary["accuracy"]
    ctx.log(f"scored {summary['total']} completions: " + ", ".join(f"{k} {v}" for k, v in summary["counts"].items())
            + (f"; accuracy {accuracy:.3f}" if accuracy is not None else ""))
    return result
