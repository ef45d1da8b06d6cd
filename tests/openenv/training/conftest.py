"""Fixtures for OpenEnv training runs: the runs fixtures (tests/openenv/runs/conftest.py), the tiny model
as the configured weights, a live GPU worker's heartbeat that reports the tiny model's identity (what
preflight reads the behavior policy from), and a scripted fake policy (tests/openenv/collector_fakes.py)
that answers with the run's sealed behavior policy. The training itself is the real trainer, run in
process (`run_queued_jobs("gpu")`)."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import replace
from pathlib import Path

import pytest
from django.utils import timezone

from core.content_identity import file_manifest, manifest_digest
from tests.openenv.collector_fakes import FakeCounterPolicy
from tests.openenv.runs.conftest import api, bounds, counter, error_of, home, post_run  # noqa: F401

IDENTITY = {"served_model_id": "tiny", "inference_config_sha256": "sha256:" + "c" * 64,
            "implementation": "kiln-sampler tests", "generation_backend": "torch-cpu"}


def heartbeat(identity: dict, worker_id: str = "fake-gpu"):
    from core.jobs.models import WorkerHeartbeat

    now = timezone.now()
    WorkerHeartbeat.objects.update_or_create(
        worker_id=worker_id, defaults={"hostname": socket.gethostname(), "pid": os.getpid(), "queues": ["gpu", "infer"],
                                       "started_at": now, "last_seen": now,
                                       "status": {"model": {"loaded": True, "identity": identity}}})


@pytest.fixture
def served(db, settings, home, tiny_model_dir):  # noqa: F811
    """The tiny model configured and 'served': its real base-weights digest in the heartbeat."""
    settings.KILN = replace(settings.KILN, model_path=Path(tiny_model_dir))
    identity = dict(IDENTITY, base_model_sha256=manifest_digest(file_manifest(Path(tiny_model_dir),
                                                                              ["model.safetensors"])))
    heartbeat(identity)
    return identity


def scripted(request) -> str | None:
    """Per (group, candidate): +1, -1 or no output ("" after thinking); None: the fake's own answer.

    Group 0: +1, +1, -1 (varied: trained). Group 1: +1 everywhere (all equal: skipped). Group 2:
    no output, +1, -1 (one completion discarded, the rest varied: trained)."""
    plan = {0: ["+", "+", "-"], 1: ["+", "+", "+"], 2: ["", "+", "-"]}
    moves = plan.get(request.group_index)
    if moves is None:
        return None
    move = moves[request.candidate_index % len(moves)]
    return "" if move == "" else json.dumps({"delta": 1 if move == "+" else -1})


def model_like(content: str | None) -> str | None:
    """An answer as the model's bytes come after its reasoning: the template's blank line first (the
    trainer requires each action to render verbatim through the chat template)."""
    return content if not content else "\n\n" + content


class ContractPolicies:
    """Stands in for openenv.runs.jobs.make_policy: a FakeCounterPolicy answering with the run's
    sealed behavior policy (`behavior(run, request)` may change it), scripted by `content` (None: the
    fake's own answer, which is then sent as it is)."""

    def __init__(self):
        self.content = scripted
        self.behavior = None  # optional callable(run, request) -> behavior policy
        self.on_start = None
        self.started: list[str] = []

    def __call__(self, run, ctx):
        self.started.append(str(run.id))
        if self.on_start is not None:
            self.on_start(run)
        expected = run.training_contract["behavior_policy"]
        behavior = (lambda request: self.behavior(run, request)) if self.behavior else (lambda request: expected)
        return FakeCounterPolicy(content=lambda request: model_like(self.content(request)), behavior=behavior,
                                 reasoning="thinking about the counter\n")


@pytest.fixture
def policies(monkeypatch):
    factory = ContractPolicies()
    monkeypatch.setattr("openenv.runs.jobs.make_policy", factory)
    return factory


def train_body(url, **overrides):
    body = {"kind": "train", "environment_urls": [url], "groups": 3, "group_size": 3, "max_steps": 2,
            "concurrency": 3, "seed_start": 100, "capacity_wait_seconds": 5, "reset_options": {"target": 4},
            "output_adapter": "counter-agent", "auto_load": False,
            "training_config": {"lora_rank": 2, "lora_alpha": 4, "seed": 7}}
    body.update(overrides)
    return body


def publish_adapter(root: Path, name: str = "counter-agent-v1", payload: bytes = b"weights-v1", *,
                    rank: int = 16, alpha: float = 32):
    """A published adapter row over a folder of adapter files (enough for preflight and snapshots); its
    LoRA shape (the default one unless given) must be the run's: a warm start keeps it."""
    from adapters.models import Adapter, AdapterState
    from core.content_identity import adapter_content_sha256

    folder = root / "adapters" / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": alpha}))
    (folder / "adapter_model.safetensors").write_bytes(payload)
    return Adapter.objects.create(name=name, state=AdapterState.PUBLISHED, path=str(folder),
                                  content_sha256=adapter_content_sha256(folder), published_at=timezone.now())
