"""Dependency rules: the layers, the web process never imports torch or gpu_runtime, gpu_runtime imports no Django."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]




def test_asgi_app_loads_without_torch():
    code = (
        "import os, sys; os.environ['DJANGO_SETTINGS_MODULE']='kiln_project.settings';"
        "import kiln_project.asgi, kiln_project.urls;"
        "from django.test import Client; Client().get('/v1/openapi.json');"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch','transformers','peft','gpu_runtime'));"
        "print(heavy); sys.exit(1 if heavy else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_import_linter_contracts_hold():
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 4 kept, 0 broken." in result.stdout
    assert "Layers: wiring, the apps top down, gpu_runtime, core KEPT" in result.stdout


def test_no_import_linter_exceptions():
    """Every rule holds without ignore_imports: an exception would be a way around a layer."""
    assert "ignore_imports" not in (REPO / "pyproject.toml").read_text()


def test_the_generic_job_pages_name_no_job_kind():
    """Job kinds own their sections (JobKind.detail_section); the generic page and fragments know none."""
    generic = [REPO / "core" / "jobs" / "fragments.py", REPO / "templates" / "ui" / "jobs" / "detail.html",
               REPO / "templates" / "ui" / "jobs" / "table.html"]
    for path in generic:
        code = "\n".join(line for line in path.read_text().splitlines()
                         if not line.lstrip().startswith(("#", '"""')))
        for name in ("training.grpo", "rollouts.generate", "training_fragments", "rollout_selectors",
                     "{% if training", "{% if rollouts"):
            assert name not in code, f"{path.name} names {name!r}"
