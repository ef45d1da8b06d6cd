"""`kiln adapters list|show|download|upload|load|unload|activate|delete` (and `verify`, from
adapters_verify_cmd): client commands over /v1/adapters. Every NAME is checked by `adapter_name_arg` before
any request, so a malformed name reads the same from each command."""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from kiln_project.cli.adapters_verify_cmd import add_verify_parser, run_verify
from kiln_project.cli.client import (
    CliError,
    KilnClient,
    adapter_name_arg,
    api_path,
    not_kiln,
    raise_for_stream_error,
    require_fields,
)
from kiln_project.cli.output import check_output_path, print_json, print_table

TRANSFER_TIMEOUT = 600.0  # uploads and downloads of large adapters


def add_parser(subparsers, common) -> None:
    adapters = subparsers.add_parser("adapters", help="the adapter registry: list, inspect, move and activate adapters")
    sub = adapters.add_subparsers(dest="adapters_command", required=True)
    sub.add_parser("list", parents=[common], help="list adapters with their status, newest first")
    show = sub.add_parser("show", parents=[common], help="one adapter: files, history, evaluations, lineage")
    show.add_argument("name")
    download = sub.add_parser("download", parents=[common], help="save an adapter as a tar.gz")
    download.add_argument("name")
    download.add_argument("-o", "--output", type=Path, help="where to write it (default NAME.tar.gz)")
    upload = sub.add_parser("upload", parents=[common], help="upload a PEFT LoRA adapter (a tar.gz) as NAME")
    upload.add_argument("name")
    upload.add_argument("archive", type=Path)
    for verb, text in (("load", "activate an adapter for serving now (after its serving canary)"),
                       ("unload", "stop serving an adapter"),
                       ("activate", "make an adapter (e.g. an earlier one: a rollback) active through a promotion"),
                       ("delete", "delete an adapter and its checkpoints (its receipts stay)")):
        command = sub.add_parser(verb, parents=[common], help=text)
        command.add_argument("name")
        command.add_argument("--reason", default="", help="why (recorded in the adapter's history)")
        if verb == "load":
            command.add_argument("--allow-quarantined", action="store_true",
                                 help="load even if a serving canary quarantined it")
        if verb == "delete":
            command.add_argument("--force", action="store_true",
                                 help="delete it even though other adapters were trained from it (their lineage breaks)")
    add_verify_parser(sub, common)
    adapters.set_defaults(handler=run)


def _short(digest) -> str:
    return digest[:19] if isinstance(digest, str) else ""


def _print_list(adapters: list[dict]) -> None:
    rows = [{**a, "active": "*" if a.get("active") else "", "content": _short(a.get("content_sha256")),
             "base": a.get("base_adapter") or "", "job": (a.get("training_job_id") or "")[:8],
             "published": (a.get("published_at") or "")[:19]} for a in adapters]
    print_table(rows, ["name", "status", "active", "base", "job", "content", "published"])


def _print_detail(detail: dict) -> None:
    for key in ("name", "status", "active", "content_sha256", "base_model_sha256", "base_adapter", "training_job_id",
                "receipt_sha256", "path", "published_at"):
        value = detail.get(key)
        print(f"{key:18} {'' if value is None else value}")
    print("files:")
    for entry in detail.get("files") or []:
        print(f"  {entry['file']:32} {entry['size']:>12}  {entry['sha256']}")
    lineage = detail.get("lineage") or []
    if lineage:
        print("lineage: " + " <- ".join([detail["name"]] + [p["name"] + (" (missing)" if p.get("missing") else "")
                                                             for p in lineage]))
    gate = (detail.get("evaluations") or {}).get("post_eval")
    if gate:
        print(f"post-eval: {gate.get('state')}, gate {gate.get('gate_outcome') or 'none'}"
              + (f": {gate['post_eval_verdict']}" if gate.get("post_eval_verdict") else ""))
    for job in (detail.get("evaluations") or {}).get("eval_jobs") or []:
        accuracy = job.get("accuracy")
        print(f"eval {job['job_id'][:8]} {job.get('suite')}: {job['state']}"
              + ("" if accuracy is None else f", accuracy {accuracy:.3f}"))
    print("history:")
    for t in detail.get("transitions") or []:
        print(f"  {str(t['at'])[:19]}  {t.get('from_state') or '-'} -> {t['to_state']}  "
              f"{t.get('actor') or 'system'}: {t.get('reason') or ''}")


def _download(client: KilnClient, name: str, output: Path) -> dict:
    check_output_path(output)
    partial = output.with_name(f".{output.name}.part")
    try:
        with client._http.stream("GET", api_path("/v1/adapters", name, "download"), timeout=TRANSFER_TIMEOUT) as response:
            raise_for_stream_error(response)
            if "x-kiln-content-sha256" not in response.headers:  # Kiln always sends it: another server answered
                raise not_kiln(response, client.url)
            size = 0
            with open(partial, "wb") as fh:
                for chunk in response.iter_bytes():
                    fh.write(chunk)
                    size += len(chunk)
            digest = response.headers.get("x-kiln-content-sha256") or None
    except httpx.TransportError as exc:
        partial.unlink(missing_ok=True)
        raise CliError("connection_failed", f"cannot reach Kiln at {client.url}: {exc}",
                       "is `kiln serve` running? pass --url or set KILN_URL") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, output)
    return {"name": name, "path": str(output), "bytes": size, "content_sha256": digest}


def run(args) -> int:
    command = args.adapters_command
    if command == "verify":
        return run_verify(args)
    if command != "list":
        adapter_name_arg(args.name)
    client = KilnClient(args.url, timeout=TRANSFER_TIMEOUT if command in ("upload", "download") else 30.0)
    if command == "list":
        adapters = client.get("/v1/adapters")
        print_json(adapters) if args.json else _print_list(adapters)
        return 0
    if command == "show":
        detail = require_fields(client.get(api_path("/v1/adapters", args.name, "detail")), "name", "status",
                                url=client.url)
        print_json(detail) if args.json else _print_detail(detail)
        return 0
    if command == "download":
        result = _download(client, args.name, args.output or Path(f"{args.name}.tar.gz"))
        print_json(result) if args.json else print(f"saved {result['name']} to {result['path']} "
                                                   f"({result['bytes']} bytes)")
        return 0
    if command == "upload":
        try:
            handle = open(args.archive, "rb")
        except OSError as exc:
            raise CliError("file_unreadable", f"cannot read {args.archive}: {exc.strerror}") from None
        with handle:
            adapter = client.post("/v1/adapters/upload", data={"name": args.name},
                                  files={"archive": (args.archive.name, handle, "application/gzip")})
        if args.json:
            print_json(adapter)
            return 0
        print(f"uploaded {adapter['name']} ({adapter['status']}, {adapter['content_sha256']})")
        checked = adapter.get("checked") or {}
        carried = checked.get("carried_files") or []
        # A downloaded archive carries its manifest and receipt: checked against the weights, they are kept
        # as evidence of the original training (kiln adapters verify checks them; the rest was not seen here).
        print(f"carries (checked against its weights): {', '.join(carried)}" if carried
              else "carries no receipt: a plain PEFT adapter")
        ignored = checked.get("ignored_files") or []
        if ignored:
            print(f"not kept: {', '.join(ignored)}")
        return 0
    if command == "delete":
        params = {key: value for key, value in (("reason", args.reason), ("force", "true" if args.force else ""))
                  if value} or None
        result = client.delete(api_path("/v1/adapters", args.name), params=params)
        print_json(result) if args.json else print(f"deleted {result['name']} "
                                                   f"({len(result.get('removed') or [])} folder(s) removed)")
        return 0
    if command == "activate":
        promotion = client.post(api_path("/v1/adapters", args.name, "activate"), json={"reason": args.reason})
        print_json(promotion) if args.json else print(
            f"promotion {promotion['id']}: {promotion['state']} ({promotion.get('incumbent') or 'base'} -> "
            f"{promotion['candidate']})" + (" - waits for a reviewer: kiln promotions approve "
                                             f"{promotion['id']} --reason ..." if promotion["state"] == "pending"
                                             else " - the serving canary runs, then it is applied"))
        return 0
    body = {"name": args.name, "reason": args.reason}
    if command == "load":
        body["allow_quarantined"] = args.allow_quarantined
    adapter = client.post(f"/v1/adapters/{command}", json=body)
    canary = adapter.get("canary") or {}
    print_json(adapter) if args.json else print(f"{adapter['name']}: {adapter['status']}"
                                                + (" (served by default)" if adapter.get("active") else "")
                                                + (f", serving canary {'passed' if canary.get('passed') else 'failed'}"
                                                   if canary and command == "load" else ""))
    return 0
