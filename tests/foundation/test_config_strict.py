"""kiln.toml is read strictly: real TOML booleans and integers only, every key known, numbers in
range, relative paths against the file's folder; each refusal is a ConfigError naming the key or
variable (the CLI prints it as one `invalid_config` line)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kiln_project.config import KERNEL_MODES, ConfigError, load_config


def _load(tmp_path: Path, toml: str, **env):
    (tmp_path / "kiln.toml").write_text(toml)
    return load_config({"KILN_HOME": str(tmp_path / "home"), "KILN_CONFIG": str(tmp_path / "kiln.toml"), **env})


def _refused(tmp_path: Path, toml: str, **env) -> str:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, toml, **env)
    assert caught.value.code == "invalid_config"
    return caught.value.message


# ---- 1. booleans -------------------------------------------------------------------------------------

@pytest.mark.parametrize("section, key, text, shown", [
    ("server", "allow_anonymous_api", '"false"', "'false' (a string)"),
    ("server", "production", '"false"', "'false' (a string)"),
    ("openenv", "allow_remote_environments", '"no"', "'no' (a string)"),
    ("openenv", "enabled", '"false"', "'false' (a string)"),
    ("server", "allow_anonymous_api", "0", "0 (an integer)"),
    ("promotion", "allow_self_approval", '"true"', "'true' (a string)"),
])
def test_a_quoted_or_numeric_boolean_is_refused_by_name(tmp_path, section, key, text, shown):
    message = _refused(tmp_path, f"[{section}]\n{key} = {text}\n")
    assert message == f"[{section}] {key} must be true or false, not {shown}"


def test_real_booleans_and_the_variables_words_still_work(tmp_path):
    config = _load(tmp_path, "[server]\nallow_anonymous_api = false\nproduction = false\n"
                             "[openenv]\nenabled = false\nallow_remote_environments = true\n")
    assert (config.allow_anonymous_api, config.production) == (False, False)
    assert (config.openenv_enabled, config.openenv_allow_remote_environments) == (False, True)
    config = _load(tmp_path, "[server]\nallow_anonymous_api = false\n", KILN_ALLOW_ANONYMOUS_API="yes",
                   KILN_OPENENV_ENABLED="off")
    assert (config.allow_anonymous_api, config.openenv_enabled) == (True, False)


# ---- 2. numbers ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("toml, message", [
    ("[jobs]\nmax_queued_jobs = 0\n", "[jobs] max_queued_jobs must be an integer of at least 1, not 0"),
    ("[jobs]\nmax_queued_jobs = true\n",
     "[jobs] max_queued_jobs must be an integer of at least 1, not True (a boolean)"),
    ("[server]\nport = 0\n", "[server] port must be an integer from 1 to 65535, not 0"),
    ("[server]\nport = 65536\n", "[server] port must be an integer from 1 to 65535, not 65536"),
    ("[server]\nport = 8533.7\n", "[server] port must be an integer from 1 to 65535, not 8533.7 (a number)"),
    ('[server]\nport = "8533"\n', "[server] port must be an integer from 1 to 65535, not '8533' (a string)"),
    ("[openenv]\nmax_active_runs = 0\n", "[openenv] max_active_runs must be an integer of at least 1, not 0"),
    ("[server]\nmax_request_bytes = 0\n", "[server] max_request_bytes must be an integer of at least 1024, not 0"),
    ("[sampler]\nmax_batch_size = true\n",
     "[sampler] max_batch_size must be an integer of at least 1, not True (a boolean)"),
    ("[server]\nhost = 123\n", "[server] host must be a non-empty string, not 123 (an integer)"),
])
def test_zero_or_mistyped_numbers_are_refused_not_replaced(tmp_path, toml, message):
    assert _refused(tmp_path, toml) == message


@pytest.mark.parametrize("value", ["99999", "0", "-1", "8533.7"])
def test_kiln_port_out_of_range_is_refused_by_name(tmp_path, monkeypatch, value):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=re.escape("KILN_PORT must be an integer from 1 to 65535, not")):
        load_config({"KILN_HOME": str(tmp_path), "KILN_PORT": value})


def test_numbers_in_range_are_kept(tmp_path):
    config = _load(tmp_path, "[server]\nport = 65535\nmax_request_bytes = 1024\n[jobs]\nmax_queued_jobs = 1\n"
                             "[openenv]\nmax_active_runs = 1\n")
    assert (config.port, config.max_request_bytes, config.max_queued_jobs, config.openenv_max_active_runs) == (
        65535, 1024, 1, 1)


def test_the_openenv_reply_timeout_is_an_operators_setting(tmp_path):
    """QA: an environment whose reset takes over a minute could not be used (60 s, fixed)."""
    from openenv.runs.request import collection_config

    assert _load(tmp_path, "").openenv_reply_timeout_secs == 60
    assert _load(tmp_path, "[openenv]\nreply_timeout_secs = 300\n").openenv_reply_timeout_secs == 300
    assert _load(tmp_path, "[openenv]\nreply_timeout_secs = 300\n",
                 KILN_OPENENV_REPLY_TIMEOUT_SECS="900").openenv_reply_timeout_secs == 900
    assert _refused(tmp_path, "[openenv]\nreply_timeout_secs = 0\n") == \
        "[openenv] reply_timeout_secs must be an integer of at least 1, not 0"
    request = {"environment_urls": ["http://127.0.0.1:9"], "adapter": None, "groups": 1, "group_size": 2,
               "seed_start": 0, "max_steps": 2, "concurrency": 1, "max_action_tokens": 32, "temperature": 1.0,
               "thinking": False, "thinking_budget_tokens": None, "protocol_error_reward": -1.0,
               "max_recoverable_errors": 3, "capacity_wait_seconds": 5.0, "reset_options": None,
               "environment_reset_options": None}
    assert collection_config(request, tmp_path, reply_timeout_s=300).request_timeout_s == 300.0


# ---- 3. names: the spec's [training] keys, unknown keys, tables -------------------------------------------

def test_the_specs_training_max_queued_jobs_and_its_jobs_alias(tmp_path):
    assert _load(tmp_path, "[training]\nmax_queued_jobs = 5\n").max_queued_jobs == 5
    assert _load(tmp_path, "[jobs]\nmax_queued_jobs = 6\n").max_queued_jobs == 6
    assert _load(tmp_path, "[training]\nmax_queued_jobs = 7\n[jobs]\nmax_queued_jobs = 7\n").max_queued_jobs == 7
    assert _load(tmp_path, "[training]\nmax_queued_jobs = 7\n", KILN_MAX_QUEUED_JOBS="9").max_queued_jobs == 9
    message = _refused(tmp_path, "[training]\nmax_queued_jobs = 7\n[jobs]\nmax_queued_jobs = 8\n")
    assert "[training] max_queued_jobs (7)" in message and "[jobs] max_queued_jobs (8)" in message


def test_the_specs_training_checkpoint_interval_is_the_servers_default(tmp_path):
    from training.config_defaults import apply_training_defaults

    config = _load(tmp_path, "[training]\ncheckpoint_interval = 25\n")
    assert config.training_defaults == {"checkpoint_interval": 25}
    merged, sources = apply_training_defaults({"output_name": "x-r001"}, config.training_defaults)
    assert merged["checkpoint_interval"] == 25 and sources["checkpoint_interval"] == "server_defaults"
    merged, sources = apply_training_defaults({"checkpoint_interval": 3}, config.training_defaults)
    assert merged["checkpoint_interval"] == 3 and sources["checkpoint_interval"] == "request"
    same = _load(tmp_path, "[training]\ncheckpoint_interval = 25\n[training.defaults]\ncheckpoint_interval = 25\n")
    assert same.training_defaults == {"checkpoint_interval": 25}
    assert "disagree" in _refused(tmp_path, "[training]\ncheckpoint_interval = 25\n"
                                            "[training.defaults]\ncheckpoint_interval = 5\n")
    assert _refused(tmp_path, "[training]\ncheckpoint_interval = 0\n") == (
        "[training] checkpoint_interval must be an integer of at least 1, not 0 (an integer)")


def test_an_unknown_key_is_refused_with_the_known_keys_of_its_table(tmp_path):
    message = _refused(tmp_path, '[server]\nserving_profle = "maintenance"\n')
    assert message.startswith("[server] serving_profle is not a Kiln setting; [server] knows ")
    assert "serving_profile" in message and "port" in message
    assert "[sampler] batch_size is not a Kiln setting" in _refused(tmp_path, "[sampler]\nbatch_size = 4\n")
    assert "unknown kiln.toml key or table 'severs'" in _refused(tmp_path, "[severs]\nport = 1\n")


def test_a_section_that_is_not_a_table_is_a_config_error(tmp_path):
    assert _refused(tmp_path, 'server = "x"\n') == "[server] must be a table (a [server] section), not 'x' (a string)"
    assert "[training] dataset_roots must be a list" in _refused(tmp_path, "[training]\ndataset_roots = 3\n")
    assert "[server] allowed_hosts must be a list" in _refused(tmp_path, "[server]\nallowed_hosts = 3\n")


def test_the_hint_names_the_file(tmp_path):
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, "[server]\nport = 0\n")
    assert str(tmp_path / "kiln.toml") in caught.value.hint


# ---- 5. KILN_KERNELS ---------------------------------------------------------------------------------------

def test_kiln_kernels_is_checked_at_startup(tmp_path, monkeypatch):
    from gpu_runtime.kernels.selection import MODES

    assert KERNEL_MODES == MODES
    monkeypatch.chdir(tmp_path)
    assert load_config({"KILN_HOME": str(tmp_path)}).kernels == "auto"
    assert load_config({"KILN_HOME": str(tmp_path), "KILN_KERNELS": "Torch"}).kernels == "torch"
    with pytest.raises(ConfigError, match=re.escape("KILN_KERNELS must be one of auto, torch, triton, not 'bogus'")):
        load_config({"KILN_HOME": str(tmp_path), "KILN_KERNELS": "bogus"})


# ---- 7. relative paths -----------------------------------------------------------------------------------

def test_relative_paths_in_kiln_toml_are_relative_to_its_folder(tmp_path, monkeypatch):
    folder, elsewhere = tmp_path / "conf", tmp_path / "cwd"
    (folder / "data").mkdir(parents=True)
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    (folder / "kiln.toml").write_text('home = "state"\n[model]\npath = "models/m"\n'
                                      '[training]\ndataset_roots = ["data"]\n')
    config = load_config({"KILN_CONFIG": str(folder / "kiln.toml"), "KILN_LAUNCH_DIR": str(elsewhere)})
    assert config.home == folder / "state"
    assert config.model_path == folder / "models" / "m"
    assert folder / "data" in config.extra_dataset_roots
    # environment variables: relative to the working folder
    config = load_config({"KILN_CONFIG": str(folder / "kiln.toml"), "KILN_HOME": "h", "KILN_MODEL_PATH": "m",
                          "KILN_LAUNCH_DIR": str(elsewhere)})
    assert (config.home, config.model_path) == (elsewhere / "h", elsewhere / "m")


def test_a_dataset_root_that_does_not_exist_is_refused_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    message = _refused(tmp_path, '[training]\ndataset_roots = ["missing"]\n')
    assert message == f"[training] dataset_roots names {tmp_path / 'missing'}, which is not an existing folder"
    (tmp_path / "no-toml").mkdir()
    monkeypatch.chdir(tmp_path / "no-toml")
    with pytest.raises(ConfigError, match="KILN_DATASET_ROOTS names /nonexistent/kiln-roots, which is not"):
        load_config({"KILN_HOME": str(tmp_path), "KILN_DATASET_ROOTS": f"{tmp_path}:/nonexistent/kiln-roots"})
    config = load_config({"KILN_HOME": str(tmp_path), "KILN_DATASET_ROOTS": f"{tmp_path}"})
    assert config.extra_dataset_roots == (tmp_path / "no-toml", tmp_path)


@pytest.mark.parametrize("started_in", ["/", "/etc"])
def test_a_server_started_in_a_system_folder_does_not_open_it(tmp_path, started_in):
    """QA: `kiln serve` from / (systemd's default working folder) made every file a dataset root."""
    config = load_config({"KILN_HOME": str(tmp_path / "home"), "KILN_LAUNCH_DIR": started_in})
    assert Path(started_in) not in config.dataset_roots
    # a setting still adds any folder, and a folder of one's own is a root as before
    config = load_config({"KILN_HOME": str(tmp_path / "home"), "KILN_LAUNCH_DIR": started_in,
                          "KILN_DATASET_ROOTS": str(tmp_path)})
    assert tmp_path in config.dataset_roots and Path(started_in) not in config.dataset_roots
    own = load_config({"KILN_HOME": str(tmp_path / "home"), "KILN_LAUNCH_DIR": str(tmp_path)})
    assert own.extra_dataset_roots == (tmp_path,)


@pytest.mark.parametrize("toml, env, words", [
    ("[server]\nport = 0\n", {"KILN_PORT": "8537"}, "[server] port"),
    ("[server]\nport = 8533.7\n", {"KILN_PORT": "8537"}, "[server] port"),
    ('[server]\nallow_anonymous_api = "false"\n', {"KILN_ALLOW_ANONYMOUS_API": "0"}, "[server] allow_anonymous_api"),
    ("[server]\nmax_request_bytes = 0\n", {"KILN_MAX_REQUEST_BYTES": "9000000"}, "[server] max_request_bytes"),
    ("[server]\nhost = 5\n", {"KILN_HOST": "127.0.0.1"}, "[server] host"),
])
def test_a_bad_key_is_refused_even_while_a_variable_overrides_it(tmp_path, toml, env, words):
    # the file is wrong whichever value wins now; it must not wait unnoticed until the variable goes
    assert words in _refused(tmp_path, toml, **env)
