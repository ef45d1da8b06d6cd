"""`kiln adapters verify NAME [--json]`: walk the chain of GET /v1/adapters/{name}/verify and print
one line per link (`ok      link  detail` / `BROKEN  link  detail`, or `n/a` for a link of an uploaded
adapter that only the machine that trained it can check); exit 1 naming the first broken one.

Wired by `kiln_project/cli/adapters_cmd.py`: `add_verify_parser(adapters_subparsers, common)`, and
`run_verify(args)` for `args.adapters_command == "verify"` (the parser sets it as the handler too).
"""

from __future__ import annotations

from kiln_project.cli.client import CliError, KilnClient, adapter_name_arg, api_path
from kiln_project.cli.output import print_json


def add_verify_parser(adapters_subparsers, common) -> None:
    verify = adapters_subparsers.add_parser(
        "verify", parents=[common], help="recompute every digest from the adapter's bytes to why it is serving")
    verify.add_argument("name", help="the adapter name")
    verify.set_defaults(handler=run_verify)


def _mark(link: dict) -> str:
    if not link["ok"]:
        return "BROKEN"
    return "ok" if link.get("checked", True) else "n/a"  # n/a: only the machine that trained it can check


def report_lines(report: dict) -> list[str]:
    width = max((len(link["link"]) for link in report["links"]), default=0)
    return [f"{_mark(link):6}  {link['link']:{width}}  {link['detail']}" for link in report["links"]]


def run_verify(args, client=None) -> int:
    adapter_name_arg(args.name)  # the same check as every `kiln adapters` command, before any request
    client = client or KilnClient(args.url)
    report = client.get(api_path("/v1/adapters", args.name, "verify"))
    if getattr(args, "json", False):
        print_json(report)
    else:
        print("\n".join(report_lines(report)))
    if not report["ok"]:
        first = next(link for link in report["links"] if not link["ok"])
        raise CliError("chain_broken", f"adapter {report['adapter']!r}: the first broken link is {first['link']}: "
                       f"{first['detail']}")
    if not getattr(args, "json", False):
        skipped = sum(1 for link in report["links"] if not link.get("checked", True))
        if skipped:
            print(f"adapter {report['adapter']!r}: {len(report['links']) - skipped} links verify, {skipped} are not "
                  "checkable here (uploaded: they live on the machine that trained it)")
        else:
            print(f"adapter {report['adapter']!r}: all {len(report['links'])} links verify")
    return 0
