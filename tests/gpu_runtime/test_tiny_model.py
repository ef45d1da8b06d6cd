"""`create_tiny_model`: deterministic files, a Qwen3-style tokenizer and template, and the accuracy band."""

from __future__ import annotations

import json

import pytest
from transformers import AutoConfig, AutoTokenizer

from gpu_runtime.identity import file_sha256
from gpu_runtime.sample_types import SampleRequest
from gpu_runtime.sampling import SamplingParams
from gpu_runtime.tiny_model import (
    DEFAULT_SCHEMA_STEPS,
    DEFAULT_VALUE_STEPS,
    DEFAULT_WARM_STEPS,
    RECIPE_FILE,
    create_tiny_model,
)
from gpu_runtime.tiny_tasks import held_out_arithmetic, is_held_out

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    RECIPE_FILE,
}


def digests(path):
    return {p.name: file_sha256(p) for p in sorted(path.iterdir())}


def test_same_seed_gives_byte_identical_files_and_another_seed_does_not(tmp_path):
    first = create_tiny_model(tmp_path / "a", seed=3, warm_steps=3, schema_steps=2, value_steps=2)
    second = create_tiny_model(tmp_path / "b", seed=3, warm_steps=3, schema_steps=2, value_steps=2)
    other = create_tiny_model(tmp_path / "c", seed=4, warm_steps=3, schema_steps=2, value_steps=2)
    assert set(digests(tmp_path / "a")) == EXPECTED_FILES
    assert digests(tmp_path / "a") == digests(tmp_path / "b")
    assert first["weights_sha256"] == second["weights_sha256"] != other["weights_sha256"]
    # The tokenizer and template come from the built-in corpus, not the seed.
    assert file_sha256(tmp_path / "a" / "tokenizer.json") == file_sha256(tmp_path / "c" / "tokenizer.json")
    assert not list(tmp_path.glob(".*")), "no staging directory is left behind"


def test_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        create_tiny_model(tmp_path / "m", warm_steps=0, schema_steps=0)
    assert (tmp_path / "m" / "keep.txt").read_text() == "mine"
    # overwrite=True (the CLI's --force) replaces the directory once the new model is complete.
    create_tiny_model(tmp_path / "m", warm_steps=0, schema_steps=0, overwrite=True)
    assert set(p.name for p in (tmp_path / "m").iterdir()) == EXPECTED_FILES
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_recipe_file_and_architecture(tiny_model):
    path, summary = tiny_model
    recipe = json.loads((path / RECIPE_FILE).read_text())
    assert recipe["schema"] == "kiln.tiny-model.v1"
    assert recipe["seed"] == 0 and recipe["warm_steps"] == DEFAULT_WARM_STEPS
    assert recipe.get("schema_steps", 0) == DEFAULT_SCHEMA_STEPS
    assert recipe.get("value_steps", 0) == DEFAULT_VALUE_STEPS
    assert recipe["corpus_sha256"].startswith("sha256:")
    assert recipe["held_out_accuracy"] == summary["held_out_accuracy"]
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    assert config.model_type == "qwen3" and config.architectures == ["Qwen3ForCausalLM"]
    assert 500 <= config.vocab_size <= 2048
    assert (path / "model.safetensors").stat().st_size < 8 * 1024 * 1024
    generation = json.loads((path / "generation_config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert generation["eos_token_id"] == [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.convert_tokens_to_ids("<|endoftext|>"),
    ]


def test_recorded_accuracy_is_in_the_band_grpo_needs(tiny_model):
    accuracy = tiny_model[1]["held_out_accuracy"]
    assert accuracy["temperature"] == 0.9 and accuracy["prompts"] == 200
    assert 0.10 <= accuracy["accuracy"] <= 0.90


def test_sampler_agrees_the_model_is_partly_right_on_held_out_questions(sampler):
    questions = held_out_arithmetic(120, seed=99)
    for q in questions:  # none of these pairs was seen during warm-up
        a, _, b = q.reasoning.split(" = ")[0].split(" ")
        assert is_held_out(int(a), int(b))
    requests = [
        SampleRequest(
            messages=[{"role": "user", "content": q.question}],
            enable_thinking=False,
            seed=i,
            sampling=SamplingParams(temperature=0.9, max_tokens=8),
        )
        for i, q in enumerate(questions)
    ]
    results = sampler.generate(requests)
    correct = sum(r.content.strip() == q.answer for r, q in zip(results, questions, strict=True))
    assert 0.10 <= correct / len(questions) <= 0.90
    # Varied answers, not one memorised string.
    assert len({r.content for r in results}) > 20


def test_tokenizer_has_qwen3_special_tokens_and_splits_digits(loaded):
    tok = loaded.tokenizer
    for token in ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>"):
        assert tok.convert_tokens_to_ids(token) is not None
        assert tok.encode(token, add_special_tokens=False) == [tok.convert_tokens_to_ids(token)]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    pieces = tok.convert_ids_to_tokens(tok.encode("1234", add_special_tokens=False))
    assert pieces == ["1", "2", "3", "4"]
    # <think> survives decoding; <|im_end|> is a control token and does not.
    ids = tok.encode("<think>\nx\n</think>\n\n7<|im_end|>", add_special_tokens=False)
    assert tok.decode(ids, skip_special_tokens=True) == "<think>\nx\n</think>\n\n7"


def test_chat_template_thinking_switch_and_roles(loaded):
    user = [{"role": "user", "content": "What is 2 + 2? Reply with just the number."}]
    off, _ = loaded.render_prompt(user, enable_thinking=False)
    on, _ = loaded.render_prompt(user, enable_thinking=True)
    assert (
        off == "<|im_start|>user\nWhat is 2 + 2? Reply with just the number.<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    )
    assert on.endswith("<|im_start|>assistant\n<think>\n") and "</think>" not in on
    convo = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "greet back"},
        {"role": "user", "content": [{"type": "text", "text": "Add "}, {"type": "text", "text": "1 and 1"}]},
        {"role": "assistant", "content": "2", "reasoning_content": "1 + 1 = 2"},
    ]
    text, ids = loaded.render_prompt(convo, add_generation_prompt=False)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nAdd 1 and 1<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n1 + 1 = 2\n</think>\n\n2<|im_end|>\n"
    )
    assert loaded.tokenizer.decode(ids) == text
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    with_tools, _ = loaded.render_prompt(
        [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 1}}}],
            },
            {"role": "tool", "content": "2"},
        ],
        tools=tools,
    )
    assert with_tools.startswith("<|im_start|>system\n# Tools\n")
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call><|im_end|>' in with_tools
    assert "<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n" in with_tools
