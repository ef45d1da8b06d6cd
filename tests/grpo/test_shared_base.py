"""A trainer beside the sampler builds on the resident model's weights: one copy of the base, same training.

The GPU worker keeps the served model resident; `TrainRequest.shared_base` (the loaded model's
`SharedBase`) lets a GRPO run use those very tensors instead of reading the weights again. These
tests hold that it trains exactly what a run from disk trains, leaves the sampler's model and
outputs untouched, and falls back (recorded, with the reason) when the resident model differs.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from gpu_runtime.grpo.adapter_io import attach_lora
from tests.grpo.tiny_support import fixed_groups, run, train_request


@pytest.fixture(scope="module")
def resident(tiny_model_dir):
    from gpu_runtime.model_loading import load_model
    from gpu_runtime.sampler import Sampler

    loaded = load_model(tiny_model_dir, device="cpu")
    return loaded, Sampler(loaded)


def _samples(sampler, seeds=(1, 2, 3)):
    from gpu_runtime.sample_types import SampleRequest
    from gpu_runtime.sampling import SamplingParams

    requests = [
        SampleRequest(messages=[{"role": "user", "content": "What is 7 + 5?"}],
                      sampling=SamplingParams(temperature=1.0, max_tokens=8), seed=seed, enable_thinking=False)
        for seed in seeds
    ]
    return [(r.completion_token_ids, r.token_logprobs) for r in sampler.generate(requests)]


def _snapshot(model) -> dict[str, torch.Tensor]:
    return {name: t.detach().clone() for name, t in model.state_dict().items()}


def test_a_fresh_model_shares_every_tensor_but_no_module(resident):
    loaded, _ = resident
    fresh = loaded.shared_base.fresh_model()
    own = dict(loaded.model.named_parameters())
    for name, parameter in fresh.named_parameters():
        assert parameter.data_ptr() == own[name].data_ptr(), name
    assert not any(a is b for a, b in zip(fresh.modules(), loaded.model.modules(), strict=True))
    # peft wraps the fresh tree's projections, never the resident model's.
    attach_lora(fresh, rank=4, alpha=8)
    assert any("lora_A" in name for name, _ in fresh.named_modules())
    assert not any("lora" in name for name, _ in loaded.model.named_modules())


def test_training_on_the_resident_weights_equals_training_from_disk(resident, tiny_model_dir, tmp_path, one_thread):
    loaded, sampler = resident
    before_weights, before_samples = _snapshot(loaded.model), _samples(sampler)
    groups = fixed_groups(3)
    shared = run(train_request(tiny_model_dir, groups, tmp_path / "shared", "s",
                               request_kwargs={"shared_base": loaded.shared_base}))
    from_disk = run(train_request(tiny_model_dir, groups, tmp_path / "disk", "s"))

    assert shared.receipt["runtime"]["execution_provenance"]["base_weights"] == "shared_with_sampler"
    assert from_disk.receipt["runtime"]["execution_provenance"]["base_weights"] == "read_from_disk"
    assert shared.receipt["fallbacks"] == []
    # Same tensors in, same arithmetic: the adapters are bit for bit the same, and so are the losses.
    trained = load_file(shared.adapter_path / "adapter_model.safetensors")
    reference = load_file(from_disk.adapter_path / "adapter_model.safetensors")
    assert trained.keys() == reference.keys() and len(trained) > 0
    for name in trained:
        assert torch.equal(trained[name], reference[name]), name
    assert any(t.abs().sum() > 0 for name, t in trained.items() if "lora_B" in name)  # it did train
    assert [h["loss"] for h in shared.receipt["loss_history"]] == [h["loss"] for h in from_disk.receipt["loss_history"]]

    # The sampler's model is as loaded: same weights, no adapter layers, the same samples.
    after = _snapshot(loaded.model)
    assert after.keys() == before_weights.keys()
    assert all(torch.equal(after[name], before_weights[name]) for name in after)
    assert not any("lora" in name for name, _ in loaded.model.named_modules())
    assert _samples(sampler) == before_samples


def test_a_trainer_on_the_resident_weights_records_their_identity_without_hashing_the_files(
        resident, tiny_model_dir, tmp_path, one_thread, monkeypatch):
    """The sampler hashed the weight files when it loaded them: a run on those very tensors records
    that identity (the serving name aside) and reads no weight file to hash it again."""
    import gpu_runtime.model_loading as model_loading

    loaded, _ = resident

    def no_hashing(*args, **kwargs):
        raise AssertionError("the trainer hashed the weight files again")

    monkeypatch.setattr(model_loading, "identity_of", no_hashing)
    result = run(train_request(tiny_model_dir, fixed_groups(1), tmp_path, "i",
                               request_kwargs={"shared_base": loaded.shared_base}))
    assert result.receipt["runtime"]["execution_provenance"]["base_weights"] == "shared_with_sampler"
    assert loaded.shared_base.identity == {k: v for k, v in loaded.identity.items() if k != "served_model_id"}
    assert result.receipt["model"]["base_model_sha256"] == loaded.identity["base_model_sha256"]
    assert result.receipt["model"]["base_weight_shard_manifest"] == loaded.identity["weights_manifest"]
    assert (result.receipt["runtime"]["execution_provenance"]["inference_config_sha256"]
            == loaded.identity["inference_config_sha256"])


def test_a_resident_model_of_another_directory_is_not_used(resident, tiny_model_dir, tmp_path, one_thread):
    loaded, _ = resident
    other = tmp_path / "other-model"
    shutil.copytree(tiny_model_dir, other)
    result = run(train_request(other, fixed_groups(1), tmp_path, "o", request_kwargs={"shared_base": loaded.shared_base}))
    assert result.receipt["runtime"]["execution_provenance"]["base_weights"] == "read_from_disk"
    (fallback,) = [f for f in result.receipt["fallbacks"] if f["capability"] == "shared_base_weights"]
    assert fallback["fallback"] == "read_from_disk" and str(other) in fallback["reason"]
    # Its identity is hashed from the directory it trains on (a copy: the same weights).
    assert result.receipt["model"]["base_model_sha256"] == loaded.identity["base_model_sha256"]


def test_a_resident_model_in_another_precision_or_place_says_why(resident, tiny_model_dir):
    shared = resident[0].shared_base
    assert shared.unusable_for(tiny_model_dir, torch.device("cpu"), torch.float32) is None
    assert "bfloat16" in shared.unusable_for(tiny_model_dir, torch.device("cpu"), torch.bfloat16)
    assert "cuda" in shared.unusable_for(tiny_model_dir, torch.device("cuda"), torch.float32)


def test_the_sampler_and_the_trainer_share_the_base_models_stacked_projections(resident):
    """A base-model inference plan (nothing to fold) and a training plan use one stacked q|k|v copy;
    an inference plan that folds an adapter in stacks its own."""
    from gpu_runtime import lean_decoder

    loaded, _ = resident
    inference = lean_decoder.plan_for(loaded.model, merge_lora=True)
    fresh = attach_lora(loaded.shared_base.fresh_model(), rank=4, alpha=8)
    training = lean_decoder.plan_for(fresh)
    assert inference.layers[0].qkv.weight is not None
    assert inference.layers[0].qkv.weight.data_ptr() == training.layers[0].qkv.weight.data_ptr()
    assert inference.layers[0].gate_up.weight.data_ptr() == training.layers[0].gate_up.weight.data_ptr()
    with torch.no_grad():
        for name, parameter in fresh.named_parameters():
            if "lora_B" in name:
                parameter.fill_(0.01)
    folded = lean_decoder.plan_for(fresh, merge_lora=True)
    assert folded.layers[0].qkv.weight.data_ptr() != training.layers[0].qkv.weight.data_ptr()
    assert folded.layers[0].gate_up.weight.data_ptr() == training.layers[0].gate_up.weight.data_ptr()  # no LoRA there
