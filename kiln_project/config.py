"""Kiln's effective configuration: defaults, then `kiln.toml`, then `KILN_*` environment variables.

Pure module (no Django import): settings.py, the CLI and the workers all read the same object, so
`GET /v1/config` shows exactly what every process runs with.
"""

from __future__ import annotations

import json
import math
import os
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.artifacts import HomeLayout

SERVING_PROFILES = ("stable", "maintenance", "experimental")
DEFAULT_PORT = 8420
DEFAULT_HOST = "127.0.0.1"


class ConfigError(ValueError):
    """The configuration file or an environment variable holds a value Kiln cannot use."""


@dataclass(frozen=True)
class KilnConfig:
    home: Path
    model_path: Path | None
    serving_profile: str = "stable"
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    database_url: str | None = None
    redis_url: str | None = None
    allow_anonymous_api: bool = False
    max_queued_jobs: int = 32
    max_request_bytes: int = 8 * 1024 * 1024
    # The largest adapter archive POST /v1/adapters/upload accepts (compressed, and unpacked in total).
    max_adapter_upload_bytes: int = 512 * 1024 * 1024
    secret_key: str | None = None
    config_file: Path | None = None
    extra_job_modules: tuple[str, ...] = field(default_factory=tuple)
    # Besides KILN_HOME's data folders, where request-named server files (dataset_path) may be
    # read from (core.confined_paths): the launch folder and the configured roots.
    extra_dataset_roots: tuple[Path, ...] = field(default_factory=tuple)
    # Host names a browser page may open the live sockets from, besides loopback and the bind address.
    allowed_hosts: tuple[str, ...] = field(default_factory=tuple)
    production: bool = False  # HTTPS behind a proxy: secure cookies, HSTS, the hosts above only
    # [openenv] allow_remote_environments: server-side OpenEnv routes may reach non-loopback URLs
    # (off by default, as SSRF protection; the CLI is unrestricted).
    openenv_allow_remote_environments: bool = False
    # [openenv] enabled, max_active_runs, max_tracked_runs, tracked_run_ttl_secs (reference-spec §1.6):
    # persisted runs (POST /v1/openenv/runs) admitted FIFO, at most max_active_runs at once.
    openenv_enabled: bool = True
    openenv_max_active_runs: int = 4
    openenv_max_tracked_runs: int = 128
    openenv_tracked_run_ttl_secs: int = 604800
    # [openenv.credentials.<id>] origin = "https://host[:port]", bearer_token_env = "VAR" (or
    # KILN_OPENENV_CREDENTIALS, a JSON object of the same tables, which replaces them): the handles a
    # request's credential_ids may name. The token itself is read from VAR by the process that
    # connects, when it connects; it is never part of the configuration.
    openenv_credentials: dict = field(default_factory=dict)
    # [promotion] require_approval: activation waits for a person holding jobs.approve_promotion.
    # None (the default): on whenever more than one active user exists (adapters.promotions decides).
    promotion_require_approval: bool | None = None
    # [promotion] allow_self_approval: the requester of a promotion may approve it too.
    promotion_allow_self_approval: bool = False
    # [promotion] reward-hacking alarm bounds (adapters.promotion_evidence.promotion_alarms explains the
    # defaults): the KL to the reference (nats per action token, last-quarter mean of the run), and the
    # candidate / incumbent mean completion length on the held-out eval.
    promotion_max_kl_to_reference: float = 0.5
    promotion_min_length_ratio: float = 0.5
    promotion_max_length_ratio: float = 2.0
    # [training.defaults] (or KILN_TRAINING_DEFAULTS, a JSON object, which replaces the table): GRPO
    # config fields every submission gets unless its request sets them (training.config_defaults).
    training_defaults: dict = field(default_factory=dict)
    # [sampler] max_batch_size: the most sequences the GPU worker's sampler decodes in one step (its
    # cohort). More rows a step amortise reading the weights (a CPU or a small model samples faster),
    # at the cost of one KV cache row each: size it to the accelerator's memory and the longest
    # completions served.
    sampler_max_batch_size: int = 32

    @property
    def dataset_roots(self) -> tuple[Path, ...]:
        layout = self.layout
        return tuple(dict.fromkeys((layout.rollouts, layout.datasets, *self.extra_dataset_roots)))

    @property
    def layout(self) -> HomeLayout:
        """Every location under KILN_HOME (core.artifacts names them all)."""
        return HomeLayout(self.home)

    @property
    def redis_socket(self) -> Path:
        """Where `kiln serve` puts its private Redis when no KILN_REDIS_URL is given."""
        return self.layout.redis_socket

    @property
    def effective_redis_url(self) -> str:
        return self.redis_url or f"unix://{self.redis_socket}"

    @property
    def effective_database_url(self) -> str:
        return self.database_url or f"sqlite:///{self.layout.database}"

    def public_dict(self) -> dict:
        """The configuration as shown to users: secrets and credentials left out."""
        data = asdict(self)
        data.pop("secret_key")
        data["home"] = str(self.home)
        data["model_path"] = str(self.model_path) if self.model_path else None
        data["config_file"] = str(self.config_file) if self.config_file else None
        data.pop("extra_dataset_roots")
        data["dataset_roots"] = [str(root) for root in self.dataset_roots]
        data["database_url"] = _redact_url(self.effective_database_url)
        data["redis_url"] = _redact_url(self.effective_redis_url)
        data["extra_job_modules"] = list(self.extra_job_modules)
        return data


def _redact_url(url: str) -> str:
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


def _parse_bool(name: str, value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{name} must be true or false, not {value!r}")


def _parse_int(name: str, value, minimum: int = 0) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be an integer, not {value!r}") from None
    if number < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, not {number}")
    return number


def _find_config_file(env: dict) -> Path | None:
    explicit = env.get("KILN_CONFIG")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(f"KILN_CONFIG names {path}, which is not a file")
        return path
    local = Path.cwd() / "kiln.toml"
    return local if local.is_file() else None


def load_config(env: dict | None = None) -> KilnConfig:
    """Build the effective configuration. Environment variables win over `kiln.toml`."""
    env = dict(os.environ if env is None else env)
    config_file = _find_config_file(env)
    toml: dict = {}
    if config_file:
        try:
            toml = tomllib.loads(config_file.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{config_file}: {exc}") from None
    model_toml = toml.get("model", {})
    server_toml = toml.get("server", {})
    jobs_toml = toml.get("jobs", {})
    training_toml = toml.get("training", {})
    openenv_toml = toml.get("openenv", {})
    promotion_toml = toml.get("promotion", {})
    sampler_toml = toml.get("sampler", {})

    home = env.get("KILN_HOME") or toml.get("home") or server_toml.get("home") or "~/.kiln"
    home_path = Path(home).expanduser().resolve()

    model_path = env.get("KILN_MODEL_PATH") or model_toml.get("path")
    if not model_path and HomeLayout(home_path).tiny_model.is_dir():
        # The embedded default: the tiny model that `kiln model create-tiny` put in KILN_HOME.
        model_path = HomeLayout(home_path).tiny_model

    profile = (
        env.get("KILN_SERVER_SERVING_PROFILE")
        or env.get("KILN_SERVING_PROFILE")
        or server_toml.get("serving_profile")
        or "stable"
    )
    if profile not in SERVING_PROFILES:
        raise ConfigError(f"serving profile must be one of {', '.join(SERVING_PROFILES)}, not {profile!r}")

    anonymous = env.get("KILN_ALLOW_ANONYMOUS_API")
    extra_modules = env.get("KILN_EXTRA_JOB_MODULES", "")
    return KilnConfig(
        home=home_path,
        model_path=Path(model_path).expanduser().resolve() if model_path else None,
        serving_profile=profile,
        host=env.get("KILN_HOST") or server_toml.get("host") or DEFAULT_HOST,
        port=_parse_int("port", env.get("KILN_PORT") or server_toml.get("port") or DEFAULT_PORT, 1),
        database_url=env.get("DATABASE_URL") or None,
        redis_url=env.get("KILN_REDIS_URL") or None,
        allow_anonymous_api=(
            _parse_bool("KILN_ALLOW_ANONYMOUS_API", anonymous)
            if anonymous is not None
            else bool(server_toml.get("allow_anonymous_api", False))
        ),
        max_queued_jobs=_parse_int(
            "max_queued_jobs", env.get("KILN_MAX_QUEUED_JOBS") or jobs_toml.get("max_queued_jobs") or 32, 1
        ),
        max_request_bytes=_parse_int(
            "max_request_bytes",
            env.get("KILN_MAX_REQUEST_BYTES") or server_toml.get("max_request_bytes") or 8 * 1024 * 1024,
            1024,
        ),
        max_adapter_upload_bytes=_parse_int(
            "max_adapter_upload_bytes",
            env.get("KILN_MAX_ADAPTER_UPLOAD_BYTES") or server_toml.get("max_adapter_upload_bytes")
            or 512 * 1024 * 1024,
            1024,
        ),
        secret_key=env.get("KILN_SECRET_KEY") or None,
        config_file=config_file,
        extra_job_modules=tuple(m.strip() for m in extra_modules.split(",") if m.strip()),
        extra_dataset_roots=_extra_dataset_roots(env, training_toml, config_file),
        allowed_hosts=_allowed_hosts(env, server_toml),
        production=(_parse_bool("KILN_PRODUCTION", env["KILN_PRODUCTION"]) if "KILN_PRODUCTION" in env
                    else bool(server_toml.get("production", False))),
        openenv_allow_remote_environments=(
            _parse_bool("KILN_OPENENV_ALLOW_REMOTE_ENVIRONMENTS", env["KILN_OPENENV_ALLOW_REMOTE_ENVIRONMENTS"])
            if "KILN_OPENENV_ALLOW_REMOTE_ENVIRONMENTS" in env
            else bool(openenv_toml.get("allow_remote_environments", False))),
        **_openenv_runs(env, openenv_toml),
        openenv_credentials=_openenv_credentials(env, openenv_toml),
        promotion_require_approval=_optional_bool(env, "KILN_PROMOTION_REQUIRE_APPROVAL", promotion_toml,
                                                  "require_approval", None),
        promotion_allow_self_approval=bool(_optional_bool(env, "KILN_PROMOTION_ALLOW_SELF_APPROVAL", promotion_toml,
                                                          "allow_self_approval", False)),
        **_promotion_bounds(env, promotion_toml),
        training_defaults=_training_defaults(env, training_toml),
        sampler_max_batch_size=_parse_int(
            "[sampler] max_batch_size",
            env.get("KILN_SAMPLER_MAX_BATCH_SIZE") or sampler_toml.get("max_batch_size", 32),
            1,
        ),
    )


def _json_variable_or_table(env: dict, variable: str, table_name: str, table) -> tuple[str, object]:
    """(where, value): the JSON object in `variable` when it is set (it replaces the kiln.toml table
    whole), else the table."""
    if variable not in env:
        return table_name, table
    try:
        return variable, json.loads(env[variable] or "{}")
    except ValueError as exc:
        raise ConfigError(f"{variable} must be a JSON object: {exc}") from None


def _training_defaults(env: dict, training_toml: dict) -> dict:
    """[training.defaults] or KILN_TRAINING_DEFAULTS (which wins, whole), checked as a GrpoConfig:
    an unknown key, an invalid value or a per-run identity field is a ConfigError naming it."""
    from core.contracts.grpo_values import GrpoConfigError
    from training.config_defaults import check_training_defaults

    where, table = _json_variable_or_table(env, "KILN_TRAINING_DEFAULTS", "[training.defaults]",
                                           training_toml.get("defaults", {}))
    try:
        return check_training_defaults(table)
    except GrpoConfigError as exc:
        field = "" if exc.field == "training.defaults" else f" {exc.field}"
        raise ConfigError(f"{where}{field}: {exc.message}") from None


def _positive_float(env: dict, name: str, table: dict, key: str, default: float) -> float:
    """An environment variable wins over the kiln.toml key; neither: the default. Finite and > 0."""
    value = env[name] if name in env else table.get(key, default)
    try:
        if isinstance(value, bool):
            raise TypeError
        number = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"[promotion] {key} ({name}) must be a number, not {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise ConfigError(f"[promotion] {key} ({name}) must be a finite number above 0, not {value!r}")
    return number


def _promotion_bounds(env: dict, table: dict) -> dict:
    """[promotion] max_kl_to_reference, min_length_ratio (at most 1), max_length_ratio (at least 1)."""
    bounds = {f"promotion_{key}": _positive_float(env, f"KILN_PROMOTION_{key.upper()}", table, key, default)
              for key, default in (("max_kl_to_reference", 0.5), ("min_length_ratio", 0.5),
                                   ("max_length_ratio", 2.0))}
    if bounds["promotion_min_length_ratio"] > 1 or bounds["promotion_max_length_ratio"] < 1:
        raise ConfigError("[promotion] min_length_ratio must be at most 1 and max_length_ratio at least 1")
    return bounds


def _openenv_credentials(env: dict, openenv_toml: dict) -> dict:
    """{handle: {"origin", "bearer_token_env"}} from [openenv.credentials.<id>] or KILN_OPENENV_CREDENTIALS,
    each checked: a handle of [A-Za-z0-9_-]{1,64} (not "-"), an exact canonical origin (HTTPS unless
    loopback; no path), a valid variable name."""
    from openenv.client.credentials import CREDENTIAL_HANDLE, VARIABLE_NAME, check_secure
    from openenv.client.errors import OpenEnvError
    from openenv.client.urls import normalize_url

    where, tables = _json_variable_or_table(env, "KILN_OPENENV_CREDENTIALS", "[openenv.credentials]",
                                            openenv_toml.get("credentials", {}))
    if not isinstance(tables, dict):
        raise ConfigError(f"{where} must be a table of credentials")
    out = {}
    for handle, table in tables.items():
        name = f"{where} {handle}"
        if not CREDENTIAL_HANDLE.match(handle) or handle == "-":
            raise ConfigError(f"{name}: a credential handle is 1..64 of A-Z a-z 0-9 _ - (and not '-')")
        if not isinstance(table, dict) or set(table) != {"origin", "bearer_token_env"}:
            raise ConfigError(f"{name}: needs exactly origin and bearer_token_env")
        origin, variable = table["origin"], table["bearer_token_env"]
        try:
            endpoint = normalize_url(origin) if isinstance(origin, str) else None
        except OpenEnvError as exc:
            raise ConfigError(f"{name}: origin: {exc.message}") from None
        if endpoint is None or endpoint.origin != origin.rstrip("/"):
            raise ConfigError(f"{name}: origin must be an exact origin such as https://env.example:8443, "
                              f"not {origin!r}")
        try:
            check_secure(endpoint)
        except OpenEnvError as exc:
            raise ConfigError(f"{name}: {exc.message}") from None
        if not isinstance(variable, str) or not VARIABLE_NAME.match(variable):
            raise ConfigError(f"{name}: bearer_token_env must be an environment variable name")
        out[handle] = {"origin": endpoint.origin, "bearer_token_env": variable}
    return out


def _openenv_runs(env: dict, table: dict) -> dict:
    """[openenv] enabled and the run admission bounds (KILN_OPENENV_<KEY> wins over kiln.toml)."""
    out: dict = {"openenv_enabled": (_parse_bool("KILN_OPENENV_ENABLED", env["KILN_OPENENV_ENABLED"])
                                     if "KILN_OPENENV_ENABLED" in env else bool(table.get("enabled", True)))}
    for key, default in (("max_active_runs", 4), ("max_tracked_runs", 128), ("tracked_run_ttl_secs", 604800)):
        name = f"KILN_OPENENV_{key.upper()}"
        out[f"openenv_{key}"] = _parse_int(f"[openenv] {key}", env.get(name) or table.get(key) or default, 1)
    return out


def _optional_bool(env: dict, name: str, table: dict, key: str, default: bool | None) -> bool | None:
    """An environment variable (true/false) wins over the kiln.toml key; neither: the default."""
    if name in env:
        return _parse_bool(name, env[name])
    if key not in table:
        return default
    value = table[key]
    if not isinstance(value, bool):
        raise ConfigError(f"[promotion] {key} must be true or false, not {value!r}")
    return value


def _allowed_hosts(env: dict, server_toml: dict) -> tuple[str, ...]:
    configured = server_toml.get("allowed_hosts", [])
    if isinstance(configured, str) or not all(isinstance(item, str) for item in configured):
        raise ConfigError("[server] allowed_hosts must be a list of host names")
    extra = [h.strip() for h in env.get("KILN_ALLOWED_HOSTS", "").split(",") if h.strip()]
    return tuple(dict.fromkeys([*configured, *extra]))


def _extra_dataset_roots(env: dict, training_toml: dict, config_file: Path | None) -> tuple[Path, ...]:
    """The folder `kiln serve` was started in (KILN_LAUNCH_DIR, which serve passes to its children,
    else this process's working folder), then the configured roots; relative entries in kiln.toml
    are relative to that file's folder."""
    launch = Path(env.get("KILN_LAUNCH_DIR") or os.getcwd())
    configured = training_toml.get("dataset_roots", [])
    if isinstance(configured, str) or not all(isinstance(item, str) for item in configured):
        raise ConfigError("[training] dataset_roots must be a list of folder paths")
    base = config_file.parent if config_file else launch
    extra = [base / Path(item).expanduser() for item in configured]
    extra += [Path(item).expanduser() for item in env.get("KILN_DATASET_ROOTS", "").split(":") if item.strip()]
    roots: list[Path] = []
    for root in (launch, *extra):
        resolved = Path(os.path.realpath(root))
        if resolved not in roots:
            roots.append(resolved)
    return tuple(roots)
