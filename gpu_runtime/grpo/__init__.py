"""GRPO maths and configuration (issue 4): the pieces the trainer loop calls.

- `config`      GrpoConfig: every field of spec §3, defaults, validation, to_dict for receipts
                (nested parts and value checks in `config_values`). Pure Python, no torch, so
                submission code can validate without loading torch.
- `submission`  config + post_eval + dry_run from a request body. Pure Python.
- `advantages`  group advantages (dr_grpo / vanilla), dynamic sampling, reward-variance filters.
                Pure Python.
- `masks`       action / observation (env) token masks from trajectory segments (spec §2.2).
                Pure Python; the chat renderer and tokenizer are passed in as callables.
- `losses`      the per-step maths of spec §3.1: token PPO / GSPO / CISPO surrogates, KL k1/k3
                with the entropy-aware quantile gate, aggregation, ECHO, no_policy_loss.
- `audit`       the `kiln.grpo-policy-audit.v1` accumulator fed by `grpo_loss` stats. Pure Python.
- `reference`   next-token log-probs and the shared-prefix (KV cache) reference forward.

Imports no Django. This package file deliberately imports nothing, so that importing the
pure-Python modules never pulls in torch.
"""
