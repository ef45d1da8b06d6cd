"""Per-request LoRA adapters: resolution, effect on outputs, isolation inside batches, content identity."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

from core.contracts.provenance import build_rollout_provenance
from gpu_runtime.identity import file_manifest, manifest_digest
from gpu_runtime.model_loading import load_model
from gpu_runtime.sample_types import SampleRequest, SampleRequestError
from gpu_runtime.sampler import Sampler
from gpu_runtime.sampling import SamplingParams

PROMPT = [{"role": "user", "content": "What is 21 + 34? Reply with just the number."}]
TARGETS = ["q_proj", "v_proj", "o_proj", "down_proj"]


def make_adapter(base_dir, out_dir, *, seed: int, random_b: bool = True):
    """Save a LoRA adapter; with random_b the B matrices are non-zero, so the adapter changes outputs."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True)
    config = LoraConfig(r=4, lora_alpha=16, target_modules=TARGETS, init_lora_weights=not random_b)
    peft_model = get_peft_model(model, config)
    peft_model.save_pretrained(out_dir)
    return out_dir


def make_strong_adapter(base_dir, out_dir, *, seed: int):
    """A LoRA that moves the logits far (r=4 on q/v, B drawn from N(0, 1)): the kind whose sampled
    tokens once changed with the batch around a request."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, local_files_only=True)
    peft_model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0.0, 1.0)
    peft_model.save_pretrained(out_dir)
    return out_dir


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {
        "tuned": make_adapter(tiny_model[0], root / "tuned", seed=1),
        "zero": make_adapter(tiny_model[0], root / "zero", seed=2, random_b=False),
        "strong": make_strong_adapter(tiny_model[0], root / "strong", seed=3),
    }


@pytest.fixture(scope="module")
def adapter_sampler(tiny_model, adapter_dirs):
    # A model of its own: the first adapter load wraps the model with peft in place.
    loaded = load_model(tiny_model[0])
    names = dict(adapter_dirs, **{"team.v1.2": adapter_dirs["tuned"]})  # dots are not peft-safe
    return Sampler(loaded, names.get)


def req(adapter=None, *, seed=0, max_tokens=12, temperature=1.0):
    return SampleRequest(
        messages=PROMPT,
        adapter=adapter,
        seed=seed,
        enable_thinking=True,
        sampling=SamplingParams(temperature=temperature, max_tokens=max_tokens),
    )


def test_a_non_zero_adapter_changes_outputs_and_a_zero_one_does_not(adapter_sampler):
    base, tuned, zero, base_again = adapter_sampler.generate(
        [
            req(temperature=0),
            req("tuned", temperature=0),
            req("zero", temperature=0),
            req("base", temperature=0),
        ]
    )
    assert tuned.completion_token_ids != base.completion_token_ids
    assert zero.completion_token_ids == base.completion_token_ids == base_again.completion_token_ids
    assert zero.token_logprobs == base.token_logprobs
    assert base.adapter is None and base_again.adapter is None
    assert tuned.adapter["name"] == "tuned"


def test_adapters_are_never_mixed_inside_a_batch(adapter_sampler):
    alone = [adapter_sampler.generate([r])[0] for r in (req(seed=7), req("tuned", seed=7))]
    mixed = adapter_sampler.generate([req("tuned", seed=7), req(seed=7), req("tuned", seed=8), req(seed=8)])
    assert mixed[1].completion_token_ids == alone[0].completion_token_ids
    assert mixed[0].completion_token_ids == alone[1].completion_token_ids
    assert mixed[0].token_logprobs == pytest.approx(alone[1].token_logprobs, abs=1e-5)


def ask(content, adapter, *, seed, max_tokens=6, temperature=2.0):
    return SampleRequest(
        messages=[{"role": "user", "content": content}],
        adapter=adapter,
        seed=seed,
        sampling=SamplingParams(temperature=temperature, max_tokens=max_tokens),
        ignore_eos=True,
    )


@pytest.mark.parametrize("adapter", ["strong", None])
def test_a_request_gets_bitwise_the_same_logits_alone_and_in_any_batch(adapter_sampler, adapter):
    """Batch invariance bit for bit, for a strong adapter's cohort as for the base model's: a row's
    logits (so its log-probs, exactly, and its seeded tokens) do not depend on the rows around it,
    whether they share its prefill, are longer or shorter, or were decoding before it joined."""
    target = ask("What is 47 + 13?", adapter, seed=27)
    alone = adapter_sampler.generate([target])[0]
    neighbours = [
        ask("Hello!", adapter, seed=1, max_tokens=3),
        ask("Tell me a fact about cats, then one about dogs.", adapter, seed=2, temperature=1.0),
        ask("What is 3 + 4? Reply with just the number.", adapter, seed=3, max_tokens=9),
    ]
    batched = adapter_sampler.generate([neighbours[0], target, *neighbours[1:]])[1]
    assert batched.completion_token_ids == alone.completion_token_ids
    assert batched.token_logprobs == alone.token_logprobs  # equal, not close

    early = [adapter_sampler.submit(n) for n in neighbours[1:]]
    adapter_sampler.step()
    adapter_sampler.step()
    late = adapter_sampler.submit(target)
    while not (late.done() and all(h.done() for h in early)):
        adapter_sampler.step()
    assert late.result().completion_token_ids == alone.completion_token_ids
    assert late.result().token_logprobs == alone.token_logprobs


def test_adapter_names_are_any_registry_names(adapter_sampler):
    dotted, tuned = adapter_sampler.generate([req("team.v1.2", seed=5), req("tuned", seed=5)])
    assert dotted.completion_token_ids == tuned.completion_token_ids
    assert dotted.adapter == {"name": "team.v1.2", "content_sha256": tuned.adapter["content_sha256"]}


def test_adapter_logprobs_match_a_fresh_peft_forward(adapter_sampler, tiny_model, adapter_dirs):
    result = adapter_sampler.generate([req("tuned", seed=3, max_tokens=16)])[0]
    reference = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model[0], local_files_only=True), adapter_dirs["tuned"]
    )
    ids = result.prompt_token_ids + result.completion_token_ids
    with torch.inference_mode():
        logprobs = torch.log_softmax(reference(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    start = len(result.prompt_token_ids) - 1
    expected = [float(logprobs[start + i, t]) for i, t in enumerate(result.completion_token_ids)]
    assert expected == pytest.approx(result.token_logprobs, abs=1e-4)


def test_provenance_names_the_adapter_by_content(adapter_sampler, adapter_dirs):
    result = adapter_sampler.generate([req("tuned", seed=4)])[0]
    digest = manifest_digest(
        file_manifest(adapter_dirs["tuned"], ["adapter_config.json", "adapter_model.safetensors"])
    )
    assert result.adapter == {"name": "tuned", "content_sha256": digest}
    record = build_rollout_provenance(result, prompt_messages=PROMPT)
    assert record["behavior_policy"]["adapter"] == {"name": "tuned", "content_sha256": digest}
    base_record = build_rollout_provenance(adapter_sampler.generate([req(seed=4)])[0], prompt_messages=PROMPT)
    assert "adapter" not in base_record["behavior_policy"]


def test_a_republished_adapter_is_reloaded_under_its_new_digest(tiny_model, tmp_path):
    path = make_adapter(tiny_model[0], tmp_path / "live", seed=5)
    sampler = Sampler(load_model(tiny_model[0]), lambda name: path if name == "live" else None)
    before = sampler.generate([req("live", temperature=0)])[0]
    make_adapter(tiny_model[0], tmp_path / "live", seed=6)  # same name, new weights
    after = sampler.generate([req("live", temperature=0)])[0]
    assert before.adapter["content_sha256"] != after.adapter["content_sha256"]
    assert before.completion_token_ids != after.completion_token_ids


def test_unknown_and_broken_adapters_fail_with_codes(adapter_sampler, adapter_dirs, tmp_path):
    handle = adapter_sampler.submit(req("missing"))
    adapter_sampler.step()
    with pytest.raises(SampleRequestError) as info:
        handle.result(timeout=5)
    assert info.value.code == "adapter_not_found"

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4, "target_modules": ["nope"]}')
    (broken / "adapter_model.safetensors").write_bytes(b"garbage")
    # A config that disagrees with its weights (rank 8 declared, rank 4 stored) fails inside peft.
    mismatched = tmp_path / "mismatched"
    shutil.copytree(adapter_dirs["tuned"], mismatched)
    config = json.loads((mismatched / "adapter_config.json").read_text())
    (mismatched / "adapter_config.json").write_text(json.dumps(dict(config, r=8)))
    dirs = {"broken": broken, "mismatched": mismatched, "tuned": adapter_dirs["tuned"]}
    sampler = Sampler(load_model(adapter_sampler._loaded.path), dirs.get)
    before = sampler.generate([req(temperature=0)])[0]
    for name in ("broken", "mismatched"):
        handle = sampler.submit(req(name))
        sampler.step()
        with pytest.raises(SampleRequestError) as info:
            handle.result(timeout=5)
        assert info.value.code == "adapter_load_failed"
        # The sampler keeps serving the base model, unchanged.
        after = sampler.generate([req(temperature=0)])[0]
        assert after.completion_token_ids == before.completion_token_ids
        assert after.token_logprobs == pytest.approx(before.token_logprobs, abs=1e-6)
    tuned = sampler.generate([req("tuned", temperature=0)])[0]
    assert tuned.completion_token_ids != before.completion_token_ids


def test_bytes_that_no_longer_match_the_registry_digest_are_not_served(tiny_model, tmp_path):
    """With the registry's digest the resolver passes, an adapter whose files changed after
    publication is refused (adapter_content_mismatch), both on its first load and once cached."""
    path = make_adapter(tiny_model[0], tmp_path / "pub", seed=7)
    published = manifest_digest(file_manifest(path, ["adapter_config.json", "adapter_model.safetensors"]))
    registry = {"pub": (path, published)}
    sampler = Sampler(load_model(tiny_model[0]), registry.get)
    served = sampler.generate([req("pub", temperature=0)])[0]
    assert served.adapter == {"name": "pub", "content_sha256": published}

    weights = path / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one flipped bit in the weights
    weights.write_bytes(bytes(data))
    for _ in range(2):
        handle = sampler.submit(req("pub", temperature=0))
        sampler.step()
        with pytest.raises(SampleRequestError) as info:
            handle.result(timeout=5)
        assert info.value.code == "adapter_content_mismatch"
        assert published in info.value.message and "kiln adapters verify pub" in info.value.message
    # Republished (the registry now holds the new digest): served again.
    registry["pub"] = (path, manifest_digest(file_manifest(path, ["adapter_config.json", "adapter_model.safetensors"])))
    assert sampler.generate([req("pub", temperature=0)])[0].adapter["content_sha256"] == registry["pub"][1]
