"""Reading one configuration value strictly: an environment variable's text, or a kiln.toml value of
the right TOML type and range. Each refusal is a ConfigError naming the variable or `[table] key`.
Pure module (kiln_project.config builds the whole configuration from these)."""

from __future__ import annotations

import re
from urllib.parse import parse_qs, urlsplit


class ConfigError(ValueError):
    """The configuration file or an environment variable holds a value Kiln cannot use.

    The message names the key (`[server] port`) or the variable (`KILN_PORT`); `code` is the stable
    error code the CLI prints, `hint` says where the setting lives (load_config fills it in)."""

    code = "invalid_config"

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message, self.hint = message, hint


# What a kiln.toml value is, in words, for a refusal (bool before int: a TOML boolean is a Python int).
_KINDS = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"), (list, "a list"),
          (dict, "a table"))


def _kind(value) -> str:
    return next((words for kind, words in _KINDS if isinstance(value, kind)), f"a {type(value).__name__}")


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def _range_words(minimum: int, maximum: int | None) -> str:
    return f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"


def _parse_int(name: str, value, minimum: int = 0, maximum: int | None = None, text: bool = True) -> int:
    """An integer from an environment variable (`text`) or kiln.toml (a TOML integer: not a boolean, not
    a float, not a string), within [minimum, maximum]. `name` is the variable or `[section] key`."""
    if text and isinstance(value, str):
        try:
            number = int(value.strip())
        except ValueError:
            raise ConfigError(f"{name} must be an integer {_range_words(minimum, maximum)}, not {value!r}") from None
    elif isinstance(value, int) and not isinstance(value, bool):
        number = value
    else:
        raise ConfigError(f"{name} must be an integer {_range_words(minimum, maximum)}, "
                          f"not {value!r} ({_kind(value)})")
    if number < minimum or (maximum is not None and number > maximum):
        raise ConfigError(f"{name} must be an integer {_range_words(minimum, maximum)}, not {number}")
    return number


def _int_setting(env: dict, variable: str, table: dict, where: str, key: str, default: int,
                 minimum: int, maximum: int | None = None) -> int:
    """The variable (when set and not empty) wins over the kiln.toml key; neither: the default. The key
    is checked even when the variable wins: a bad file must not wait unnoticed until the variable goes."""
    in_file = _parse_int(f"{where} {key}", table[key], minimum, maximum, text=False) if key in table else default
    if env.get(variable, "").strip():
        return _parse_int(variable, env[variable], minimum, maximum)
    return in_file


def _toml_bool(table: dict, where: str, key: str, default):
    if key not in table:
        return default
    value = table[key]
    if not isinstance(value, bool):
        raise ConfigError(f"{where} {key} must be true or false, not {value!r} ({_kind(value)})")
    return value


def _bool_setting(env: dict, variable: str, table: dict, where: str, key: str, default):
    """The variable (1/0, true/false, yes/no, on/off) wins over the kiln.toml key, which must be a TOML
    boolean (`"false"`, a string, is refused: it would read as true); neither: the default."""
    in_file = _toml_bool(table, where, key, default)  # checked even when the variable wins
    if variable in env:
        return _parse_bool(variable, env[variable])
    return in_file


def _first(*values):
    """The first value that is set (every argument is evaluated first: each one's checks run)."""
    return next((value for value in values if value), None)


def _toml_string(table: dict, where: str, key: str) -> str | None:
    if key not in table:
        return None
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where} {key} must be a non-empty string, not {value!r} ({_kind(value)})")
    return value


def _redact_url(url: str) -> str:
    """The URL as it may be shown: user and password (up to the last @) and a password= query value as ***."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        url = f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", url)


REDIS_SCHEMES = ("redis", "rediss", "unix")
REDIS_URL_EXAMPLES = ("redis://127.0.0.1:6379/0 (host, port, database number), rediss://:PASSWORD@host:6380/1 or "
                      "unix:///run/redis/redis.sock")


def _redis_url(env: dict, variable: str) -> str | None:
    """The Redis URL in `variable`, or None. Checked here because redis-py ignores a database path it cannot
    read (`/abc` would silently be database 0 of a shared Redis) and refuses another scheme only when a
    process first connects."""
    value = env.get(variable) or None
    if value is None:
        return None
    shown = _redact_url(value)

    def refuse(rule: str) -> ConfigError:
        return ConfigError(f"{variable} must {rule}, not {shown!r}",
                           f"e.g. {variable}={REDIS_URL_EXAMPLES}; unset it and kiln serve runs a private Redis")

    scheme = value.split("://", 1)[0] if "://" in value else ""
    if scheme not in REDIS_SCHEMES:  # exactly as redis-py reads it: lower case
        raise refuse("be a redis://, rediss:// or unix:// URL")
    parts = urlsplit(value)
    try:
        port = parts.port  # None: the default, 6379
    except ValueError:  # not an integer, or above 65535
        port = 0
    if port == 0:  # redis-py would quietly take 0 as the default port too
        raise refuse("have a port that is an integer from 1 to 65535")
    if scheme == "unix" and not parts.path:
        raise refuse("name the socket's path (unix:///path/to/redis.sock)")
    databases = parse_qs(parts.query).get("db", [])  # ?db=N, which wins over the path
    if scheme != "unix":
        databases.append(parts.path[1:])  # redis://host:port/N; empty: database 0
    if not all(db.isascii() and db.isdigit() for db in databases if db):
        raise refuse("name a database number (/0, /1, ... or ?db=N) or none (database 0)")
    return value
