#!/usr/bin/env bash
# The GRPO training guide's recorded-policy workflow (steps 1-7), run against a running Kiln.
#
#   round 1: rollouts from the base model -> recorded-policy training -> adapter ${PREFIX}-r001
#   round 2: rollouts from ${PREFIX}-r001  -> training from ${PREFIX}-r001 -> adapter ${PREFIX}-r002
#
# Environment (all optional):
#   KILN_URL         server (default http://127.0.0.1:8420)
#   KILN_API_TOKEN   bearer token (`kiln token create USER`), sent by the CLI and by curl
#   KILN             how to run the CLI (default `kiln`; e.g. "python -m kiln_project.cli.main")
#   PREFIX           adapter name prefix (default math); every round needs a new name
#   SEEDS            completions per task (default 8)
#   OUT              where the rollouts and summaries go (default ./grpo-math-runs in the folder you
#                    run this from). The server reads the rollouts file itself, and by default only
#                    under the folder `kiln serve` was started in (and KILN_HOME): run this from there.
#   TRAIN_CONFIG     extra JSON merged into config for both rounds (default {}), e.g. '{"lora_rank": 4}'
#   HELDOUT_SEEDS    if > 0, score base and round one on heldout-tasks.jsonl (never trained on)
#                    before round two, as a rough sanity check (default 4; 0 skips it). It is not
#                    a promotion gate: use a held-out eval suite and post_eval for that.
#   HELDOUT_GATE     1: stop before round two when round one scored lower than base on the
#                    held-out tasks (default 0: print a warning and continue)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
url="${KILN_URL:-http://127.0.0.1:8420}"
url="${url%/}"
read -r -a kiln <<<"${KILN:-kiln}"
prefix="${PREFIX:-math}"
seeds="${SEEDS:-8}"
out="${OUT:-$PWD/grpo-math-runs}"
train_config="${TRAIN_CONFIG:-{\}}"
heldout_seeds="${HELDOUT_SEEDS:-4}"
heldout_gate="${HELDOUT_GATE:-0}"
mkdir -p "$out"

auth=()
if [[ -n "${KILN_API_TOKEN:-}" ]]; then
  auth=(-H "Authorization: Bearer $KILN_API_TOKEN")
fi

# 1-3. Tasks, request template and scorer live next to this script.
tasks="$here/tasks.jsonl"
template="$here/request.json"
scorer="$here/score_math.py"
[[ -x "$scorer" ]] || { echo "make the scorer executable: chmod +x $scorer" >&2; exit 1; }

# 4. Generate scored rollouts (atomic: both files or neither).
generate() {  # generate ADAPTER SEED_START NAME [TASKS]
  "${kiln[@]}" rollout-generate \
    --url "$url" \
    --adapter "$1" \
    --thinking false \
    --tasks "${4:-$tasks}" \
    --seeds "${5:-$seeds}" \
    --seed-start "$2" \
    --request-template "$template" \
    --scorer "$scorer" \
    --output "$out/$3.rollouts.jsonl" \
    --summary-output "$out/$3.summary.json"
}

reward_spread() {  # reward_spread NAME: the guide's jq check, plus groups without reward contrast
  jq '.stats | {mean_reward, min_reward, max_reward, groups, groups_without_contrast}' "$out/$1.summary.json"
  if [[ "$(jq '.stats.groups_without_contrast == .stats.groups' "$out/$1.summary.json")" == "true" ]]; then
    echo "every completion of every task got the same reward: no GRPO signal; improve diversity or the reward" >&2
    exit 1
  fi
}

# 5. Submit recorded-policy training over HTTP; the server reads the JSONL, so pass an absolute path.
submit() {  # submit NAME OUTPUT_NAME [BASE_ADAPTER] -> prints the job id
  local rollouts_path body response
  rollouts_path="$(realpath "$out/$1.rollouts.jsonl")"
  body="$(jq -n --arg path "$rollouts_path" --arg output "$2" --arg base "${3:-}" \
    --argjson extra "$train_config" '{
      dataset_path: $path,
      config: ({
        behavior_policy: "recorded",
        output_name: $output,
        auto_load: false,
        checkpoint_interval: 25
      } + (if $base == "" then {} else {base_adapter: $base} end) + $extra)
    }')"
  response="$(curl --fail-with-body -sS "$url/v1/train/grpo" "${auth[@]}" \
    -H 'Content-Type: application/json' -d "$body")" || { echo "$response" >&2; exit 1; }
  jq -r '.job_id' <<<"$response"
}

# 6. Wait for a terminal state.
wait_for() {  # wait_for JOB_ID
  local detail state
  while :; do
    detail="$(curl --fail-with-body -sS "$url/v1/train/jobs/$1" "${auth[@]}")"
    state="$(jq -r '.state' <<<"$detail")"
    printf '%s %s\n' "$1" "$state" >&2
    case "$state" in
      completed) break ;;
      failed|cancelled)
        jq '{state, error}' <<<"$detail" >&2
        exit 1
        ;;
    esac
    sleep 2
  done
  jq '{state, adapter_name, adapter_path, linked_eval_job_ids, gate_outcome,
       recorded: .train_receipt.grpo.policy_audit.recorded_provenance
         | {completion_count, sampled_action_tokens, forced_action_tokens, unique_behavior_sources}}' \
    <<<"$detail"
}

echo "== round 1: rollouts from the base model" >&2
generate base 42 "$prefix-r001"
reward_spread "$prefix-r001"
job="$(submit "$prefix-r001" "$prefix-r001")"
printf 'queued %s\n' "$job" >&2
wait_for "$job"

if (( heldout_seeds > 0 )); then
  echo "== held-out sanity check (not trained on, not a promotion gate)" >&2
  generate base 1000 "heldout-base" "$here/heldout-tasks.jsonl" "$heldout_seeds" >/dev/null
  generate "$prefix-r001" 1000 "heldout-$prefix-r001" "$here/heldout-tasks.jsonl" "$heldout_seeds" >/dev/null
  jq -n --slurpfile b "$out/heldout-base.summary.json" --slurpfile c "$out/heldout-$prefix-r001.summary.json" \
    '{heldout_mean_reward: {base: $b[0].stats.mean_reward, candidate: $c[0].stats.mean_reward}}'
  worse="$(jq -n --slurpfile b "$out/heldout-base.summary.json" \
    --slurpfile c "$out/heldout-$prefix-r001.summary.json" '$c[0].stats.mean_reward < $b[0].stats.mean_reward')"
  if [[ "$worse" == "true" ]]; then
    echo "warning: $prefix-r001 scored lower than the base model on the held-out tasks;" \
      "the guide says to continue only from an accepted adapter" >&2
    if [[ "$heldout_gate" == "1" ]]; then
      exit 1
    fi
  fi
fi

# 7. Continue from the accepted adapter: rollouts sampled with it, training warm-started from it.
echo "== round 2: rollouts from $prefix-r001" >&2
generate "$prefix-r001" 50 "$prefix-r002"
reward_spread "$prefix-r002"
job="$(submit "$prefix-r002" "$prefix-r002" "$prefix-r001")"
printf 'queued %s\n' "$job" >&2
wait_for "$job"
echo "done: review $prefix-r002 against $prefix-r001 on a held-out suite before promoting it" >&2
