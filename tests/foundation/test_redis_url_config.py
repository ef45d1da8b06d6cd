"""KILN_REDIS_URL is checked when the configuration loads: redis-py ignores a database path it cannot read
(`/abc` would be database 0 of a shared Redis) and refuses another scheme only at the first connection,
as a raw ValueError. A bad URL is one invalid_config refusal naming the variable, with an example, and
never showing a password."""

from __future__ import annotations

import pytest

from kiln_project.config import ConfigError, load_config


def _refused(tmp_path, url: str) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_config({"KILN_HOME": str(tmp_path / "home"), "KILN_REDIS_URL": url})
    assert caught.value.code == "invalid_config"
    assert "e.g. KILN_REDIS_URL=redis://127.0.0.1:6379/0" in caught.value.hint
    return caught.value


@pytest.mark.parametrize("url, rule", [
    ("redis://127.0.0.1:6379/abc", "name a database number"),
    ("redis://127.0.0.1:6379/-1", "name a database number"),
    ("redis://127.0.0.1:6379/1/2", "name a database number"),
    ("unix:///run/redis.sock?db=x", "name a database number"),
    ("http://127.0.0.1:6379/11", "be a redis://, rediss:// or unix:// URL"),
    ("127.0.0.1:6379", "be a redis://, rediss:// or unix:// URL"),
    ("redis://127.0.0.1:abc/0", "have a port that is an integer from 1 to 65535"),
    ("redis://127.0.0.1:70000/0", "have a port that is an integer from 1 to 65535"),
    ("unix://", "name the socket's path"),
])
def test_a_bad_redis_url_is_invalid_config_naming_the_variable(tmp_path, url, rule):
    assert _refused(tmp_path, url).message.startswith(f"KILN_REDIS_URL must {rule}")
    assert _refused(tmp_path, url).message.endswith(f", not {url!r}")


def test_the_password_of_a_refused_url_is_not_shown(tmp_path):
    refused = _refused(tmp_path, "redis://:hunter2secret@127.0.0.1:6379/abc")
    assert refused.message.endswith("not 'redis://***@127.0.0.1:6379/abc'")
    refused = _refused(tmp_path, "redis://127.0.0.1:6379/0?password=hunter2secret&db=x")
    assert "hunter2secret" not in refused.message + refused.hint and "password=***" in refused.message


@pytest.mark.parametrize("url", ["redis://127.0.0.1:6379/9", "redis://127.0.0.1:6379", "redis://127.0.0.1/",
                                 "rediss://:pw@cache.example:6380/1", "unix:///run/redis/redis.sock",
                                 "unix:///run/redis/redis.sock?db=3", "redis://[::1]:6379/0"])
def test_a_valid_redis_url_is_kept_as_given(tmp_path, url):
    assert load_config({"KILN_HOME": str(tmp_path / "home"), "KILN_REDIS_URL": url}).redis_url == url
