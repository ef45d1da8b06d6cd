"""`kiln model create-tiny DIR [--rebuild] [--seed N]`: install the demo/test model (local).

By default the shipped release is copied and verified byte for byte, so every machine serves the
same model in seconds. `--rebuild` (implied by `--seed`, `--warm-steps`, `--schema-steps` or `--value-steps`) runs the
recipe instead, which takes minutes and gives bytes that depend on the CPU. `--first-phase MODEL_DIR`
runs only the recipe's second phase from a model whose first phase was built already, and
`--second-phase MODEL_DIR` only its third phase from a model that ran the second, and
`--third-phase MODEL_DIR` only the sharpening that ends the recipe (this is how the release was cut:
each step from the release before it, byte for byte).
"""

from __future__ import annotations

from pathlib import Path


def add_parser(subparsers) -> None:
    model = subparsers.add_parser("model", help="model utilities (local)")
    sub = model.add_subparsers(dest="model_command", required=True)
    tiny = sub.add_parser(
        "create-tiny", help="install the tiny demo model (the shipped release, or --rebuild from its recipe)"
    )
    tiny.add_argument("dir", type=Path, help="directory to create (must not hold another model)")
    tiny.add_argument("--rebuild", action="store_true",
                      help="build from the recipe instead of copying the release (minutes; CPU-dependent bytes)")
    tiny.add_argument("--seed", type=int, default=None, help="recipe seed (implies --rebuild; default 0)")
    tiny.add_argument("--warm-steps", type=int, default=None,
                      help="recipe warm-up steps (implies --rebuild; default: the documented recipe)")
    tiny.add_argument("--schema-steps", type=int, default=None,
                      help="second-phase steps, OpenEnv actions under random schemas (implies --rebuild; "
                           "default: the documented recipe)")
    tiny.add_argument("--value-steps", type=int, default=None,
                      help="third-phase steps, the values a schema allows: enum members, integer bounds (implies "
                           "--rebuild; default: the documented recipe)")
    phases = tiny.add_mutually_exclusive_group()
    phases.add_argument("--first-phase", type=Path, default=None, metavar="MODEL_DIR",
                        help="run only the second phase, starting from the model in MODEL_DIR (a first-phase build, "
                             "such as an earlier release); needs --schema-steps")
    phases.add_argument("--second-phase", type=Path, default=None, metavar="MODEL_DIR",
                        help="run only the third phase, starting from the model in MODEL_DIR (a model that ran the "
                             "second phase, such as an earlier release), without the sharpening that follows it "
                             "(--third-phase); needs --value-steps")
    phases.add_argument("--third-phase", type=Path, default=None, metavar="MODEL_DIR",
                        help="run only the recipe's last step, the sharpening (logits times the recipe's "
                             "logit_scale), on the model in MODEL_DIR (a model that ran the third phase)")
    tiny.add_argument("--force", action="store_true", help="replace an existing model in DIR")
    model.set_defaults(handler=run)


def run(args) -> int:
    import json

    from kiln_project.cli.client import CliError

    target = args.dir.expanduser().resolve()
    if (target / "config.json").exists() and not args.force:
        raise CliError("model_exists", f"{target} already holds a model", "pass --force to replace it")
    if target.exists() and not target.is_dir():
        raise CliError("model_dir_invalid", f"{target} exists and is not a directory")
    if args.seed is not None and args.seed < 0:
        raise CliError("invalid_seed", "--seed must be a non-negative integer")
    if args.warm_steps is not None and args.warm_steps < 0:
        raise CliError("invalid_warm_steps", "--warm-steps must be a non-negative integer")
    if args.schema_steps is not None and args.schema_steps < 0:
        raise CliError("invalid_schema_steps", "--schema-steps must be a non-negative integer")
    if args.value_steps is not None and args.value_steps < 0:
        raise CliError("invalid_value_steps", "--value-steps must be a non-negative integer")
    if args.first_phase is not None:
        summary = _second_phase_only(target, args)
    elif args.second_phase is not None:
        summary = _third_phase_only(target, args)
    elif args.third_phase is not None:
        summary = _sharpening_only(target, args)
    elif args.rebuild or any(value is not None for value in (args.seed, args.warm_steps, args.schema_steps,
                                                             args.value_steps)):
        summary = _rebuild(target, args)
    else:
        from gpu_runtime.tiny_release import TinyReleaseError, install

        try:
            summary = install(target, replace=args.force)
        except TinyReleaseError as exc:
            raise CliError(exc.code, exc.message, "reinstall Kiln, or rebuild with --rebuild") from None
        except FileExistsError as exc:
            raise CliError("model_dir_not_empty", str(exc), "choose an empty directory or pass --force") from None
    print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    print(f"tiny model written to {target} ({summary['source']}, model digest {summary['model_sha256']})")
    return 0


def _rebuild(target: Path, args) -> dict:
    from gpu_runtime.tiny_model import create_tiny_model  # torch: only this local command loads it
    from gpu_runtime.tiny_release import make_manifest, read_manifest
    from kiln_project.cli.client import CliError

    kwargs = {"seed": args.seed or 0, "overwrite": args.force}
    if args.warm_steps is not None:
        kwargs["warm_steps"] = args.warm_steps
    if args.schema_steps is not None:
        kwargs["schema_steps"] = args.schema_steps
    if args.value_steps is not None:
        kwargs["value_steps"] = args.value_steps
    try:
        summary = create_tiny_model(target, **kwargs)
    except FileExistsError as exc:
        raise CliError("model_dir_not_empty", str(exc), "choose an empty directory or pass --force") from None
    except ValueError as exc:
        raise CliError("invalid_value_steps", str(exc), "--value-steps needs --schema-steps above 0") from None
    digest = make_manifest(target)["model_sha256"]
    shipped = read_manifest()["model_sha256"]
    summary.update(source="recipe", model_sha256=digest, matches_release=digest == shipped)
    return summary


def _second_phase_only(target: Path, args) -> dict:
    from gpu_runtime.tiny_phases import continue_with_second_phase
    from kiln_project.cli.client import CliError

    if not args.schema_steps:
        raise CliError("invalid_schema_steps", "--first-phase needs --schema-steps N with N > 0")
    if args.value_steps is not None:
        raise CliError("invalid_first_phase", "--first-phase runs only the second phase", "drop --value-steps")
    return _one_phase(target, args, args.first_phase, "invalid_first_phase",
                      lambda source: continue_with_second_phase(source, target, schema_steps=args.schema_steps,
                                                                overwrite=args.force))


def _third_phase_only(target: Path, args) -> dict:
    from gpu_runtime.tiny_phases import continue_with_third_phase
    from kiln_project.cli.client import CliError

    if not args.value_steps:
        raise CliError("invalid_value_steps", "--second-phase needs --value-steps N with N > 0")
    if args.schema_steps is not None:
        raise CliError("invalid_second_phase", "--second-phase runs only the third phase", "drop --schema-steps")
    return _one_phase(target, args, args.second_phase, "invalid_second_phase",
                      lambda source: continue_with_third_phase(source, target, value_steps=args.value_steps,
                                                               overwrite=args.force))


def _sharpening_only(target: Path, args) -> dict:
    from gpu_runtime.tiny_phases import continue_with_sharpening
    from kiln_project.cli.client import CliError

    if args.schema_steps is not None or args.value_steps is not None:
        raise CliError("invalid_third_phase", "--third-phase trains nothing; it only sharpens that model",
                       "drop --schema-steps and --value-steps")
    return _one_phase(target, args, args.third_phase, "invalid_third_phase",
                      lambda source: continue_with_sharpening(source, target, overwrite=args.force))


def _one_phase(target: Path, args, source: Path, code: str, run) -> dict:
    """Run one later phase from the model in `source`; `code` names the refusal of an unfit `source`."""
    from gpu_runtime.tiny_release import RECIPE_FILE, make_manifest
    from kiln_project.cli.client import CliError

    source = source.expanduser().resolve()
    option = code.removeprefix("invalid_").replace("_", "-")
    if args.seed is not None or args.warm_steps is not None:
        raise CliError(code, f"--{option} keeps that model's seed and warm-up steps", "drop --seed and --warm-steps")
    if not (source / RECIPE_FILE).is_file():
        raise CliError(code, f"{source} holds no tiny model ({RECIPE_FILE} is missing)")
    try:
        summary = run(source)
    except FileExistsError as exc:
        raise CliError("model_dir_not_empty", str(exc), "choose an empty directory or pass --force") from None
    except ValueError as exc:
        raise CliError(code, str(exc)) from None
    summary.update(source="recipe", model_sha256=make_manifest(target)["model_sha256"])
    return summary
