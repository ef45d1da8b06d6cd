"""Submit a job from a subprocess that shares a stack's database: python -m tests.support.submit KIND JSON."""

import json
import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln_project.settings")

import django  # noqa: E402

django.setup()

from core.errors import KilnError  # noqa: E402
from core.jobs.services import job_submit  # noqa: E402

for payload in sys.argv[2:]:
    try:
        job = job_submit(kind=sys.argv[1], payload=json.loads(payload), title=f"{sys.argv[1]} from a test")
    except KilnError as exc:
        print(f"ERROR {exc.code} {exc.status} {exc.headers.get('Retry-After', '')}", flush=True)
        sys.exit(3)
    print(job.uuid, flush=True)
