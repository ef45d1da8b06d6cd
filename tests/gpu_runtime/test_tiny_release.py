"""The shipped demo model: `kiln model create-tiny` installs the same verified bytes on every machine."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_runtime import tiny_release
from gpu_runtime.tiny_model import DEFAULT_SCHEMA_STEPS, DEFAULT_VALUE_STEPS, DEFAULT_WARM_STEPS

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_release_matches_its_manifest_and_the_documented_digest():
    manifest = tiny_release.verify()
    assert manifest["recipe"]["seed"] == 0 and manifest["recipe"]["warm_steps"] == DEFAULT_WARM_STEPS
    assert manifest["recipe"].get("schema_steps", 0) == DEFAULT_SCHEMA_STEPS
    assert manifest["recipe"].get("value_steps", 0) == DEFAULT_VALUE_STEPS
    assert {entry["file"] for entry in manifest["files"]} >= {"config.json", "model.safetensors", "tokenizer.json"}
    documented = re.findall(r"sha256:[0-9a-f]{64}", (REPO / "docs" / "tiny-model.md").read_text())
    assert manifest["model_sha256"] in documented, "docs/tiny-model.md names another demo model"
    assert 0.10 <= manifest["recipe"]["held_out_accuracy"]["accuracy"] <= 0.90


def test_install_copies_and_verifies_and_refuses_an_occupied_directory(tmp_path):
    summary = tiny_release.install(tmp_path / "m")
    assert summary["model_sha256"] == tiny_release.read_manifest()["model_sha256"]
    assert summary["source"] == "release"
    assert tiny_release.verify(tmp_path / "m")["model_sha256"] == summary["model_sha256"]
    with pytest.raises(FileExistsError):
        tiny_release.install(tmp_path / "m")
    tiny_release.install(tmp_path / "m", replace=True)  # --force
    assert [p.name for p in tmp_path.iterdir()] == ["m"], "no staging or retired folder is left behind"


@pytest.mark.parametrize("damage", ["flip", "truncate", "extra", "missing"])
def test_a_damaged_release_is_refused_and_nothing_is_published(tmp_path, damage):
    source = tmp_path / "release"
    shutil.copytree(tiny_release.RELEASE_DIR, source)
    weights = source / "model.safetensors"
    if damage == "flip":
        data = bytearray(weights.read_bytes())
        data[len(data) // 2] ^= 1
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(weights.read_bytes()[:-1])
    elif damage == "extra":
        (source / "surprise.bin").write_bytes(b"x")
    else:
        (source / "tokenizer.json").unlink()
    with pytest.raises(tiny_release.TinyReleaseError) as caught:
        tiny_release.install(tmp_path / "out", source=source)
    assert caught.value.code == "tiny_model_corrupt"
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["release"]


def test_cli_prints_the_documented_digest_and_refuses_an_existing_model(tmp_path):
    cmd = [sys.executable, "-m", "kiln_project.cli.main", "model", "create-tiny", str(tmp_path / "m")]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    digest = tiny_release.read_manifest()["model_sha256"]
    assert f"model digest {digest}" in done.stdout
    printed = json.loads(done.stdout[: done.stdout.rindex("}") + 1])
    assert printed["model_sha256"] == digest and printed["source"] == "release"
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert again.returncode != 0 and "model_exists" in again.stderr and again.stderr.count("\n") == 1


@pytest.mark.parametrize("flag", ["--seed", "--warm-steps", "--schema-steps", "--value-steps"])
def test_cli_refuses_a_negative_recipe_number_with_one_line(tmp_path, flag):
    cmd = [sys.executable, "-m", "kiln_project.cli.main", "model", "create-tiny", str(tmp_path / "m"), flag, "-1"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=120)
    code = {"--seed": "invalid_seed", "--warm-steps": "invalid_warm_steps", "--schema-steps": "invalid_schema_steps",
            "--value-steps": "invalid_value_steps"}
    assert done.returncode != 0 and code[flag] in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "m").exists()


def test_cli_rebuild_runs_the_three_phases_of_the_recipe(tmp_path):
    cmd = [sys.executable, "-m", "kiln_project.cli.main", "model", "create-tiny", str(tmp_path / "m"),
           "--warm-steps", "2", "--schema-steps", "1", "--value-steps", "1"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout[: done.stdout.rindex("}") + 1])
    assert printed["source"] == "recipe" and printed["matches_release"] is False
    assert (printed["warm_steps"], printed["schema_steps"]) == (2, 1) and printed["schema_final_loss"] > 0
    assert printed["held_out_schema_validity"]["schemas"] == 64
    assert printed["value_steps"] == 1 and printed["held_out_value_validity"]["schemas"] == 64
    no_second = subprocess.run(cmd[:5] + [str(tmp_path / "n"), "--schema-steps", "0", "--value-steps", "1"],
                               capture_output=True, text=True, cwd=REPO, timeout=300)
    assert no_second.returncode != 0 and "invalid_value_steps" in no_second.stderr and "continues from the second" \
        in no_second.stderr
    assert not (tmp_path / "n").exists()


def test_cli_runs_only_the_second_phase_from_a_built_first_phase(tmp_path):
    from gpu_runtime.identity import file_manifest, manifest_digest
    from gpu_runtime.tiny_model import create_tiny_model

    first = tmp_path / "first"
    create_tiny_model(first, warm_steps=2, schema_steps=0)
    base = [sys.executable, "-m", "kiln_project.cli.main", "model", "create-tiny"]
    done = subprocess.run(base + [str(tmp_path / "second"), "--first-phase", str(first), "--schema-steps", "1"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    recipe = json.loads((tmp_path / "second" / tiny_release.RECIPE_FILE).read_text())
    first_recipe = json.loads((first / tiny_release.RECIPE_FILE).read_text())
    assert recipe["first_phase_model_sha256"] == manifest_digest(file_manifest(first, ["model.safetensors"]))
    assert (recipe["warm_steps"], recipe["final_loss"], recipe["schema_steps"]) == (2, first_recipe["final_loss"], 1)
    assert recipe["held_out_schema_validity"]["schemas"] == 64
    assert (tmp_path / "second" / "model.safetensors").read_bytes() != (first / "model.safetensors").read_bytes()

    again = subprocess.run(base + [str(tmp_path / "third"), "--first-phase", str(tmp_path / "second"),
                                   "--schema-steps", "1"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert again.returncode != 0 and "invalid_first_phase" in again.stderr and "already ran" in again.stderr
    assert not (tmp_path / "third").exists()
    no_steps = subprocess.run(base + [str(tmp_path / "fourth"), "--first-phase", str(first)],
                              capture_output=True, text=True, cwd=REPO, timeout=300)
    assert no_steps.returncode != 0 and "invalid_schema_steps" in no_steps.stderr


def test_cli_runs_only_the_third_phase_from_a_model_that_ran_the_second(tmp_path):
    from gpu_runtime.identity import file_manifest, manifest_digest
    from gpu_runtime.tiny_model import create_tiny_model

    second, first = tmp_path / "second", tmp_path / "first"
    create_tiny_model(second, warm_steps=2, schema_steps=1, value_steps=0)
    create_tiny_model(first, warm_steps=2, schema_steps=0)
    base = [sys.executable, "-m", "kiln_project.cli.main", "model", "create-tiny"]
    done = subprocess.run(base + [str(tmp_path / "third"), "--second-phase", str(second), "--value-steps", "1"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr
    recipe = json.loads((tmp_path / "third" / tiny_release.RECIPE_FILE).read_text())
    second_recipe = json.loads((second / tiny_release.RECIPE_FILE).read_text())
    assert recipe["second_phase_model_sha256"] == manifest_digest(file_manifest(second, ["model.safetensors"]))
    assert (recipe["schema_steps"], recipe["schema_final_loss"]) == (1, second_recipe["schema_final_loss"])
    assert recipe["second_phase_schema_validity"] == second_recipe["held_out_schema_validity"]
    assert recipe["value_steps"] == 1 and recipe["held_out_value_validity"]["schemas"] == 64
    assert (tmp_path / "third" / "model.safetensors").read_bytes() != (second / "model.safetensors").read_bytes()

    refusals = {
        "no second phase": ([str(tmp_path / "a"), "--second-phase", str(first), "--value-steps", "1"],
                            "invalid_second_phase", "has not run the second phase"),
        "twice": ([str(tmp_path / "b"), "--second-phase", str(tmp_path / "third"), "--value-steps", "1"],
                  "invalid_second_phase", "already ran a third phase"),
        "no steps": ([str(tmp_path / "c"), "--second-phase", str(second)], "invalid_value_steps", "--value-steps"),
        "other phase's steps": ([str(tmp_path / "d"), "--second-phase", str(second), "--value-steps", "1",
                                 "--schema-steps", "1"], "invalid_second_phase", "drop --schema-steps"),
    }
    for args, code, words in refusals.values():
        refused = subprocess.run(base + args, capture_output=True, text=True, cwd=REPO, timeout=300)
        assert refused.returncode != 0 and code in refused.stderr and words in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1
        assert not Path(args[0]).exists()


def test_cli_sharpens_a_model_that_ran_the_third_phase_and_only_its_logits_change(tmp_path):
    """`--third-phase` runs only the recipe's last step: every logit times LOGIT_SCALE, nothing else moved."""
    import torch
    from transformers import Qwen3ForCausalLM

    from gpu_runtime.identity import file_manifest, manifest_digest
    from gpu_runtime.tiny_model import LOGIT_SCALE, create_tiny_model

    third, second = tmp_path / "third", tmp_path / "second"
    create_tiny_model(second, warm_steps=2, schema_steps=1, value_steps=0)
    base = [sys.executable, "-m", "kiln_project.cli.main", "model", "create-tiny"]
    made = subprocess.run(base + [str(third), "--second-phase", str(second), "--value-steps", "1"],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert made.returncode == 0, made.stderr
    sharp = tmp_path / "sharp"
    done = subprocess.run(base + [str(sharp), "--third-phase", str(third)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr

    recipe = json.loads((sharp / tiny_release.RECIPE_FILE).read_text())
    third_recipe = json.loads((third / tiny_release.RECIPE_FILE).read_text())
    assert recipe["logit_scale"] == LOGIT_SCALE and "logit_scale" not in third_recipe
    assert recipe["third_phase_model_sha256"] == manifest_digest(file_manifest(third, ["model.safetensors"]))
    assert recipe["third_phase_held_out_accuracy"] == third_recipe["held_out_accuracy"]
    assert recipe["value_steps"] == 1 and recipe["held_out_value_validity"]["schemas"] == 64
    for name in ("tokenizer.json", "chat_template.jinja", "config.json"):
        assert (sharp / name).read_bytes() == (third / name).read_bytes(), name

    before = Qwen3ForCausalLM.from_pretrained(third, dtype=torch.float32).eval()
    after = Qwen3ForCausalLM.from_pretrained(sharp, dtype=torch.float32).eval()
    changed = [name for name, tensor in after.state_dict().items() if not torch.equal(tensor, before.state_dict()[name])]
    assert changed == ["model.norm.weight"]
    ids = torch.tensor([[5, 17, 99, 3, 250]])
    with torch.no_grad():
        torch.testing.assert_close(after(ids).logits, before(ids).logits * LOGIT_SCALE, rtol=1e-5, atol=1e-5)

    refusals = {
        "no third phase": ([str(tmp_path / "a"), "--third-phase", str(second)], "has not run the third phase"),
        "twice": ([str(tmp_path / "b"), "--third-phase", str(sharp)], "sharpened already"),
        "steps": ([str(tmp_path / "c"), "--third-phase", str(third), "--value-steps", "1"], "trains nothing"),
    }
    for args, words in refusals.values():
        refused = subprocess.run(base + args, capture_output=True, text=True, cwd=REPO, timeout=300)
        assert refused.returncode != 0 and "invalid_third_phase" in refused.stderr and words in refused.stderr, \
            refused.stderr
        assert refused.stderr.count("\n") == 1
        assert not Path(args[0]).exists()
