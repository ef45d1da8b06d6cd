"""The kiln.grpo-policy-audit.v1 accumulator fed by grpo_loss stats."""

import pytest
import torch

from core.canonical import json_digest
from core.contracts.grpo_config import GrpoConfig
from gpu_runtime.grpo.audit import PolicyAuditAccumulator, behavior_source_sha256
from gpu_runtime.grpo.losses import GrpoBatch, grpo_loss


def step_stats(ratios, reference_shift, level="token"):
    policy = torch.tensor([[0.0] + [-1.0] * len(ratios)], dtype=torch.float64)
    mask = torch.tensor([[False] + [True] * len(ratios)])
    behavior = policy - torch.log(torch.tensor([[1.0] + ratios], dtype=torch.float64))
    cfg = GrpoConfig.from_dict({"behavior_policy": "recorded", "is_level": level})
    batch = GrpoBatch(
        policy,
        mask,
        torch.tensor([1.0], dtype=torch.float64),
        behavior_logprobs=behavior,
        reference_logprobs=policy - reference_shift,
    )
    return grpo_loss(batch, cfg)[1]


def test_accumulates_steps_into_the_receipt_object():
    audit = PolicyAuditAccumulator()
    audit.observe_step(step_stats([1.5, 0.5], 0.1))
    audit.observe_step(step_stats([1.0], 0.4))
    receipt = audit.to_receipt()
    assert receipt["schema"] == "kiln.grpo-policy-audit.v1"
    sampling = receipt["importance_sampling"]
    assert (
        sampling["ratio_scope"] == "token"
        and sampling["action_tokens"] == 3
        and sampling["ratio_observations"] == 3
    )
    assert sampling["mean_ratio"] == pytest.approx(1.0)
    assert (sampling["min_ratio"], sampling["max_ratio"]) == pytest.approx((0.5, 1.5))
    assert (sampling["below_clip_count"], sampling["above_clip_count"]) == (1, 1)
    assert sampling["outside_clip_fraction"] == pytest.approx(2 / 3)
    kl = receipt["kl_reference"]
    assert kl["token_observations"] == 3 and kl["entropy_mask_applied_tokens"] == 3
    assert kl["mean_policy_reference_log_ratio"] == pytest.approx((0.1 + 0.1 + 0.4) / 3)
    assert kl["mean_estimator"] == pytest.approx((0.1 + 0.1 + 0.4) / 3)  # k1: before kl_coeff
    assert receipt["recorded_provenance"] == {
        "completion_count": 0,
        "sampled_action_tokens": 0,
        "forced_action_tokens": 0,
        "unique_behavior_sources": 0,
    }
    restored = PolicyAuditAccumulator.from_state(audit.state_dict())
    assert restored.to_receipt() == receipt


def test_ratio_scope_cannot_change_within_a_run():
    audit = PolicyAuditAccumulator()
    audit.observe_step(step_stats([1.0], 0.0))
    with pytest.raises(ValueError):
        audit.observe_step(step_stats([1.0], 0.0, level="sequence"))


def test_empty_audit_has_null_means():
    receipt = PolicyAuditAccumulator().to_receipt()
    assert receipt["importance_sampling"]["mean_ratio"] is None
    assert receipt["kl_reference"]["mean_estimator"] is None


def provenance(backend="kiln-torch", forced=1):
    return {
        "schema": "kiln.rollout-provenance.v1",
        "behavior_policy": {"served_model_id": "tiny", "base_model_sha256": "sha256:" + "0" * 64},
        "tokenizer": {"vocab_sha256": "sha256:" + "1" * 64},
        "template_invocation": {"tools": [], "template_kwargs": {}},
        "sampling": {"temperature": 0.9},
        "generation_backend": backend,
        "action_tokens": [{"source": "sampled"}] * 3 + [{"source": "forced"}] * forced,
    }


def test_recorded_provenance_groups_behavior_sources():
    audit = PolicyAuditAccumulator()
    audit.observe_recorded_completion(provenance())
    audit.observe_recorded_completion(provenance())
    audit.observe_recorded_completion(provenance(backend="other", forced=0))
    block = audit.to_receipt()["recorded_provenance"]
    assert (block["completion_count"], block["sampled_action_tokens"], block["forced_action_tokens"]) == (
        3,
        9,
        2,
    )
    assert block["unique_behavior_sources"] == 2
    digest = behavior_source_sha256(provenance())
    expected = json_digest(
        {
            "schema": "kiln.grpo-behavior-source.v1",
            **{
                k: provenance()[k]
                for k in (
                    "behavior_policy",
                    "tokenizer",
                    "template_invocation",
                    "sampling",
                    "generation_backend",
                )
            },
        }
    )
    assert digest == expected and digest.startswith("sha256:")
    source = next(s for s in block["behavior_sources"] if s["behavior_source_sha256"] == digest)
    assert set(source) == {"behavior_source_sha256", "counts", "behavior_policy", "tokenizer",
                           "template_invocation", "sampling", "generation_backend"}  # spec §2.9
    counts = source["counts"]
    assert (counts["completion_count"], counts["sampled_action_tokens"], counts["forced_action_tokens"]) == (
        2,
        6,
        2,
    )
    assert block["behavior_source_manifest_sha256"] == json_digest(
        {"schema": "kiln.grpo-behavior-source-manifest.v1", "sources": block["behavior_sources"]}
    )


def test_remembered_behavior_source_digests_are_always_the_canonical_ones():
    """Digests are remembered by the identity's plain JSON: every call still equals the canonical
    digest of what it was given, for values that print alike in one JSON and not in the other."""
    def canonical(record):
        return json_digest({"schema": "kiln.grpo-behavior-source.v1",
                            **{k: record.get(k) for k in ("behavior_policy", "tokenizer", "template_invocation",
                                                           "sampling", "generation_backend")}})

    variants = [{"temperature": 1}, {"temperature": 1.0}, {"temperature": True}, {"temperature": 0.9},
                {"temperature": 0.9, "top_k": 0}]
    for _ in range(2):  # the second pass is served from memory
        digests = []
        for sampling in variants:
            record = {**provenance(), "sampling": sampling}
            assert behavior_source_sha256(record) == canonical(record)
            digests.append(behavior_source_sha256(record))
    assert digests[0] == digests[1] != digests[2]  # RFC 8785 writes 1 and 1.0 alike; true is not 1
    assert len(set(digests[2:])) == 3
