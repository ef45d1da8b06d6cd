"""`kiln model create-tiny DIR [--seed N]`: build the small deterministic demo/test model (local)."""

from __future__ import annotations

from pathlib import Path


def add_parser(subparsers) -> None:
    model = subparsers.add_parser("model", help="model utilities (local)")
    sub = model.add_subparsers(dest="model_command", required=True)
    tiny = sub.add_parser("create-tiny", help="build a tiny Qwen3-architecture model with its own tokenizer")
    tiny.add_argument("dir", type=Path, help="directory to create (must not hold another model)")
    tiny.add_argument("--seed", type=int, default=0, help="the same seed gives the same files")
    tiny.add_argument("--warm-steps", type=int, default=None, help="warm-up steps (default: the documented recipe)")
    tiny.add_argument("--force", action="store_true", help="replace an existing model in DIR")
    model.set_defaults(handler=run)


def run(args) -> int:
    import json

    from kiln_project.cli.client import CliError

    target = args.dir.expanduser().resolve()
    if (target / "config.json").exists() and not args.force:
        raise CliError("model_exists", f"{target} already holds a model", "pass --force to rebuild it")
    if args.seed < 0:
        raise CliError("invalid_seed", "--seed must be a non-negative integer")
    from gpu_runtime.tiny_model import create_tiny_model  # torch: only this local command loads it

    kwargs = {"seed": args.seed, "overwrite": args.force}
    if args.warm_steps is not None:
        kwargs["warm_steps"] = args.warm_steps
    summary = create_tiny_model(target, **kwargs)
    print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    print(f"tiny model written to {target}")
    return 0
