"""The chain verifier's link that needs the post-eval gate's own code (`adapters.verify` sits below
training and evaluations, so it cannot import them; `adapters.verify` discovers this module).

`post_eval.gate_decision`: the gate decision recomputed from the eval job's results file with the
same arms (`training.post_eval_jobs._arms`) and the same policy (`evaluations.gate.paired_wilson_v1`,
`final_outcome`) must equal the evidence the gate receipt recorded, field for field.
"""

from __future__ import annotations

from adapters.verify import Chain, broken, ok, register_link


@register_link("post_eval.gate_decision", after="post_eval.gate_receipt")
def gate_decision(chain: Chain):
    from evaluations.eval_selectors import eval_records
    from evaluations.gate import final_outcome, paired_wilson_v1
    from training.post_eval_jobs import PostEvalJobPayload, _arms

    link = "post_eval.gate_decision"
    job = chain.post_eval_job
    if not chain.gated or job is None or job.state != "completed":
        return ok(link, "no gate decided")
    row = chain.gate_row
    recorded = (row.body.get("evidence") if row is not None and isinstance(row.body, dict) else None) \
        or (chain.post_eval_result.get("post_eval_gate_evidence") or [None])[0]
    if not recorded:
        return broken(link, "the gate recorded no evidence")
    if not chain.eval_jobs:
        if recorded.get("outcome") == "error":
            return ok(link, f"the gate ended in error before any evaluation: {recorded.get('reason')}")
        return broken(link, f"the gate recorded {recorded.get('outcome')!r} without an eval job", "error",
                      recorded.get("outcome"))
    eval_job = chain.eval_jobs[0]
    if eval_job is None:
        return broken(link, "cannot be recomputed: the eval job is gone")
    records = eval_records(job=eval_job) if eval_job.state == "completed" else None
    if records is None:
        if recorded.get("outcome") == "error":
            return ok(link, f"the evaluation ended {eval_job.state}; the gate recorded error")
        return broken(link, "cannot be recomputed: the eval job's results file is missing or altered")
    payload = PostEvalJobPayload.of(job)
    baseline, candidate = _arms(payload, eval_job, records)
    gate = paired_wilson_v1(baseline=baseline, candidate=candidate, eval_job_id=str(eval_job.uuid),
                            min_accuracy=payload.post_eval.min_accuracy, candidate_adapter=payload.adapter_name)
    outcome = final_outcome(gate.decision, payload.auto_load)
    expected = {**gate.evidence, "suite_policy": payload.post_eval.data_scope, "outcome": outcome}
    if expected != recorded:
        changed = sorted(k for k in set(expected) | set(recorded) if expected.get(k) != recorded.get(k))
        return broken(link, f"recomputed from results.json the gate differs in {', '.join(changed)}",
                      {k: expected.get(k) for k in changed}, {k: recorded.get(k) for k in changed})
    if chain.post_eval_result.get("gate_outcome") != outcome:
        return broken(link, "the post-eval job's gate_outcome is not the recomputed one", outcome,
                      chain.post_eval_result.get("gate_outcome"))
    return ok(link, f"recomputed {gate.evidence['policy_version']}: {outcome} (improved {gate.evidence['improved']}, "
              f"regressed {gate.evidence['regressed']}, {gate.evidence['paired_examples']} paired)", outcome, outcome)
