"""`kiln jobs list|show|cancel`: client commands over /v1/jobs."""

from __future__ import annotations

from kiln_project.cli.client import CliError, KilnClient, api_path, job_id_arg
from kiln_project.cli.output import TERMINAL_STATES, follow, print_json, print_table

MAX_LIMIT = 1000  # the server's bound on GET /v1/jobs?limit


def add_parser(subparsers, common) -> None:
    jobs = subparsers.add_parser("jobs", help="list, inspect and cancel jobs")
    sub = jobs.add_subparsers(dest="jobs_command", required=True)
    listing = sub.add_parser("list", parents=[common], help="list jobs, newest first")
    listing.add_argument("--state")
    listing.add_argument("--kind")
    listing.add_argument("--limit", type=int, default=50)
    show = sub.add_parser("show", parents=[common], help="show one job")
    show.add_argument("job_id")
    show.add_argument("--follow", action="store_true", help="wait for a terminal state, showing progress")
    cancel = sub.add_parser("cancel", parents=[common], help="cancel a queued or running job")
    cancel.add_argument("job_id")
    cancel.add_argument("--follow", action="store_true", help="wait until the job has stopped")
    jobs.set_defaults(handler=run)


def _job_label(job: dict) -> str:
    if job["state"] == "queued" and job.get("queue_position"):
        return f"queued (position {job['queue_position']})"
    return job["state"] + (f": {job['progress_message']}" if job["progress_message"] else "")


def follow_job(client: KilnClient, job_id: str) -> dict:
    """Poll a job until it reaches a terminal state, drawing progress; returns the final detail."""
    path = api_path("/v1/jobs", job_id)
    return follow(lambda: client.get(path), _job_label)


def _finish(job: dict, as_json: bool) -> int:
    if as_json:
        print_json(job)
    else:
        print(f"{job['id']}  {job['kind']}  {job['state']}  {job['progress'] * 100:.0f}%")
    if job["state"] == "failed":
        error = job.get("error") or {}
        raise CliError(error.get("code", "job_failed"), error.get("message", "the job failed"))
    if job["state"] == "cancelled":
        raise CliError("job_cancelled", f"job {job['id']} was cancelled")
    return 0


def _check_limit(limit: int) -> None:
    if not 1 <= limit <= MAX_LIMIT:  # 0 too: never read as "no limit" (the server's default)
        raise CliError("invalid_limit", f"--limit must be between 1 and {MAX_LIMIT}, not {limit}")


def run(args) -> int:
    if args.jobs_command == "list":
        _check_limit(args.limit)
    else:
        args.job_id = job_id_arg(args.job_id)
    client = KilnClient(args.url)
    if args.jobs_command == "list":
        params = {k: v for k, v in {"state": args.state, "kind": args.kind, "limit": args.limit}.items()
                  if v is not None and v != ""}
        jobs = client.get("/v1/jobs", params=params)
        if args.json:
            print_json(jobs)
        else:
            rows = [{**j, "progress": f"{j['progress'] * 100:.0f}%", "created_at": j["created_at"][:19]} for j in jobs]
            print_table(rows, ["id", "kind", "state", "progress", "created_at", "title"])
        return 0
    if args.jobs_command == "show":
        if args.follow:
            return _finish(follow_job(client, args.job_id), args.json)
        job = client.get(api_path("/v1/jobs", args.job_id))
        if args.json:
            print_json(job)
        else:
            for key in ("id", "kind", "queue", "state", "title", "progress_message", "created_at", "started_at",
                        "finished_at"):
                print(f"{key:17} {job.get(key) if job.get(key) is not None else ''}")
            print(f"{'progress':17} {job['progress'] * 100:.1f}%")
            if job.get("error"):
                print(f"{'error':17} {job['error']['code']}: {job['error']['message']}")
        return 0
    job = client.delete(api_path("/v1/jobs", args.job_id))
    if args.follow and job["state"] not in TERMINAL_STATES:
        job = follow_job(client, args.job_id)
    if args.json:
        print_json(job)
    elif job["state"] == "cancelled":
        print(f"cancelled {job['id']}")
    elif job["state"] in TERMINAL_STATES:  # it finished on its own before the cancel took effect
        print(f"{job['id']} {job['state']} before the cancel took effect")
    else:
        print(f"cancellation requested for {job['id']} ({job['state']})")
    if job["state"] in TERMINAL_STATES and job["state"] != "cancelled":
        raise CliError("job_not_cancelled", f"job {job['id']} {job['state']} before the cancel took effect",
                       f"see it with: kiln jobs show {job['id']}")
    return 0
