"""The effective configuration: defaults, kiln.toml, KILN_* variables and their errors."""

from pathlib import Path

import pytest

from kiln_project.config import ConfigError, load_config


def test_defaults(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config({"KILN_HOME": str(tmp_path / "home")})
    assert config.home == (tmp_path / "home").resolve()
    assert (config.serving_profile, config.host, config.port) == ("stable", "127.0.0.1", 8420)
    assert config.effective_database_url == f"sqlite:///{tmp_path / 'home' / 'kiln.sqlite3'}"
    assert config.effective_redis_url == f"unix://{tmp_path / 'home' / 'redis' / 'redis.sock'}"
    assert config.model_path is None
    assert config.allow_anonymous_api is False


def test_toml_then_environment_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kiln.toml").write_text(
        '[model]\npath = "/models/qwen"\n[server]\nserving_profile = "maintenance"\nport = 9000\nhost = "0.0.0.0"\n'
    )
    config = load_config({"KILN_HOME": str(tmp_path)})
    assert config.model_path == Path("/models/qwen")
    assert (config.serving_profile, config.port, config.host) == ("maintenance", 9000, "0.0.0.0")
    assert config.config_file == tmp_path / "kiln.toml"
    config = load_config({"KILN_HOME": str(tmp_path), "KILN_SERVER_SERVING_PROFILE": "experimental",
                          "KILN_MODEL_PATH": "/elsewhere", "KILN_PORT": "9100"})
    assert (config.serving_profile, config.model_path, config.port) == ("experimental", Path("/elsewhere"), 9100)


def test_tiny_model_in_home_is_the_embedded_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    assert load_config({"KILN_HOME": str(tmp_path)}).model_path == tmp_path / "models" / "tiny"


def test_plain_kiln_serve_finds_the_demos_settings_in_home_while_the_demo_model_serves(tmp_path, monkeypatch):
    """QA: after a first ./scripts/serve, the guide's plain `kiln serve` read no kiln.toml, so the demo's
    anonymous loopback access (every guide curl got 401) and training defaults were gone. `kiln serve`
    (not load_config: no other process reads it) takes KILN_HOME/kiln.toml by scripts/serve's rule, and
    only a file this user owns that nobody else may write."""
    import os

    from kiln_project.config import demo_settings_file

    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    monkeypatch.chdir(work)
    demo = home / "kiln.toml"
    demo.write_text("[server]\nallow_anonymous_api = true\n")
    demo.chmod(0o600)
    assert demo_settings_file({"KILN_HOME": str(home)}) == demo
    assert load_config({"KILN_HOME": str(home)}).config_file is None  # every other process: explicit files only
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "kiln_tiny_release.json").write_text("{}")
    assert demo_settings_file({"KILN_HOME": str(home), "KILN_MODEL_PATH": str(tiny)}) == demo
    assert demo_settings_file({"KILN_HOME": str(home), "KILN_MODEL_PATH": str(tmp_path / "my-model")}) is None
    assert demo_settings_file({"KILN_HOME": str(home), "KILN_CONFIG": "/etc/kiln.toml"}) is None
    demo.chmod(0o620)  # others may write it: refused
    assert demo_settings_file({"KILN_HOME": str(home)}) is None
    demo.chmod(0o600)
    (home / "elsewhere.toml").write_text("")
    demo.unlink()
    os.symlink(home / "elsewhere.toml", demo)  # a link is not the file serve wrote
    assert demo_settings_file({"KILN_HOME": str(home)}) is None
    demo.unlink()
    demo.write_text("")
    (work / "kiln.toml").write_text("[server]\nport = 9000\n")  # settings of yours win outright
    assert demo_settings_file({"KILN_HOME": str(home)}) is None


def test_anonymous_access_is_refused_beside_production(tmp_path, monkeypatch):
    """Behind the reverse proxy production expects, every request comes from 127.0.0.1: anonymous loopback
    access would open the API to everyone the proxy serves."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="allow_anonymous_api cannot be on with production"):
        load_config({"KILN_HOME": str(tmp_path), "KILN_ALLOW_ANONYMOUS_API": "true", "KILN_PRODUCTION": "true",
                     "KILN_SECRET_KEY": "x" * 50})


@pytest.mark.parametrize(
    "env, message",
    [
        ({"KILN_SERVER_SERVING_PROFILE": "turbo"}, "serving profile must be one of"),
        ({"KILN_PORT": "eighty"}, "KILN_PORT must be an integer from 1 to 65535, not 'eighty'"),
        ({"KILN_ALLOW_ANONYMOUS_API": "maybe"}, "must be true or false"),
        ({"KILN_MAX_QUEUED_JOBS": "0"}, "at least 1"),
        ({"KILN_SAMPLER_MAX_BATCH_SIZE": "0"}, "KILN_SAMPLER_MAX_BATCH_SIZE must be an integer of at least 1, not 0"),
        ({"KILN_CONFIG": "/nonexistent/kiln.toml"}, "not a file"),
    ],
)
def test_bad_values_are_refused_with_a_clear_message(tmp_path, monkeypatch, env, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        load_config({"KILN_HOME": str(tmp_path), **env})


def test_broken_toml_names_the_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kiln.toml").write_text("[model\npath=")
    with pytest.raises(ConfigError, match="kiln.toml"):
        load_config({"KILN_HOME": str(tmp_path)})


def test_public_dict_hides_secrets_and_credentials(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load_config({"KILN_HOME": str(tmp_path), "KILN_SECRET_KEY": "s3cret",
                          "DATABASE_URL": "postgres://kiln:pw@db.local/kiln"})
    public = config.public_dict()
    assert "secret_key" not in public
    assert public["database_url"] == "postgres://***@db.local/kiln"
    assert "pw" not in str(public)


def test_openenv_credentials_are_handles_to_an_origin_and_a_variable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kiln.toml").write_text('[openenv.credentials.team]\norigin = "https://env.example:8443"\n'
                                        'bearer_token_env = "TEAM_ENV_TOKEN"\n'
                                        '[openenv.credentials.local]\norigin = "http://127.0.0.1:8990"\n'
                                        'bearer_token_env = "LOCAL_TOKEN"\n')
    config = load_config({"KILN_HOME": str(tmp_path), "TEAM_ENV_TOKEN": "never-read-here"})
    assert config.openenv_credentials == {
        "team": {"origin": "https://env.example:8443", "bearer_token_env": "TEAM_ENV_TOKEN"},
        "local": {"origin": "http://127.0.0.1:8990", "bearer_token_env": "LOCAL_TOKEN"}}
    assert "never-read-here" not in str(config.public_dict())
    replaced = load_config({"KILN_HOME": str(tmp_path), "KILN_OPENENV_CREDENTIALS":
                            '{"ci": {"origin": "http://localhost:9000", "bearer_token_env": "CI_TOKEN"}}'})
    assert list(replaced.openenv_credentials) == ["ci"]


@pytest.mark.parametrize("table, message", [
    ({"-": {"origin": "http://127.0.0.1:1", "bearer_token_env": "T"}}, "credential handle"),
    ({"a": {"origin": "http://127.0.0.1:1"}}, "exactly origin and bearer_token_env"),
    ({"a": {"origin": "http://env.example", "bearer_token_env": "T"}}, "only be sent over HTTPS"),
    ({"a": {"origin": "https://env.example/path", "bearer_token_env": "T"}}, "exact origin"),
    ({"a": {"origin": "https://env.example", "bearer_token_env": "1BAD"}}, "variable name"),
])
def test_a_bad_openenv_credential_is_refused_by_name(tmp_path, monkeypatch, table, message):
    import json

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=message):
        load_config({"KILN_HOME": str(tmp_path), "KILN_OPENENV_CREDENTIALS": json.dumps(table)})


def test_sampler_cohort_size_from_toml_then_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config({"KILN_HOME": str(tmp_path)}).sampler_max_batch_size == 32
    (tmp_path / "kiln.toml").write_text("[sampler]\nmax_batch_size = 256\n")
    assert load_config({"KILN_HOME": str(tmp_path)}).sampler_max_batch_size == 256
    config = load_config({"KILN_HOME": str(tmp_path), "KILN_SAMPLER_MAX_BATCH_SIZE": "64"})
    assert config.sampler_max_batch_size == 64 and config.public_dict()["sampler_max_batch_size"] == 64


def test_the_training_memory_budget_from_toml_then_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_config({"KILN_HOME": str(tmp_path)}).training_memory_budget_mib == 0  # none: the GPU's
    (tmp_path / "kiln.toml").write_text("[training]\nmemory_budget_mib = 24000\n")
    assert load_config({"KILN_HOME": str(tmp_path)}).training_memory_budget_mib == 24000
    config = load_config({"KILN_HOME": str(tmp_path), "KILN_TRAINING_MEMORY_BUDGET_MIB": "8000"})
    assert config.training_memory_budget_mib == 8000 and config.public_dict()["training_memory_budget_mib"] == 8000
    with pytest.raises(ConfigError, match="KILN_TRAINING_MEMORY_BUDGET_MIB"):
        load_config({"KILN_HOME": str(tmp_path), "KILN_TRAINING_MEMORY_BUDGET_MIB": "-1"})
    (tmp_path / "kiln.toml").write_text('[training]\nmemory_budget_mib = "lots"\n')
    with pytest.raises(ConfigError, match="memory_budget_mib"):
        load_config({"KILN_HOME": str(tmp_path)})
