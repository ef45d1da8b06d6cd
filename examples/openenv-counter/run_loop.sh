#!/usr/bin/env bash
# The OpenEnv guide's loop on the counter (serve_env.sh), run against a running Kiln:
#   inspect -> collect seed groups with the base model -> train a LoRA with GRPO -> evaluate base
#   against the adapter on held-out seeds with the paired sign-test gate -> verify the files offline.
#
# Environment (all optional):
#   KILN_URL         Kiln server (default http://127.0.0.1:8420); KILN_API_TOKEN its bearer token
#   KILN             how to run the CLI (default `kiln`; e.g. "python -m kiln_project.cli.main")
#   ENV_URL          the environment (default http://127.0.0.1:8990)
#   ADAPTER          the adapter to train (default counter-agent); every run needs a new name
#   TRAIN_GROUPS     training seed groups of 8 episodes (default 64; not GROUPS, which bash sets to your group ids)
#   EVAL_GROUPS      held-out seed groups of 4 episodes per side (default 80; the gate needs >= 20)
#   MIN_IMPROVEMENT  the gate's least mean-return improvement (default 0.1)
#   TRAINING_CONFIG  a GrpoConfig JSON file (default training-config.json here: AdamW 3e-4, seed 3)
#   POST_EVAL_SUITE  an installed eval suite to run after training too ("prove it after training"): a
#                    diagnostic here, since the environment gate owns promotion (default: none)
#   OUT              where the episodes, replay and summary go (default ./openenv-counter-runs)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
read -r -a kiln <<<"${KILN:-kiln}"
env_url="${ENV_URL:-http://127.0.0.1:8990}"
adapter="${ADAPTER:-counter-agent}"
out="${OUT:-$PWD/openenv-counter-runs}"
mkdir -p "$out"

"${kiln[@]}" openenv inspect --environment "$env_url"

# One move per episode (--max-steps 1) on targets 1..3 (reset.json): the return is the step reward,
# |target| - |target - delta|, which the tiny demo model learns in one CPU round. Thinking is off: the
# tiny model's reasoning is noise. A real model can take the environment's own defaults.
"${kiln[@]}" openenv train --environment "$env_url" --output-adapter "$adapter" \
  --groups "${TRAIN_GROUPS:-64}" --group-size 8 --seed-start 0 --max-steps 1 --max-action-tokens 32 \
  --concurrency 16 --thinking false --lora-rank 8 \
  --training-config "${TRAINING_CONFIG:-$here/training-config.json}" --reset-options "$here/reset.json" \
  --eval-groups "${EVAL_GROUPS:-80}" --eval-group-size 4 --gate --gate-min-mean-improvement "${MIN_IMPROVEMENT:-0.1}" \
  ${POST_EVAL_SUITE:+--post-eval-suite "$POST_EVAL_SUITE"} \
  --output "$out/$adapter.rollouts.jsonl" --replay-output "$out/$adapter.replay.json" \
  --summary-output "$out/$adapter.summary.json"

# The three files `train` downloaded, audited offline (hashes, groups, transcript).
"${kiln[@]}" openenv verify --summary "$out/$adapter.summary.json" --dataset "$out/$adapter.rollouts.jsonl" \
  --replay "$out/$adapter.replay.json"
