"""`kiln promotions list|show ID|approve ID --reason R|reject ID --reason R`: client commands over
/v1/promotions (issue 13)."""

from __future__ import annotations

from kiln_project.cli.client import KilnClient
from kiln_project.cli.output import print_json, print_table


def add_parser(subparsers, common) -> None:
    promotions = subparsers.add_parser("promotions", help="the promotion queue: list, inspect, approve, reject")
    sub = promotions.add_subparsers(dest="promotions_command", required=True)
    listing = sub.add_parser("list", parents=[common], help="list promotions, newest first")
    listing.add_argument("--state", help="pending, approved, rejected, applied, superseded or failed")
    show = sub.add_parser("show", parents=[common], help="one promotion with its evidence and receipts")
    show.add_argument("promotion_id", type=int)
    for verb, text in (("approve", "approve a pending promotion (its candidate becomes active)"),
                       ("reject", "reject a pending promotion")):
        command = sub.add_parser(verb, parents=[common], help=text)
        command.add_argument("promotion_id", type=int)
        command.add_argument("--reason", required=True, help="why (recorded in the approval receipt)")
    promotions.set_defaults(handler=run)


def _print_list(rows: list[dict]) -> None:
    table = [{**p, "incumbent": p.get("incumbent") or "base", "flagged": "!" if p.get("flagged") else "",
              "requested_by": p.get("requested_by") or "", "decided_by": p.get("decided_by") or "",
              "requested": str(p.get("requested_at") or "")[:19]} for p in rows]
    print_table(table, ["id", "state", "candidate", "incumbent", "flagged", "requested_by", "decided_by", "requested"])


def _print_detail(p: dict) -> None:
    for key in ("id", "state", "candidate", "content_sha256", "incumbent", "evidence_sha256", "requested_by",
                "requested_at", "request_reason", "decided_by", "decided_at", "reason", "job_id"):
        value = p.get(key)
        print(f"{key:16} {'' if value is None else value}")
    for alarm in p.get("alarms") or []:
        print(f"ALARM: {alarm}")
    gate = (p.get("evidence") or {}).get("gate") or {}
    if gate:
        print(f"gate: {gate.get('outcome')} (candidate {gate.get('candidate_accuracy')}, "
              f"baseline {gate.get('baseline_accuracy')})")
    trend = (p.get("evidence") or {}).get("reward_trend") or {}
    if trend:
        print(f"reward trend: {trend.get('first')} -> {trend.get('last')} over {trend.get('points')} points")
    print("receipts:")
    for r in p.get("receipts") or []:
        print(f"  {str(r.get('created_at'))[:19]}  {r['kind']:10} {r.get('decision') or '':9} "
              f"{r.get('actor') or ''}  {r['sha256']}")


def run(args) -> int:
    client = KilnClient(args.url)
    command = args.promotions_command
    if command == "list":
        rows = client.get("/v1/promotions", params={"state": args.state} if args.state else None)
        print_json(rows) if args.json else _print_list(rows)
        return 0
    if command == "show":
        detail = client.get(f"/v1/promotions/{args.promotion_id}")
        print_json(detail) if args.json else _print_detail(detail)
        return 0
    result = client.post(f"/v1/promotions/{args.promotion_id}/{command}", json={"reason": args.reason})
    print_json(result) if args.json else print(f"promotion {result['id']}: {result['state']} "
                                               f"({result['candidate']})")
    return 0
