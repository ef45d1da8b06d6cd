"""`kiln worker --queues ...`: one dramatiq worker process serving the named queues.

It execs dramatiq so signals reach it directly. The GPU worker (queues gpu, infer) is one process;
its jobs run one at a time in FIFO order. Workers on other hosts only need the same Redis and DB.
"""

from __future__ import annotations

import os
import sys

KNOWN_QUEUES = ("gpu", "infer", "control")


def add_parser(subparsers) -> None:
    worker = subparsers.add_parser("worker", help="run one worker process (for multi-machine deployments)")
    worker.add_argument("--queues", default="gpu,infer,control",
                        help="comma-separated queues: gpu,infer (the GPU worker) and/or control")
    worker.add_argument("--threads", type=int, default=4)
    worker.add_argument("--shutdown-timeout", type=int, default=30, help="seconds to let running work stop")
    worker.set_defaults(handler=run)


def task_modules() -> list[str]:
    """Every installed app's `tasks` module: that is where actors are declared."""
    import importlib.util

    import django
    from django.apps import apps

    django.setup()
    modules = []
    for app in apps.get_app_configs():
        name = f"{app.name}.tasks"
        if importlib.util.find_spec(name) is not None:
            modules.append(name)
    return modules


def run(args) -> int:
    from kiln_project.cli.client import CliError

    queues = [q.strip() for q in args.queues.split(",") if q.strip()]
    unknown = sorted(set(queues) - set(KNOWN_QUEUES))
    if unknown or not queues:
        raise CliError("invalid_queues", f"unknown queue(s): {', '.join(unknown) or '(none given)'}",
                       f"choose from {', '.join(KNOWN_QUEUES)}")
    if args.threads < 1:
        raise CliError("invalid_threads", "--threads must be at least 1")
    os.environ["KILN_WORKER_QUEUES"] = ",".join(queues)
    # Positionals first: --queues takes every word after it.
    argv = [sys.executable, "-m", "dramatiq", "django_dramatiq.setup", *task_modules(),
            "--processes", "1", "--threads", str(args.threads),
            "--worker-shutdown-timeout", str(args.shutdown_timeout * 1000), "--queues", *queues]
    sys.stdout.flush()
    os.execv(sys.executable, argv)
    return 0  # not reached
