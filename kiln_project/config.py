"""Kiln's effective configuration: defaults, then `kiln.toml`, then `KILN_*` environment variables.

Pure module (no Django import): settings.py, the CLI and the workers all read the same object, so
`GET /v1/config` shows exactly what every process runs with.
"""

from __future__ import annotations

import json
import math
import os
import stat
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.artifacts import HomeLayout
from kiln_project.config_values import (
    ConfigError,
    _bool_setting,
    _first,
    _int_setting,
    _kind,
    _redact_url,
    _redis_url,
    _toml_string,
)

SERVING_PROFILES = ("stable", "maintenance", "experimental")
DEFAULT_PORT = 8420
DEFAULT_HOST = "127.0.0.1"


# The KILN_KERNELS modes (gpu_runtime.kernels.selection.MODES; a test keeps the two equal). The web
# process never imports gpu_runtime, so the list is repeated here to check the variable at startup.
KERNEL_MODES = ("auto", "torch", "triton")

# Every kiln.toml table and the keys Kiln reads from it: anything else is refused by name (a typo
# such as `serving_profle` would otherwise silently leave the default in force). Nested tables
# ([training.defaults], [openenv.credentials.<id>]) are checked by their own parsers.
KNOWN_KEYS: dict[str, tuple[str, ...]] = {
    "model": ("path",),
    "server": ("home", "serving_profile", "host", "port", "allow_anonymous_api", "max_request_bytes",
               "max_adapter_upload_bytes", "production", "allowed_hosts"),
    "jobs": ("max_queued_jobs",),
    "training": ("max_queued_jobs", "checkpoint_interval", "dataset_roots", "defaults", "memory_budget_mib"),
    "openenv": ("enabled", "allow_remote_environments", "max_active_runs", "max_tracked_runs",
                "tracked_run_ttl_secs", "credentials", "reply_timeout_secs"),
    "promotion": ("require_approval", "allow_self_approval", "max_kl_to_reference", "min_length_ratio",
                  "max_length_ratio"),
    "sampler": ("max_batch_size",),
}
TOP_LEVEL_KEYS = ("home", *KNOWN_KEYS)


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
    # [openenv] reply_timeout_secs: how long a persisted run waits for one environment reply (a reset,
    # a step, a state) before it fails openenv_timeout; the CLI's --reply-timeout-seconds.
    openenv_reply_timeout_secs: int = 60
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
    # [training] memory_budget_mib (KILN_TRAINING_MEMORY_BUDGET_MIB): the memory one GRPO step may
    # use beyond the resident model, on any device; a submission whose estimate exceeds it is refused
    # with 413 training_will_not_fit (training.memory_preflight). 0: the GPU worker's accelerator
    # memory decides, and a CPU worker is not checked.
    training_memory_budget_mib: int = 0
    # KILN_KERNELS (auto | torch | triton): the GPU worker's kernel path (gpu_runtime.kernels.selection).
    kernels: str = "auto"

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


def _find_config_file(env: dict) -> Path | None:
    explicit = env.get("KILN_CONFIG")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(f"KILN_CONFIG names {path}, which is not a file")
        return path
    local = Path.cwd() / "kiln.toml"
    return local if local.is_file() else None


def demo_settings_file(env: dict) -> Path | None:
    """The demo's settings that `./scripts/serve` wrote to KILN_HOME/kiln.toml, for a `kiln serve` with no
    kiln.toml of its own (KILN_CONFIG, ./kiln.toml) that serves the demo model (no KILN_MODEL_PATH, or one
    naming a tiny model's folder): scripts/serve's own rule, so the guide's plain `kiln serve` after a first
    `./scripts/serve` keeps them. Only a file this user owns that nobody else may write: anyone who could
    write it could otherwise open the API or the dataset roots. A model of your own never gets them."""
    if env.get("KILN_CONFIG") or (Path.cwd() / "kiln.toml").is_file():
        return None
    model = env.get("KILN_MODEL_PATH")
    if model and not (Path(model).expanduser() / "kiln_tiny_release.json").is_file():
        return None
    kept = Path(env.get("KILN_HOME") or "~/.kiln").expanduser() / "kiln.toml"
    try:
        info = kept.lstat()
    except OSError:
        return None
    ours = stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return kept if ours else None


def _tables(toml: dict) -> dict[str, dict]:
    """The kiln.toml tables by name, each checked: a table, holding only keys Kiln reads."""
    unknown = [key for key in toml if key not in TOP_LEVEL_KEYS]
    if unknown:
        raise ConfigError(f"unknown kiln.toml key or table {unknown[0]!r}; known: "
                          f"{', '.join(f'[{name}]' if name in KNOWN_KEYS else name for name in TOP_LEVEL_KEYS)}")
    tables: dict[str, dict] = {}
    for name, known in KNOWN_KEYS.items():
        table = toml.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"[{name}] must be a table (a [{name}] section), not {table!r} ({_kind(table)})")
        for key in table:
            if key not in known:
                raise ConfigError(f"[{name}] {key} is not a Kiln setting; [{name}] knows {', '.join(known)}")
        tables[name] = table
    return tables


def load_config(env: dict | None = None) -> KilnConfig:
    """Build the effective configuration. Environment variables win over `kiln.toml`.

    Relative paths in kiln.toml (home, [model] path, [training] dataset_roots) are relative to the
    file's folder; relative paths in environment variables to the working folder. Every refusal is
    a ConfigError naming the key or variable, with a hint naming where it is set."""
    env = dict(os.environ if env is None else env)
    config_file = None
    try:
        config_file = _find_config_file(env)
        return _load(env, config_file)
    except ConfigError as exc:
        if not exc.hint:
            variable = exc.message.split(" ", 1)[0]
            if variable.startswith("KILN_"):
                where = f"the environment variable {variable} (variables win over kiln.toml)"
            elif config_file:
                where = str(config_file)
            else:
                where = "kiln.toml (KILN_CONFIG, else ./kiln.toml) or the KILN_* environment variable"
            exc.hint = f"fix {where}; README.md, Configuration, lists every setting"
        raise


def _load(env: dict, config_file: Path | None) -> KilnConfig:
    toml: dict = {}
    if config_file:
        try:
            toml = tomllib.loads(config_file.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{config_file}: {exc}") from None
    tables = _tables(toml)
    model_toml, server_toml, jobs_toml = tables["model"], tables["server"], tables["jobs"]
    training_toml, openenv_toml = tables["training"], tables["openenv"]
    promotion_toml, sampler_toml = tables["promotion"], tables["sampler"]
    file_folder = config_file.resolve().parent if config_file else Path.cwd()

    def toml_path(value: str) -> Path:
        return (file_folder / Path(value).expanduser()).resolve()

    toml_home = _toml_string(toml, "kiln.toml", "home") if "home" in toml else _toml_string(server_toml, "[server]",
                                                                                           "home")
    if env.get("KILN_HOME"):
        home_path = Path(env["KILN_HOME"]).expanduser().resolve()
    elif toml_home:
        home_path = toml_path(toml_home)
    else:
        home_path = Path("~/.kiln").expanduser().resolve()

    toml_model = _toml_string(model_toml, "[model]", "path")
    if env.get("KILN_MODEL_PATH"):
        model_path: Path | None = Path(env["KILN_MODEL_PATH"]).expanduser().resolve()
    elif toml_model:
        model_path = toml_path(toml_model)
    elif HomeLayout(home_path).tiny_model.is_dir():
        # The embedded default: the tiny model that `kiln model create-tiny` put in KILN_HOME.
        model_path = HomeLayout(home_path).tiny_model
    else:
        model_path = None

    profile_source = next((name for name in ("KILN_SERVER_SERVING_PROFILE", "KILN_SERVING_PROFILE") if env.get(name)),
                          "[server] serving_profile")
    profile = (env.get(profile_source) if profile_source in env
               else _toml_string(server_toml, "[server]", "serving_profile") or "stable")
    if profile not in SERVING_PROFILES:
        raise ConfigError(f"serving profile must be one of {', '.join(SERVING_PROFILES)}, not {profile!r} "
                          f"({profile_source})")

    kernels = env.get("KILN_KERNELS", "auto").strip().lower() or "auto"
    if kernels not in KERNEL_MODES:
        raise ConfigError(f"KILN_KERNELS must be one of {', '.join(KERNEL_MODES)}, not {env['KILN_KERNELS']!r}")

    anonymous = _bool_setting(env, "KILN_ALLOW_ANONYMOUS_API", server_toml, "[server]", "allow_anonymous_api", False)
    production = _bool_setting(env, "KILN_PRODUCTION", server_toml, "[server]", "production", False)
    if anonymous and production:  # behind the proxy production expects, every caller reads as loopback
        raise ConfigError("allow_anonymous_api cannot be on with production: behind the reverse proxy production "
                          "expects, every request reaches Kiln from 127.0.0.1, so every caller would be anonymous")

    extra_modules = env.get("KILN_EXTRA_JOB_MODULES", "")
    return KilnConfig(
        home=home_path,
        model_path=model_path,
        serving_profile=profile,
        host=_first(env.get("KILN_HOST"), _toml_string(server_toml, "[server]", "host")) or DEFAULT_HOST,
        port=_int_setting(env, "KILN_PORT", server_toml, "[server]", "port", DEFAULT_PORT, 1, 65535),
        database_url=env.get("DATABASE_URL") or None,
        redis_url=_redis_url(env, "KILN_REDIS_URL"),
        allow_anonymous_api=anonymous,
        max_queued_jobs=_max_queued_jobs(env, training_toml, jobs_toml),
        max_request_bytes=_int_setting(env, "KILN_MAX_REQUEST_BYTES", server_toml, "[server]", "max_request_bytes",
                                       8 * 1024 * 1024, 1024),
        max_adapter_upload_bytes=_int_setting(env, "KILN_MAX_ADAPTER_UPLOAD_BYTES", server_toml, "[server]",
                                              "max_adapter_upload_bytes", 512 * 1024 * 1024, 1024),
        secret_key=env.get("KILN_SECRET_KEY") or None,
        config_file=config_file,
        extra_job_modules=tuple(m.strip() for m in extra_modules.split(",") if m.strip()),
        extra_dataset_roots=_extra_dataset_roots(env, training_toml, config_file),
        allowed_hosts=_allowed_hosts(env, server_toml),
        production=production,
        openenv_allow_remote_environments=_bool_setting(
            env, "KILN_OPENENV_ALLOW_REMOTE_ENVIRONMENTS", openenv_toml, "[openenv]", "allow_remote_environments",
            False),
        **_openenv_runs(env, openenv_toml),
        openenv_credentials=_openenv_credentials(env, openenv_toml),
        promotion_require_approval=_optional_bool(env, "KILN_PROMOTION_REQUIRE_APPROVAL", promotion_toml,
                                                  "require_approval", None),
        promotion_allow_self_approval=bool(_optional_bool(env, "KILN_PROMOTION_ALLOW_SELF_APPROVAL", promotion_toml,
                                                          "allow_self_approval", False)),
        **_promotion_bounds(env, promotion_toml),
        training_defaults=_training_defaults(env, training_toml),
        sampler_max_batch_size=_int_setting(env, "KILN_SAMPLER_MAX_BATCH_SIZE", sampler_toml, "[sampler]",
                                            "max_batch_size", 32, 1),
        training_memory_budget_mib=_int_setting(env, "KILN_TRAINING_MEMORY_BUDGET_MIB", training_toml, "[training]",
                                                "memory_budget_mib", 0, 0),
        kernels=kernels,
    )


def _max_queued_jobs(env: dict, training_toml: dict, jobs_toml: dict) -> int:
    """KILN_MAX_QUEUED_JOBS, else [training] max_queued_jobs (the spec's name), else its older alias
    [jobs] max_queued_jobs (both set: they must agree); else 32."""
    training = _int_setting({}, "", training_toml, "[training]", "max_queued_jobs", 0, 1)
    jobs = _int_setting({}, "", jobs_toml, "[jobs]", "max_queued_jobs", 0, 1)
    if training and jobs and training != jobs:
        raise ConfigError(f"[training] max_queued_jobs ({training}) and its alias [jobs] max_queued_jobs ({jobs}) "
                          "disagree; set one of them")
    return _int_setting(env, "KILN_MAX_QUEUED_JOBS", {}, "", "", training or jobs or 32, 1)


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
    if where == "[training.defaults]" and "checkpoint_interval" in training_toml:
        # The spec's server default `training.checkpoint_interval`: the same as [training.defaults]
        # checkpoint_interval (KILN_TRAINING_DEFAULTS, which replaces the table, replaces it too).
        interval = training_toml["checkpoint_interval"]
        if not isinstance(table, dict):
            raise ConfigError("[training.defaults] must be a table")
        if "checkpoint_interval" in table and table["checkpoint_interval"] != interval:
            raise ConfigError(f"[training] checkpoint_interval ({interval!r}) and [training.defaults] "
                              f"checkpoint_interval ({table['checkpoint_interval']!r}) disagree; set one of them")
        table = {**table, "checkpoint_interval": interval}
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            raise ConfigError(f"[training] checkpoint_interval must be an integer of at least 1, "
                              f"not {interval!r} ({_kind(interval)})")
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
    out: dict = {"openenv_enabled": _bool_setting(env, "KILN_OPENENV_ENABLED", table, "[openenv]", "enabled", True)}
    for key, default in (("max_active_runs", 4), ("max_tracked_runs", 128), ("tracked_run_ttl_secs", 604800),
                         ("reply_timeout_secs", 60)):
        out[f"openenv_{key}"] = _int_setting(env, f"KILN_OPENENV_{key.upper()}", table, "[openenv]", key, default, 1)
    return out


def _optional_bool(env: dict, name: str, table: dict, key: str, default: bool | None) -> bool | None:
    """An environment variable (true/false) wins over the [promotion] key; neither: the default."""
    return _bool_setting(env, name, table, "[promotion]", key, default)


def _allowed_hosts(env: dict, server_toml: dict) -> tuple[str, ...]:
    configured = server_toml.get("allowed_hosts", [])
    if not isinstance(configured, list) or not all(isinstance(item, str) for item in configured):
        raise ConfigError("[server] allowed_hosts must be a list of host names")
    extra = [h.strip() for h in env.get("KILN_ALLOWED_HOSTS", "").split(",") if h.strip()]
    return tuple(dict.fromkeys([*configured, *extra]))


SYSTEM_FOLDERS = frozenset(Path(p) for p in ("/", "/etc", "/usr", "/var", "/bin", "/sbin", "/lib", "/lib64", "/boot",
                                              "/dev", "/proc", "/sys", "/run"))


def _extra_dataset_roots(env: dict, training_toml: dict, config_file: Path | None) -> tuple[Path, ...]:
    """The folder `kiln serve` was started in (KILN_LAUNCH_DIR, which serve passes to its children,
    else this process's working folder) unless it is / or a system folder (SYSTEM_FOLDERS), then the
    configured roots; relative entries in kiln.toml are relative to that file's folder."""
    launch = Path(env.get("KILN_LAUNCH_DIR") or os.getcwd())
    configured = training_toml.get("dataset_roots", [])
    if not isinstance(configured, list) or not all(isinstance(item, str) for item in configured):
        raise ConfigError("[training] dataset_roots must be a list of folder paths")
    base = config_file.resolve().parent if config_file else launch
    extra = [("[training] dataset_roots", base / Path(item).expanduser()) for item in configured]
    extra += [("KILN_DATASET_ROOTS", Path(item.strip()).expanduser())
              for item in env.get("KILN_DATASET_ROOTS", "").split(":") if item.strip()]
    started_in = Path(os.path.realpath(launch))
    # Started in / (systemd's default working folder) or a system folder, the launch folder would open
    # every file there (/etc/shadow's existence, say) to a server-side path: only a setting adds those.
    roots: list[Path] = [] if started_in in SYSTEM_FOLDERS else [started_in]
    for where, root in extra:
        resolved = Path(os.path.realpath(root))
        if not resolved.is_dir():
            raise ConfigError(f"{where} names {root}, which is not an existing folder")
        if resolved not in roots:
            roots.append(resolved)
    return tuple(roots)
