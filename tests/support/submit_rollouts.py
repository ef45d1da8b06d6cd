"""Register a scorer and queue a `rollouts.generate` job from a subprocess that shares a stack's
database (what the Training → Rollouts page does): python -m tests.support.submit_rollouts DIR SEEDS.

DIR holds tasks.jsonl, request.json and score.py; prints the job's uuid."""

import os
import sys
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kiln_project.settings")

import django  # noqa: E402

django.setup()

from evaluations.rollout_services import rollouts_submit  # noqa: E402
from evaluations.selectors import scorer_get  # noqa: E402
from evaluations.services import scorer_register  # noqa: E402

work = Path(sys.argv[1])
if scorer_get(name="fault-scorer") is None:
    scorer_register(name="fault-scorer", filename="score.py", content=(work / "score.py").read_bytes())
job = rollouts_submit(tasks=(work / "tasks.jsonl").read_bytes(),
                      template_upload=(work / "request.json").read_bytes(), scorer="fault-scorer",
                      seeds=int(sys.argv[2]), seed_start=1, concurrency=1)
print(job.uuid, flush=True)
