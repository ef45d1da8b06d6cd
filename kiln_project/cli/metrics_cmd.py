"""`kiln metrics`: the server's GET /metrics (Prometheus text), as it is or as JSON samples."""

from __future__ import annotations

import re

from kiln_project.cli.client import CliError, KilnClient
from kiln_project.cli.output import print_json

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')


def add_parser(subparsers, common) -> None:
    metrics = subparsers.add_parser("metrics", parents=[common],
                                    help="print the server's Prometheus metrics (GET /metrics)")
    metrics.add_argument("--family", default="", help="only the families whose name starts with this, "
                                                      "e.g. kiln_openenv or kiln_gate")
    metrics.set_defaults(handler=run)


def samples(text: str) -> list[dict]:
    """[{name, labels, value}] of an exposition Kiln wrote (label values are plain words)."""
    out = []
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if line.startswith("#") or match is None:
            continue
        name, labels, value = match.groups()
        out.append({"name": name, "labels": dict(LABEL.findall(labels or "")), "value": float(value)})
    return out


def run(args) -> int:
    text = KilnClient(args.url).text("/metrics", content_type="text/plain")
    wanted = [line for line in text.splitlines()
              if line.removeprefix("# HELP ").removeprefix("# TYPE ").startswith(args.family)]
    if args.family and not wanted:  # a misspelt family printed nothing and exited 0
        families = sorted({line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")})
        raise CliError("metric_family_not_found", f"no metric family starts with {args.family!r}",
                       f"the families: {', '.join(families[:8])}{', ...' if len(families) > 8 else ''}")
    if args.json:
        print_json([s for s in samples(text) if s["name"].startswith(args.family)])
        return 0
    print("\n".join(wanted))
    return 0
