"""examples/openenv-counter/serve_env.sh serves the counter as the OpenEnv guide's terminal 2 does.

It reuses the tests' cached `openenv==0.10.0` environment (OPENENV_VENV), as a user's second run
reuses the one the first created, and is started from the repository root, where Kiln's own
`openenv` package would shadow the environment's if the script did not run from its own folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.openenv.real_server import free_port, openenv_python, venv_dir, wait_until_healthy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "openenv-counter" / "serve_env.sh"


def test_serve_env_serves_the_counter_from_the_repository_root(tmp_path):
    openenv_python()  # the cached environment (created once, or the test skips without a package index)
    port = free_port()
    log = tmp_path / "serve.log"
    env = {**os.environ, "OPENENV_VENV": str(venv_dir()), "PORT": str(port), "COUNTER_MAX_DELTA": "5",
           "PYTHONPATH": str(REPO)}  # even with Kiln on the path, the environment's package is the one imported
    with open(log, "wb") as out:
        process = subprocess.Popen(["bash", str(SCRIPT)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, process, log.read_text)
        metadata = httpx.get(url + "/metadata", timeout=5, trust_env=False).json()
        assert metadata["name"] == "kiln_counter"
        action = httpx.get(url + "/schema", timeout=5, trust_env=False).json()["action"]
        assert action["required"] == ["delta"]
        assert (action["properties"]["delta"]["minimum"], action["properties"]["delta"]["maximum"]) == (-5, 5)
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(15)
    assert "creating" not in log.read_text()  # the cached environment was reused, not rebuilt


def test_run_loop_defaults_reach_the_commands_it_runs(tmp_path):
    """QA: the script read ${GROUPS:-64}, but bash sets GROUPS to the user's group ids, so the default
    never applied (--groups 0 as root, 1000 for a user). KILN=echo prints the commands instead."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("TRAIN_GROUPS", "EVAL_GROUPS", "ADAPTER", "ENV_URL", "POST_EVAL_SUITE")}
    done = subprocess.run(["bash", str(SCRIPT.with_name("run_loop.sh"))], env={**environment, "KILN": "echo",
                          "OUT": str(tmp_path)}, capture_output=True, text=True, timeout=30, check=True)
    train = next(line for line in done.stdout.splitlines() if line.startswith("openenv train "))
    assert " --groups 64 " in train and " --eval-groups 80 " in train and " --output-adapter counter-agent " in train
    custom = subprocess.run(["bash", str(SCRIPT.with_name("run_loop.sh"))], env={**environment, "KILN": "echo",
                            "OUT": str(tmp_path), "TRAIN_GROUPS": "12"}, capture_output=True, text=True, timeout=30,
                            check=True)
    assert " --groups 12 " in custom.stdout
