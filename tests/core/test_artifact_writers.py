"""Every server-side writer publishes through core.artifacts: when that layer fails (a full disk),
the request fails with its stable code and nothing is left that looks finished, or at all.

(The trainer's writers are covered in tests/grpo/test_publication_fails_closed.py.)"""

from __future__ import annotations

import errno
import os
from dataclasses import replace
from pathlib import Path

import pytest

from core import artifacts
from core.contracts.groups import admit_groups
from core.errors import KilnError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "grpo-math"
GROUP = {"messages": [{"role": "user", "content": "What is 2 + 3?"}],
         "completions": [{"text": "5", "reward": 1.0}, {"text": "6", "reward": 0.0}]}


@pytest.fixture
def disk_full(monkeypatch):
    """Make the artifact layer fail at its first write, and count how often it was asked."""
    calls = []

    def full(*args, **kwargs):
        calls.append(args[0])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(artifacts, "_write_synced", full)
    monkeypatch.setattr(artifacts, "fsync_tree", full)
    return calls


@pytest.fixture
def home(settings, tmp_path):
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) if root.exists() else []


def test_the_tiny_model_release_install(tmp_path, disk_full):
    from gpu_runtime import tiny_release

    with pytest.raises(OSError):
        tiny_release.install(tmp_path / "m")
    assert disk_full and os.listdir(tmp_path) == []


def test_the_tiny_model_recipe(tmp_path, disk_full):
    from gpu_runtime.tiny_model import create_tiny_model

    with pytest.raises(OSError):
        create_tiny_model(tmp_path / "m", warm_steps=0, schema_steps=0)
    assert disk_full and os.listdir(tmp_path) == []


@pytest.mark.django_db
def test_the_corpus_snapshot_pin(home, disk_full):
    from training.snapshots import pin_snapshot

    with pytest.raises(OSError):
        pin_snapshot(admit_groups([GROUP]))
    assert disk_full and files_under(home) == []


@pytest.mark.django_db
def test_the_scorer_store(home, disk_full):
    from evaluations.models import Scorer
    from evaluations.services import scorer_register

    with pytest.raises(KilnError) as caught:
        scorer_register(name="math-exact", filename="score_math.py", content=(EXAMPLE / "score_math.py").read_bytes())
    assert caught.value.code == "scorer_store_failed" and disk_full
    assert files_under(home) == [] and not Scorer.objects.exists()


@pytest.mark.django_db
def test_the_rollout_input_pins(home, monkeypatch):
    from core.jobs.models import Job
    from evaluations.rollout_services import rollouts_submit
    from evaluations.services import scorer_register

    scorer_register(name="math-exact", filename="score_math.py", content=(EXAMPLE / "score_math.py").read_bytes())
    before = files_under(home)
    calls = []

    def full(*args, **kwargs):
        calls.append(args[0])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(artifacts, "_write_synced", full)
    with pytest.raises(OSError):
        rollouts_submit(tasks=(EXAMPLE / "tasks.jsonl").read_bytes(),
                        template_upload=(EXAMPLE / "request.json").read_bytes(), scorer="math-exact")
    assert calls and files_under(home) == before and not Job.objects.exists()


def test_rollouts_publication(tmp_path, disk_full):
    from evaluations.generation.errors import RolloutError
    from evaluations.generation.publish import publish_together

    with pytest.raises(RolloutError) as caught:
        publish_together([(tmp_path / "r.jsonl", b"{}\n"), (tmp_path / "s.json", b"{}")])
    assert caught.value.code == "publish_failed" and disk_full and os.listdir(tmp_path) == []
