"""`./kiln` at the repository root runs the guides' commands as they are written (`./kiln serve`,
`./kiln openenv inspect ...`) from the folder the user is in."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _launch(*args: str, cwd: Path, home: Path, **settings: str) -> subprocess.CompletedProcess:
    # A user's shell: none of the test run's settings (its KILN_* and Django settings module).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KILN_", "DJANGO_"))}
    env["KILN_HOME"] = str(home)
    env.update(settings)
    return subprocess.run([str(REPO / "kiln"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_command_runs_the_installed_cli_from_any_folder(tmp_path):
    done = _launch("openenv", "inspect", "--help", cwd=tmp_path, home=tmp_path / "home")
    assert done.returncode == 0, done.stderr
    assert "--environment URL" in done.stdout
    refused = _launch("openenv", "inspect", "--no-such-flag", cwd=tmp_path, home=tmp_path / "home")
    assert refused.returncode != 0 and "--no-such-flag" in refused.stderr


def test_serve_sets_kiln_up_first_then_runs_kiln_serve(tmp_path):
    """`./kiln serve` is ./scripts/serve: a fresh KILN_HOME gets the demo model, the demo's settings,
    a migrated database, the first user and the CLI's token before `kiln serve` runs (here `--help`,
    so the test does not keep a server)."""
    home = tmp_path / "home"
    done = _launch("serve", "--help", cwd=tmp_path, home=home)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "usage: kiln serve" in done.stdout
    assert (home / "models" / "tiny" / "config.json").is_file()
    assert "[training.defaults]" in (home / "kiln.toml").read_text()
    assert (home / "cli-token").read_text().startswith("kiln_")
    assert "log in at http://127.0.0.1:" in done.stdout


def test_serve_keeps_the_guides_curl_steps_working_when_a_model_path_is_given(tmp_path):
    """`KILN_MODEL_PATH=... ./kiln serve` (the OpenEnv guide's first step) on a fresh home: a tiny model's
    folder gets the demo's settings (anonymous loopback access for the curl steps); a model of your own gets
    neither (often served on a shared host or behind a proxy), but serve says how to send the token."""
    demo_home, own_home = tmp_path / "demo", tmp_path / "own"
    first = _launch("serve", "--help", cwd=tmp_path, home=demo_home)
    assert first.returncode == 0, first.stdout + first.stderr
    tiny = demo_home / "models" / "tiny"
    again = _launch("serve", "--help", cwd=tmp_path, home=tmp_path / "demo2", KILN_MODEL_PATH=str(tiny))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "allow_anonymous_api = true" in (tmp_path / "demo2" / "kiln.toml").read_text()
    own_model = tmp_path / "my-model"
    own_model.mkdir()
    (own_model / "config.json").write_text("{}")
    own = _launch("serve", "--help", cwd=tmp_path, home=own_home, KILN_MODEL_PATH=str(own_model))
    assert own.returncode == 0, own.stdout + own.stderr
    # no demo settings for your model: the API keeps asking for a token (kiln serve then says how to send
    # it: tests/integration/test_kiln_serve.py)
    from kiln_project.config import demo_settings_file, load_config

    assert not (own_home / "kiln.toml").exists()
    own_env = {"KILN_HOME": str(own_home), "KILN_MODEL_PATH": str(own_model)}
    assert demo_settings_file(own_env) is None and load_config(own_env).allow_anonymous_api is False


def test_serve_refuses_a_bad_setting_in_one_line_before_migrating(tmp_path):
    """QA: a misspelt KILN_SERVER_SERVING_PROFILE crashed inside `manage.py migrate` with a 33-line
    traceback; kiln serve itself answers one invalid_config line."""
    home = tmp_path / "home"
    done = _launch("serve", "--help", cwd=tmp_path, home=home, KILN_SERVER_SERVING_PROFILE="maintainance")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "error: invalid_config: serving profile must be one of stable, maintenance, experimental" in done.stderr
    assert not (home / "kiln.sqlite3").exists()  # nothing migrated
