"""The verifier on hand-built chains (no model): the gate links (results file, gate row, the decision
recomputed with paired_wilson_v1), activation, the base_adapter lineage, provenance and the link registry."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from adapters.models import Adapter
from adapters.verify import link_names, verify_adapter
from core.jobs.models import Job
from core.models import Receipt
from tests.adapters_verify.chain_support import GROUPS, build_chain, tamper_row

pytestmark = pytest.mark.django_db


@pytest.fixture
def home(settings, tmp_path):
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"


def _broken(name: str) -> tuple[str | None, str]:
    report = verify_adapter(name)
    first = report.first_broken
    return (first.link, first.detail) if first else (None, "")


def test_the_walk_order_names_every_link():
    assert link_names() == [
        "adapter.row", "adapter.bytes", "training.job", "train_receipt.row", "train_receipt.file",
        "train_receipt.output", "adapter_manifest.file", "corpus.snapshot", "corpus.provenance", "base_adapter", "post_eval.job",
        "post_eval.eval_results", "post_eval.gate_receipt", "post_eval.gate_decision", "environment_gate",
        "environment_gate.activation", "activation", "promotion",
        "receipts.rows"]


def test_a_gated_promoted_adapter_verifies_end_to_end(home):
    build_chain(home, "gated", gated=True, loaded=True)
    report = verify_adapter("gated")
    assert report.ok, report.to_dict()
    links = {link.link: link for link in report.links}
    assert "promoted" in links["post_eval.gate_decision"].detail
    assert "activation receipt row" in links["activation"].detail
    body = report.to_dict()
    assert body["ok"] is True and body["first_broken"] is None
    assert set(body["links"][0]) == {"link", "ok", "checked", "detail", "expected", "actual"}
    assert all(link["checked"] for link in body["links"])  # a chain trained here is checked throughout


def test_a_tampered_results_file_breaks_the_eval_link(home):
    build_chain(home, "gated", gated=True, loaded=True)
    eval_job = Job.objects.get(kind="eval.run")
    path = Path(eval_job.result["results_path"])
    document = json.loads(path.read_text())
    document["records"][1]["outcome"] = "fail"  # the candidate lost one example
    path.write_text(json.dumps(document))
    link, detail = _broken("gated")
    assert link == "post_eval.eval_results" and "results.json" in detail
    # the decision cannot be recomputed from an altered file either
    assert not {x.link: x for x in verify_adapter("gated").links}["post_eval.gate_decision"].ok


def test_an_edited_gate_row_breaks_the_gate_receipt_link(home):
    build_chain(home, "gated", gated=True, loaded=True)
    row = Receipt.objects.get(kind="post_eval_gate", subject="gated")
    tamper_row(row, {**row.body, "evidence": {**row.body["evidence"], "minimum_accuracy": 0.1}})
    link, detail = _broken("gated")
    assert link == "post_eval.gate_receipt" and "altered" in detail


def test_recorded_evidence_the_results_do_not_support_breaks_the_gate_decision(home):
    """Row and job agree and hash fine, but the evidence claims counts the results file does not give."""
    from core.receipts import receipt_record

    build_chain(home, "gated", gated=True, loaded=True)
    post = Job.objects.get(kind="training.post_eval")
    evidence = {**post.result["post_eval_gate_evidence"][0], "improved": 20}
    Job.objects.filter(id=post.id).update(result={**post.result, "post_eval_gate_evidence": [evidence]})
    old = Receipt.objects.get(kind="post_eval_gate", subject="gated")
    receipt_record(kind="post_eval_gate", subject="gated", job=post, body={**old.body, "evidence": evidence})
    link, detail = _broken("gated")
    assert link == "post_eval.gate_decision" and "improved" in detail


def test_an_active_gated_adapter_without_an_activation_row_is_unjustified(home):
    build_chain(home, "gated", gated=True, loaded=True, activation=False)
    link, detail = _broken("gated")
    assert link == "activation" and "no activation receipt" in detail


def test_an_active_adapter_without_auto_load_or_activation_is_unjustified(home):
    build_chain(home, "plain", loaded=True, auto_load=False)
    assert _broken("plain")[0] == "activation"
    build_chain(home, "auto", loaded=True, auto_load=True)
    assert verify_adapter("auto").ok


def test_any_tampered_row_about_the_adapter_is_named(home):
    """A later receipt kind (promotion, approval) is covered by the catch-all row check."""
    from core.receipts import receipt_record

    build_chain(home, "plain")
    row = receipt_record(kind="activation", subject="plain", body={"schema": "x", "note": "a later decision"})
    tamper_row(row, {"schema": "x", "note": "edited"})
    link, _ = _broken("plain")
    assert link == "activation"  # an altered row of a kind a link reads is named by that link
    assert not {x.link: x for x in verify_adapter("plain").links}["receipts.rows"].ok


def test_the_parent_is_verified_as_a_link(home):
    parent = build_chain(home, "r001")
    build_chain(home, "r002", base=parent)
    report = verify_adapter("r002")
    assert report.ok
    parent_links = len(verify_adapter("r001").links)
    [lineage] = [link for link in report.links if link.link == "base_adapter"]
    # a parent whose links all check counts them all (an uploaded one's unchecked links are named apart)
    assert f"verifies ({parent_links} links) and is" in lineage.detail and "not checkable" not in lineage.detail
    weights = Path(parent.path) / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes() + b"!")
    link, detail = _broken("r002")
    assert link == "base_adapter" and "'r001' fails at adapter.bytes" in detail


def test_a_replaced_parent_breaks_the_lineage(home):
    parent = build_chain(home, "r001")
    build_chain(home, "r002", base=parent)
    Adapter.objects.filter(name="r001").update(content_sha256="sha256:" + "9" * 64)
    link, detail = _broken("r002")
    assert link == "base_adapter" and "'r001' is now sha256:999" in detail


def _provenance(messages, text):
    from types import SimpleNamespace

    from core.contracts.provenance import build_rollout_provenance

    ids = [11 + (ord(ch) % 40) for ch in text]
    result = SimpleNamespace(
        prompt_token_ids=[1, 2, 3], completion_token_ids=ids, token_logprobs=[-0.5] * len(ids),
        token_sources=["sampled"] * len(ids), seed=3,
        behavior_policy={"served_model_id": "kiln-tiny", "base_model_sha256": "sha256:" + "4" * 64,
                         "inference_config_sha256": "sha256:" + "5" * 64, "implementation": "kiln-python-sampler"},
        tokenizer={"vocab_sha256": "sha256:" + "1" * 64, "config_sha256": "sha256:" + "2" * 64,
                   "chat_template_sha256": "sha256:" + "3" * 64},
        sampling={"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "max_tokens": 16,
                  "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "stop": []},
        generation_backend="torch-cpu", template_invocation={"tools": [], "template_kwargs": {}})
    return build_rollout_provenance(result, prompt_messages=messages, text=text)


def test_rollout_provenance_in_the_corpus_is_checked(home):
    groups = [{**g, "completions": [{**c, "provenance": _provenance(g["messages"], c["text"])}
                                    for c in g["completions"]]} for g in GROUPS]
    build_chain(home, "prov", groups=groups)
    report = verify_adapter("prov")
    assert report.ok, report.to_dict()
    assert "6 of 6 completions carry valid provenance" in {x.link: x for x in report.links}["corpus.provenance"].detail
    groups[1]["completions"][0]["text"] = "edited after sampling"
    build_chain(home, "prov2", groups=groups)
    link, detail = _broken("prov2")
    assert link == "corpus.provenance" and "groups[1].completions[0]" in detail and "scored_payload" in detail


def test_an_unknown_or_unpublished_adapter_stops_at_the_row(home):
    report = verify_adapter("nope")
    assert [x.link for x in report.links] == ["adapter.row"] and not report.ok


def test_a_load_by_hand_justifies_activation_when_its_row_names_these_bytes(home):
    from core.receipts import receipt_record

    adapter = build_chain(home, "manual", gated=True, loaded=True, activation=False)
    receipt_record(kind="activation", subject="manual", body={
        "schema": "kiln.adapter-activation.v1", "adapter": "manual", "reason": "looks fine to me",
        "content_sha256": adapter.content_sha256, "actor": "reviewer"})
    report = verify_adapter("manual")
    assert report.ok, report.to_dict()
    assert "loaded by hand by reviewer" in {x.link: x for x in report.links}["activation"].detail


def test_discovering_the_links_keeps_the_web_process_torch_free():
    import subprocess
    import sys

    code = ("import django, sys; django.setup(); import adapters.api; from adapters.verify import link_names; "
            "assert 'post_eval.gate_decision' in link_names(); "
            "print([m for m in sys.modules if m.split('.')[0] in ('torch', 'transformers', 'peft', 'gpu_runtime')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "tests.settings"})
    assert out.stdout.strip() == "[]", out.stderr


def test_a_post_eval_killed_before_its_gate_decided_is_a_recorded_fact_not_a_broken_link(home):
    """QA: an adapter whose post-eval worker was killed, later approved by hand, failed `kiln adapters
    verify` (chain_broken at post_eval.job) for ever, though every byte and row was intact."""
    build_chain(home, "gated", gated=True, loaded=False)
    post = Job.objects.get(kind="training.post_eval")
    Receipt.objects.filter(kind="post_eval_gate", subject="gated").delete()  # it died before recording one
    Job.objects.filter(id=post.id).update(state="failed", error_code="job_interrupted", result={})
    report = verify_adapter("gated")
    assert report.ok, report.to_dict()
    links = {link.link: link for link in report.links}
    assert "ended failed (job_interrupted) before its gate decided" in links["post_eval.job"].detail
    assert links["post_eval.gate_receipt"].detail == "no gate decided"
    # a row altered elsewhere in the same chain is still found
    row = Receipt.objects.get(kind="train", subject="gated")
    tamper_row(row, {**row.body, "status": "forged"})
    assert _broken("gated")[0] == "train_receipt.row"
