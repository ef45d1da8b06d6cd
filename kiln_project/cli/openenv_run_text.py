"""What `kiln openenv status`, `--follow`, `train` and `rollout` print of a run: one-line texts built
from a run's status (GET /v1/openenv/runs/{id}) and a rollout's statistics. Formatting only."""

from __future__ import annotations


def return_text(status: dict) -> str:
    stats = status.get("rollout_stats") or {}
    if "mean_episode_return" not in stats:
        return ""
    low, high = stats.get("min_episode_return"), stats.get("max_episode_return")
    span = f" [{low:.4g}, {high:.4g}]" if low is not None and high is not None else ""
    return f" · return mean {stats['mean_episode_return']:.4g}{span}"


def trainer_text(status: dict) -> str:
    training = status.get("training")
    if not training:
        return ""
    text = f" · trainer {training['state']} {100 * (training.get('progress') or 0):.0f}%"
    if training.get("step") is not None and training.get("total_steps"):
        text += f" step {training['step']}/{training['total_steps']}"
    if isinstance(training.get("current_loss"), int | float):
        text += f" loss {training['current_loss']:.4g}"
    return text


def evaluation_text(status: dict) -> str:
    """The environment evaluation's side and groups done, then its decision with the exact p and counts."""
    block = status.get("environment_evaluation")
    if not block:
        return ""
    evidence = block.get("evidence")
    if evidence:
        return (f" · env eval {evidence['decision']}: return {evidence['baseline_mean_return']:.4g} -> "
                f"{evidence['candidate_mean_return']:.4g}, improved {evidence['improved_groups']} regressed "
                f"{evidence['regressed_groups']} tied {evidence['tied_groups']}, p "
                f"{evidence['exact_sign_test_p_value']:.4g}"
                + (f" · {block['outcome']}" if block.get("outcome") else ""))
    p = block.get("progress") or {}
    side = f" {p['side']}" if p.get("side") else ""
    return (f" · env eval {block['state']}{side} {p.get('groups_completed', 0)}/{p.get('groups_total', 0)} groups")


def progress_line(status: dict) -> str:
    p = status.get("progress") or {}
    where = status["state"] + (f" ({status['stage']})" if status.get("stage") else "")
    position = (status.get("admission") or {}).get("queue_position")
    queued = f" · position {position}" if position else ""
    return (f"{where}{queued} · groups {p.get('groups_completed', 0)}/{p.get('groups_total', 0)} · rollouts "
            f"{p.get('rollouts_completed', 0)}/{p.get('rollouts_total', 0)}{return_text(status)}"
            f"{trainer_text(status)}{evaluation_text(status)}")


def stats_lines(stats: dict) -> tuple[str, str]:
    """(the published returns, the episodes' outcomes and costs) of a run's or a rollout's statistics:
    what `status`, `status --follow` and `rollout` print (the dashboard card shows the same figures)."""
    returns = f"mean {stats['mean_episode_return']:.4g}"
    if stats.get("min_episode_return") is not None:
        returns += f", range [{stats['min_episode_return']:.4g}, {stats['max_episode_return']:.4g}]"
    episodes = (f"done {stats['done_count']}, max_steps {stats['max_steps_count']}, invalid "
                f"{stats['invalid_model_action_count']}, protocol {stats['protocol_error_count']}; "
                f"recoveries {stats.get('recoverable_protocol_error_count', 0)}, capacity retries "
                f"{stats.get('capacity_retry_count', 0)}; {stats['total_environment_steps']} steps, "
                f"{stats['total_model_tokens']} policy tokens, mean policy latency "
                f"{stats.get('mean_model_latency_ms', 0.0):.0f} ms")
    return returns, episodes


def post_eval_text(evaluation: dict) -> str:
    """One post-evaluation (§1.6 post_evaluations): the eval job, its progress and accuracy, the gate."""
    text = (f"{evaluation.get('suite_name')} job {evaluation['job_id']}: {evaluation['state']} "
            f"{evaluation.get('examples_completed', 0)}/{evaluation.get('examples_total', 0)} examples")
    if isinstance(evaluation.get("headline_accuracy"), int | float):
        text += f" · accuracy {evaluation['headline_accuracy']:.4g}"
    if evaluation.get("gate_outcome"):
        text += f" · gate {evaluation['gate_outcome']}"
    if evaluation.get("error"):
        text += f" · {evaluation['error'].get('code')}: {evaluation['error'].get('message')}"
    return text


def failure_lines(failure: dict) -> list[str]:
    """A typed failure (kiln.openenv-run-failure.v1): code, stage, retryability and message, then the
    peer's evidence (protocol code, HTTP status) when present, then the hint."""
    lines = [f"failure   {failure['code']} at {failure['stage']} (retryable {str(failure['retryable']).lower()}): "
             f"{failure['message']}"]
    evidence = [f"protocol code {failure['protocol_code']}" if failure.get("protocol_code") else "",
                f"HTTP {failure['http_status']}" if failure.get("http_status") is not None else ""]
    if any(evidence):
        lines.append(f"evidence  {', '.join(part for part in evidence if part)}")
    if failure.get("hint"):
        lines.append(f"hint      {failure['hint']}")
    return lines
