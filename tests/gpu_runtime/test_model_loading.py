"""load_model: identity hashes (stable, and sensitive to the files they cover) and coded load errors."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from core.canonical import json_digest
from gpu_runtime.identity import file_manifest, manifest_digest
from gpu_runtime.model_loading import ModelLoadError, load_model

SHA = re.compile(r"^sha256:[0-9a-f]{64}$")


@pytest.fixture
def model_copy(tiny_model, tmp_path):
    target = tmp_path / "copy"
    shutil.copytree(tiny_model[0], target)
    return target


def test_identity_fields_and_values(loaded, tiny_model):
    ident = loaded.identity
    for value in (ident["base_model_sha256"], ident["inference_config_sha256"], *ident["tokenizer"].values()):
        assert SHA.match(value)
    weights = file_manifest(tiny_model[0], ["model.safetensors"])
    assert ident["weights_manifest"] == weights
    assert ident["base_model_sha256"] == manifest_digest(weights) == json_digest(weights)
    assert ident["inference_config"] == {
        "schema": "kiln.inference-config.v1",
        "device_type": "cpu",
        "dtype": "float32",
        "attn_implementation": "sdpa",
        "sampling_dtype": "float32",
        "cdf_dtype": "float64",
    }
    assert ident["inference_config_sha256"] == json_digest(ident["inference_config"])
    template = (tiny_model[0] / "chat_template.jinja").read_bytes()
    assert (
        ident["tokenizer"]["chat_template_sha256"]
        == "sha256:" + __import__("hashlib").sha256(template).hexdigest()
    )
    assert loaded.device == torch.device("cpu") and loaded.dtype == torch.float32
    assert loaded.served_model_id == tiny_model[0].name
    assert ident["generation_backend"] == "torch-cpu"
    assert ident["implementation"].startswith("kiln.gpu_runtime.sampler/1 torch/")


def test_identity_is_stable_across_loads(model_copy, loaded):
    again = load_model(model_copy)
    assert again.identity["base_model_sha256"] == loaded.identity["base_model_sha256"]
    assert again.identity["tokenizer"] == loaded.identity["tokenizer"]
    assert again.identity["inference_config_sha256"] == loaded.identity["inference_config_sha256"]


def test_each_digest_follows_its_own_files(model_copy, loaded):
    base = loaded.identity
    # One flipped weight byte near the end of the file (inside the tensor data).
    weights = model_copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0x01
    weights.write_bytes(bytes(data))
    (model_copy / "chat_template.jinja").write_text((model_copy / "chat_template.jinja").read_text() + " ")
    changed = load_model(model_copy).identity
    assert changed["base_model_sha256"] != base["base_model_sha256"]
    assert changed["tokenizer"]["chat_template_sha256"] != base["tokenizer"]["chat_template_sha256"]
    assert changed["tokenizer"]["vocab_sha256"] == base["tokenizer"]["vocab_sha256"]
    assert changed["tokenizer"]["config_sha256"] == base["tokenizer"]["config_sha256"]


def test_vocab_and_tokenizer_config_digests(model_copy, loaded):
    spec = json.loads((model_copy / "tokenizer.json").read_text())
    top = max(max(spec["model"]["vocab"].values()), max(t["id"] for t in spec["added_tokens"]))
    spec["model"]["vocab"]["kilnzz"] = top + 1  # one more vocabulary entry
    assert spec["normalizer"] == {"type": "NFC"}
    spec["normalizer"] = {"type": "NFKC"}  # changes token ids of some text: part of the tokenizer config
    (model_copy / "tokenizer.json").write_text(json.dumps(spec))
    changed = load_model(model_copy).identity["tokenizer"]
    assert changed["vocab_sha256"] != loaded.identity["tokenizer"]["vocab_sha256"]
    assert changed["config_sha256"] != loaded.identity["tokenizer"]["config_sha256"]
    assert changed["chat_template_sha256"] == loaded.identity["tokenizer"]["chat_template_sha256"]


def test_render_prompt_returns_text_and_matching_ids(loaded):
    text, ids = loaded.render_prompt([{"role": "user", "content": "Hello!"}], enable_thinking=False)
    assert ids == loaded.tokenizer.encode(text, add_special_tokens=False)
    assert ids[0] == loaded.tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert loaded.eos_token_ids == (
        loaded.tokenizer.convert_tokens_to_ids("<|im_end|>"),
        loaded.tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    )


def _code(path) -> str:
    with pytest.raises(ModelLoadError) as info:
        load_model(path)
    assert info.value.message
    return info.value.code


def test_load_errors_have_stable_codes(tmp_path, model_copy):
    assert _code(None) == "model_not_configured"
    assert _code("  ") == "model_not_configured"
    assert _code(tmp_path / "nowhere") == "model_path_missing"
    (tmp_path / "empty").mkdir()
    assert _code(tmp_path / "empty") == "model_path_invalid"
    (tmp_path / "file").write_text("x")
    assert _code(tmp_path / "file") == "model_path_invalid"

    no_weights = tmp_path / "no-weights"
    shutil.copytree(model_copy, no_weights)
    (no_weights / "model.safetensors").unlink()
    assert _code(no_weights) == "model_weights_missing"

    corrupt = tmp_path / "corrupt"
    shutil.copytree(model_copy, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    assert _code(corrupt) == "model_load_failed"

    no_template = tmp_path / "no-template"
    shutil.copytree(model_copy, no_template)
    (no_template / "chat_template.jinja").unlink()
    assert _code(no_template) == "chat_template_missing"

    bad_tokenizer = tmp_path / "bad-tokenizer"
    shutil.copytree(model_copy, bad_tokenizer)
    (bad_tokenizer / "tokenizer.json").write_text("{broken")
    assert _code(bad_tokenizer) == "tokenizer_load_failed"


def test_rendered_prompts_are_remembered_but_never_shared(loaded):
    """A GRPO group renders one prompt many times: later renders come from memory, equal to a fresh
    render, and a caller that changes its ids cannot change what the next caller gets."""
    from gpu_runtime.model_loading import render_prompt

    messages = [{"role": "user", "content": "What is 2 + 3?"}]
    first_text, first_ids = loaded.render_prompt(messages, enable_thinking=False)
    first_ids.append(-1)
    text, ids = loaded.render_prompt(messages, enable_thinking=False)
    assert (text, ids) == render_prompt(loaded.tokenizer, messages, enable_thinking=False)
    assert ids[-1] != -1 and text == first_text
    thinking_text, _ = loaded.render_prompt(messages, enable_thinking=True)
    assert thinking_text != text  # the call's arguments are part of what is remembered


def test_a_template_that_reads_the_clock_is_rendered_every_time(loaded, monkeypatch):
    from gpu_runtime import model_loading

    template = loaded.tokenizer.chat_template
    monkeypatch.setattr(loaded.tokenizer, "chat_template", template + "{# strftime_now #}")
    calls = []
    real = model_loading.render_prompt
    monkeypatch.setattr(model_loading, "render_prompt", lambda *a, **k: calls.append(1) or real(*a, **k))
    for _ in range(2):
        loaded.render_prompt([{"role": "user", "content": "What day is it?"}], enable_thinking=False)
    assert len(calls) == 2
