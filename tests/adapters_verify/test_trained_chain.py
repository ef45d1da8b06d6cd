"""The verifier on a chain the real code built: a tiny GRPO job runs in-process on the tiny model,
publishes its adapter (auto_load, no gate), and `verify` passes; then one byte of the weights, the
receipt file, the receipt row (raw SQL: the model refuses updates) and the pinned snapshot are
tampered in turn, and each names its own first broken link, through the API and the CLI too."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
from argparse import Namespace
from pathlib import Path

import pytest

from adapters.models import Adapter
from adapters.verify import verify_adapter
from core.canonical import sha256_digest
from core.jobs.models import Job
from core.models import Receipt
from kiln_project.cli.adapters_verify_cmd import run_verify
from kiln_project.cli.client import CliError
from tests.adapters_verify.chain_support import tamper_row
from tests.training.conftest import api  # noqa: F401 (the fixture)

pytestmark = pytest.mark.django_db

GROUPS = [{"messages": [{"role": "user", "content": f"What is {i} + {i}?"}],
           "completions": [{"text": str(2 * i), "reward": 1.0}, {"text": str(2 * i + 1), "reward": 0.0}]}
          for i in range(4)]


class ApiClient:
    """The CLI's client, answered by the Django test client instead of HTTP."""

    def __init__(self, client):
        self.client = client

    def get(self, path, **kwargs):
        response = self.client.get(path)
        assert response.status_code == 200, response.content
        return response.json()


@pytest.fixture
def trained(api, settings, tmp_path, tiny_model_dir, django_capture_on_commit_callbacks, canary_worker):  # noqa: F811
    from core.jobs.runner import run_queued_jobs

    settings.KILN = dataclasses.replace(settings.KILN, home=tmp_path / "home", model_path=Path(tiny_model_dir))
    body = {"groups": GROUPS, "config": {"output_name": "chain-r001", "lora_rank": 2, "lora_alpha": 4,
                                         "auto_load": True, "seed": 1}}
    response = api.post("/v1/train/grpo", data=json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.content
    with django_capture_on_commit_callbacks(execute=True):
        run_queued_jobs("gpu")
        run_queued_jobs("control")  # auto_load: the serving canary (a stand-in worker here), then activation
    job = Job.objects.get(uuid=response.json()["job_id"])
    assert job.state == "completed", (job.error_code, job.error_message)
    adapter = Adapter.objects.get(name="chain-r001")
    assert adapter.loaded
    return adapter


def _first(name="chain-r001"):
    first = verify_adapter(name).first_broken
    return (first.link, first.detail) if first else (None, "")


def _restoring(path: Path):
    data = path.read_bytes()
    mode = path.stat().st_mode
    os.chmod(path, mode | stat.S_IWUSR)
    return lambda: (path.write_bytes(data), os.chmod(path, mode))


def test_the_trained_chain_verifies_and_each_tamper_names_its_link(trained, api, capsys):  # noqa: F811
    report = verify_adapter("chain-r001")
    assert report.ok, report.to_dict()
    assert "auto_load" in {x.link: x for x in report.links}["activation"].detail
    served = api.get("/v1/adapters/chain-r001/verify").json()
    assert served == json.loads(json.dumps(report.to_dict())) and served["ok"] is True
    assert run_verify(Namespace(name="chain-r001", json=False, url=None), client=ApiClient(api)) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("ok      adapter.row") and "all 19 links verify" in out[-1]
    folder = Path(trained.path)

    # (a) one byte of the weights
    weights = folder / "adapter_model.safetensors"
    restore = _restoring(weights)
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    assert _first()[0] == "adapter.bytes"
    restore()
    assert verify_adapter("chain-r001").ok

    # (b) the receipt file
    receipt_file = folder / "train_receipt.json"
    restore = _restoring(receipt_file)
    body = json.loads(receipt_file.read_text())
    body["hyperparameters"]["learning_rate"] = 1.0
    receipt_file.write_text(json.dumps(body))
    assert _first()[0] == "train_receipt.file"
    restore()

    # (b2) the adapter manifest written at publication binds the exact receipt bytes
    manifest_file = folder / "adapter_manifest.json"
    manifest = json.loads(manifest_file.read_text())
    assert manifest["schema"] == "kiln.adapter-manifest.v1" and manifest["content_sha256"] == trained.content_sha256
    assert manifest["receipt_hash"] == sha256_digest(receipt_file.read_bytes())
    assert manifest["training_job_id"] == str(trained.training_job.uuid)
    restore = _restoring(manifest_file)
    manifest_file.write_text(json.dumps({**manifest, "receipt_hash": "sha256:" + "1" * 64}))
    link, detail = _first()
    assert link == "adapter_manifest.file" and "receipt_hash" in detail
    restore()
    # publication recorded the manifest, so a deleted one is missing evidence, not an old adapter
    manifest_file.unlink()
    link, detail = _first()
    assert link == "adapter_manifest.file" and "is missing; the adapter was published with one" in detail
    restore()
    assert verify_adapter("chain-r001").ok

    # (c) the receipt row, behind the model's back
    row = Receipt.objects.get(kind="train", subject="chain-r001")
    original = row.body
    tamper_row(row, {**original, "training_data": {**original["training_data"], "sha256": "sha256:" + "0" * 64}})
    link, detail = _first()
    assert link == "train_receipt.row" and "altered" in detail
    tamper_row(row, original)
    assert verify_adapter("chain-r001").ok

    # (d) the pinned snapshot: edited, then gone; the CLI exits non-zero naming the link
    job = trained.training_job
    snapshot = Path(job.payload["snapshot_path"])
    restore = _restoring(snapshot)
    snapshot.write_bytes(snapshot.read_bytes().replace(b'"reward":1.0', b'"reward":0.0', 1))
    assert _first()[0] == "corpus.snapshot"
    with pytest.raises(CliError) as failure:
        run_verify(Namespace(name="chain-r001", json=False, url=None), client=ApiClient(api))
    assert "first broken link is corpus.snapshot" in failure.value.message
    assert any(line.startswith("BROKEN  corpus.snapshot") for line in capsys.readouterr().out.splitlines())
    restore()
    snapshot.unlink()
    link, detail = _first()
    assert link == "corpus.snapshot" and "missing" in detail


def test_an_unknown_adapter_is_404(api):  # noqa: F811
    response = api.get("/v1/adapters/nope/verify")
    assert response.status_code == 404 and response.json()["error"]["code"] == "adapter_not_found"
