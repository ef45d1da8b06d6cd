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


def _requester(p: dict) -> str:
    """Who asked: a user, Kiln for the job that made the request (a gate, auto_load), or an anonymous caller."""
    if p.get("requested_by"):
        return p["requested_by"]
    return f"kiln (job {str(p['job_id'])[:8]})" if p.get("job_id") else "(anonymous)"


def _print_list(rows: list[dict]) -> None:
    table = [{**p, "incumbent": p.get("incumbent") or "base", "flagged": "!" if p.get("flagged") else "",
              "requested_by": _requester(p), "decided_by": p.get("decided_by") or "",
              "requested": str(p.get("requested_at") or "")[:19]} for p in rows]
    print_table(table, ["id", "state", "candidate", "incumbent", "flagged", "requested_by", "decided_by", "requested"])


def _print_detail(p: dict) -> None:
    for key in ("id", "state", "candidate", "content_sha256", "incumbent", "evidence_sha256", "requested_by",
                "requested_at", "request_reason", "decided_by", "decided_at", "reason", "job_id"):
        value = _requester(p) if key == "requested_by" else p.get(key)
        print(f"{key:16} {'' if value is None else value}")
    for alarm in p.get("alarms") or []:
        print(f"ALARM: {alarm}")
    gate = (p.get("evidence") or {}).get("gate") or {}
    gate_status = (p.get("evidence") or {}).get("gate_status") or {}
    if gate:
        print(f"gate: {gate.get('outcome')} (candidate {gate.get('candidate_accuracy')}, "
              f"baseline {gate.get('baseline_accuracy')})")
    elif gate_status.get("outcome"):  # a gate was asked for and did not decide (killed, pending)
        print(f"gate: {gate_status['outcome']}, no decision ({gate_status.get('verdict') or 'no verdict'})")
    trend = (p.get("evidence") or {}).get("reward_trend") or {}
    if trend:
        print(f"reward trend: {trend.get('first')} -> {trend.get('last')} over {trend.get('points')} points")
    _print_figures(p.get("evidence") or {})
    print("receipts:")
    for r in p.get("receipts") or []:
        print(f"  {str(r.get('created_at'))[:19]}  {r['kind']:10} {r.get('decision') or '':9} "
              f"{r.get('actor') or ''}  {r['sha256']}")


def _g(value) -> str:
    return "n/a" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)


def _one_line(text, limit: int = 70) -> str:
    text = " ".join(str(text or "").split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _print_figures(evidence: dict) -> None:
    """KL to the reference, clip fractions, held-out lengths and a couple of side-by-side samples."""
    kl = evidence.get("kl_to_reference") or {}
    bounds = evidence.get("alarm_bounds") or {}
    if kl:
        print(f"KL to reference: {_g(kl.get('value'))} nats/token ({kl.get('statistic')}, {kl.get('source')}; "
              f"bound {_g(bounds.get('max_kl_to_reference'))})")
        if isinstance(kl.get("value"), int | float) and kl["value"] < 0:
            print("  a signed k1 estimate: below zero, the policy moved away from the tokens it trained on, which "
                  "the bound does not measure; read the held-out lengths and samples")
    clip = ((evidence.get("policy_audit") or {}).get("clip")) or {}
    if clip.get("outside_fraction") is not None:
        print(f"clipped ratios: {_g(clip['outside_fraction'])} of {clip.get('ratio_observations')} "
              f"(below {_g(clip.get('below_fraction'))}, above {_g(clip.get('above_fraction'))})")
    lengths = evidence.get("lengths") or {}
    if lengths:
        cand, inc = lengths.get("candidate") or {}, lengths.get("incumbent") or {}
        print(f"held-out lengths: candidate mean {_g(cand.get('mean'))} / median {_g(cand.get('median'))} "
              f"over {cand.get('count')}, {_baseline(lengths)} mean {_g(inc.get('mean'))} / median {_g(inc.get('median'))} "
              f"over {inc.get('count')} (ratio {_g(lengths.get('ratio'))}; allowed "
              f"{_g(bounds.get('min_length_ratio'))}..{_g(bounds.get('max_length_ratio'))})")
    samples = evidence.get("samples") or []
    if samples:
        print(f"samples ({len(samples)} in the evidence; --json shows all):")
    for sample in samples[:2]:
        print(f"  {sample.get('example_id')}: {_one_line(sample.get('prompt'))}")
        print(f"    candidate [{sample.get('candidate_outcome')}]: {_one_line(sample.get('candidate'))}")
        print(f"    {_baseline(lengths)} [{sample.get('incumbent_outcome')}]: {_one_line(sample.get('incumbent'))}")


def _baseline(lengths: dict) -> str:
    """What the held-out figures compared the candidate with: the gate's baseline, which is the incumbent
    only when the active adapter did not change meanwhile (an alarm says so when it did)."""
    return f"baseline {lengths.get('incumbent_adapter') or 'base'}"


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
