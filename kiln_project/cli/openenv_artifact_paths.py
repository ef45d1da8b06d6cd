"""Which files `kiln openenv verify` and `replay` check: the summary given, and its dataset and replay
files as given, else found beside the summary (the names downloads and collections give them, or
their recorded names), else at their recorded paths, said in a note. No Django, no torch.
"""

from __future__ import annotations

import json
from pathlib import Path

from kiln_project.cli.client import CliError


def _summary_path(args) -> Path:
    path = args.summary or (Path(args.summary_file) if args.summary_file else None)
    if path is None:
        raise CliError("openenv_verification_failed", "give the rollout summary", "kiln openenv verify --summary FILE")
    if not path.is_file():
        raise CliError("file_not_found", f"the summary {path} does not exist" if not path.exists()
                       else f"the summary {path} is not a file",
                       "give the rollout summary JSON the collection wrote (e.g. openenv.rollout-summary.json)")
    return path


# What a summary may be called, and what `kiln openenv rollout|train|artifact` call the other two files beside
# it (COLLECTION_OUTPUTS: openenv.rollouts.jsonl, openenv.replay.json, openenv.rollout-summary.json; the
# README's math-r001.rollouts.jsonl beside math-r001.summary.json).
SUMMARY_SUFFIXES = (".rollout-summary.json", ".summary.json", ".json")
DOWNLOAD_SUFFIXES = {"dataset": ".rollouts.jsonl", "replay": ".replay.json"}
# `--output zs.jsonl --summary-output zs.summary.json`: the plain stem names the dataset too.
OTHER_SUFFIXES = {"dataset": (".jsonl",)}


def _stem(summary: Path) -> str | None:
    for suffix in SUMMARY_SUFFIXES:
        if summary.name.endswith(suffix) and len(summary.name) > len(suffix):
            return summary.name[: -len(suffix)]
    return None


def _given(path: Path | None, what: str) -> Path | None:
    if path is not None and not path.is_file():
        raise CliError("file_not_found", f"the {what} {path} does not exist" if not path.exists()
                       else f"the {what} {path} is not a file", f"give the collection's {what} file")
    return path


def _beside(summary: Path, stored, what: str, flag: str) -> tuple[Path | None, str | None]:
    """The summary's `what` file to check, and a note when it is not a file beside the summary:
    1. `<stem>.rollouts.jsonl` / `<stem>.replay.json` beside `<stem>.rollout-summary.json` (or
       `<stem>.summary.json`): the names downloads and collections give the three files;
    2. its recorded file name beside the summary (an archived copy of the three, as the README says);
    3. else the recorded path itself (the collecting machine's or the server's copy), said plainly."""
    if not isinstance(stored, str) or not stored:
        return None, None  # verify names the summary's broken field
    recorded = Path(stored)
    stem = _stem(summary)
    if stem is not None:  # the summary's own stem is the more specific match: it wins over a stray file
        for suffix in (DOWNLOAD_SUFFIXES[what], *OTHER_SUFFIXES.get(what, ())):
            download = summary.parent / (stem + suffix)
            if download.is_file():
                return download, None
    neighbour = summary.parent / recorded.name
    if neighbour.is_file():
        return neighbour, None
    if recorded.is_file():
        whose = "the server's copy" if "/.openenv/runs/" in recorded.as_posix() else "the copy"
        return recorded, (f"checked {whose} of the {what} at its recorded path {recorded}, not a file beside the "
                          f"summary (pass {flag} FILE to check your own)")
    expected = recorded.name if stem is None else f"{recorded.name} or {stem}{DOWNLOAD_SUFFIXES[what]}"
    raise CliError("file_not_found", f"the summary's {what} is neither beside {summary} ({expected}) nor at its "
                   f"recorded path {recorded}", f"pass {flag} FILE")


def artifact_paths(args) -> tuple[Path, Path | None, Path | None, list[str]]:
    """(summary, dataset, replay, notes) for verify and replay: the files given, else those beside the summary."""
    summary = _summary_path(args)
    given = {"dataset": _given(args.dataset, "dataset"), "replay": _given(args.replay, "replay")}
    found, notes = dict(given), []
    beside, elsewhere = [], {}  # found beside the summary / only at a recorded path away from it
    if None in given.values():
        try:
            recorded = json.loads(summary.read_bytes())
        except (OSError, ValueError):
            recorded = None  # verify reports what is wrong with the summary
        if isinstance(recorded, dict):
            for what, key, flag in (("dataset", "output_path", "--dataset"), ("replay", "replay_output_path", "--replay")):
                if given[what] is not None:
                    continue
                found[what], note = _beside(summary, recorded.get(key), what, flag)
                if note:
                    notes.append(note)
                    elsewhere[what] = found[what]
                elif found[what] is not None:
                    beside.append(what)
    if beside and elsewhere:
        # One file of an archive beside the summary and the other from its recorded path (the server's
        # copy) would check a pair that was never archived together.
        missing, path = next(iter(elsewhere.items()))
        raise CliError("file_not_found", f"the {beside[0]} is beside {summary} but the {missing} is not (only its "
                       f"recorded copy is, at {path})",
                       f"pass --{missing} FILE: the {missing} archived with this summary")
    return summary, found["dataset"], found["replay"], notes
