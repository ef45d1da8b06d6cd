"""The pure core of `kiln rollout-generate`: recorded-policy rollouts for GRPO (reference-spec §1.7, §2.1-§2.3).

- `template`    tasks, the request template, placeholder substitution, owned-field refusals,
                one checked chat-completions body per (task, seed);
- `validation`  every response checked against its request (seed, adapter, prompt and content
                digests, token/action coverage, usage, tokenizer/template/behavior identity,
                sampling controls, backend), and across the run;
- `generate`    planning and the concurrent request -> validate -> score loop (transport and
                scorer are injected callables);
- `corpus`      canonical GRPO groups, the JSONL bytes, the summary and its statistics;
- `publish`     atomic publication of several files together (hidden siblings, fsync, rename,
                roll back).

Imports no Django, no torch and no HTTP client; `kiln_project.cli.rollout_cmd` wires in KilnClient
and the scorer sandbox (`evaluations.sandbox`).
"""
