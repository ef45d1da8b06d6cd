"""Django settings for Kiln, derived from the effective KilnConfig (kiln.toml + KILN_* variables)."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from core.artifacts import write_file
from core.redis_clients import blocking_client_options
from kiln_project.config import load_config

BASE_DIR = Path(__file__).resolve().parent.parent
KILN = load_config()
# Private: the database, the secret key, tokens. exist_ok, not a check first: several commands
# started together on a fresh home each see none, and all but one meet the home another just made.
KILN.home.mkdir(parents=True, mode=0o700, exist_ok=True)


def _secret_key() -> str:
    """Use KILN_SECRET_KEY, else a key generated once and kept in KILN_HOME (never in the repo)."""
    if KILN.secret_key:
        return KILN.secret_key
    if KILN.production:
        raise ImproperlyConfigured("production settings need KILN_SECRET_KEY from the environment "
                                   "(50 or more random characters)")
    key_file = KILN.layout.secret_key
    if not key_file.exists():
        try:  # exclusive: two processes starting at once keep one key
            write_file(key_file, secrets.token_urlsafe(50).encode(), mode=0o600, exclusive=True)
        except FileExistsError:
            pass
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = False
# Loopback by default, where a proxy in front decides exposure; production names its hosts, and
# loopback is always served (README: "none (loopback always)"): a production server with no
# KILN_ALLOWED_HOSTS answers on loopback only, and a health check on 127.0.0.1 is not a 400.
LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
ALLOWED_HOSTS = list(dict.fromkeys([*LOOPBACK_HOSTS, *KILN.allowed_hosts])) if KILN.production else ["*"]

if KILN.production:
    # KILN_PRODUCTION=1 (or [server] production = true): Kiln behind an HTTPS proxy
    # (docs/deploy.md). `manage.py check --deploy` is clean with these.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    SECURE_HSTS_SECONDS = 31_536_000
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    CSRF_TRUSTED_ORIGINS = [f"https://{host}" for host in KILN.allowed_hosts]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "ninja",
    "channels",
    "django_htmx",
    "template_partials",
    "django_dramatiq",
    "axes",
    "core",
    "core.accounts",
    "core.jobs",
    "core.metrics",
    "adapters.serving",
    "kiln_project.ui",
    "adapters",
    "training",
    "evaluations",
    "openenv",
]

# A dashboard form with a failed CSRF token gets the dashboard's page (kiln_project/ui/views.py).
CSRF_FAILURE_VIEW = "kiln_project.ui.views.csrf_failure"

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "kiln_project.middleware.ApiErrorEnvelopeMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "kiln_project.ui.form_actions.FormActionGetMiddleware",  # a reloaded form action: back to its page
    "core.accounts.login_throttle.LoginAddressThrottleMiddleware",  # wrong logins per address, any account
    "axes.middleware.AxesMiddleware",  # last: it answers a locked-out login
]

# Login throttling (django-axes): after 10 wrong passwords for one account, logins to it are refused
# with 429 for 15 minutes, from any address. Not per client address here: behind the reverse proxy
# docs/deploy.md recommends every user shares one, and ten typos would lock the whole team out (QA);
# guessing across accounts from one address has its own, higher limit (core.accounts.login_throttle).
# API tokens: core.accounts.auth.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
AXES_FAILURE_LIMIT = 10
AXES_COOLOFF_TIME = 0.25  # hours
AXES_LOCKOUT_PARAMETERS = ["username"]
AXES_LOCKOUT_TEMPLATE = "registration/locked_out.html"  # the page, with how long and what to do
# axes warns that a lock without the address can be dodged by rotating user agents or cookies; this one is
# keyed by the account alone, which no rotation changes (and by design not by the shared proxy address).
SILENCED_SYSTEM_CHECKS = ["axes.W006"]
AXES_RESET_ON_SUCCESS = True
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False  # no start-up banner in every CLI command's output

ROOT_URLCONF = "kiln_project.urls"
ASGI_APPLICATION = "kiln_project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "kiln_project.ui.context.kiln_context",
            ],
        },
    }
]

_env = environ.Env()
DATABASES = {"default": _env.db_url_config(KILN.effective_database_url)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    _db_file = Path(DATABASES["default"]["NAME"])
    if not _db_file.exists():  # created 0600 before SQLite opens it (its -wal and -shm follow suit)
        _db_file.parent.mkdir(parents=True, exist_ok=True)
        os.close(os.open(_db_file, os.O_CREAT | os.O_WRONLY, 0o600))
    # WAL lets the workers write while the web process reads; the timeout rides out short locks.
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 30,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # channels_redis blocks in BZPOPMIN for up to 5 s (its brpop_timeout): the socket must outwait it.
        "CONFIG": {"hosts": [{"address": KILN.effective_redis_url, **blocking_client_options(5)}],
                   "prefix": "kiln:channels"},
    }
}

DRAMATIQ_BROKER = {
    "BROKER": "dramatiq.brokers.redis.RedisBroker",
    # A worker killed mid-flight (kill -9, out of memory) leaves the messages it had prefetched but not
    # started unacknowledged; Redis maintenance requeues a dead worker's messages. Dramatiq's defaults
    # (60 s without a heartbeat, maintenance on 0.1 % of commands) left them stranded for many
    # minutes on a quiet server; these get them to the restarted worker within about half a minute.
    # A duplicate delivery is harmless: jobs are claimed in the database, and a request's reader
    # takes its first answer.
    "OPTIONS": {"url": KILN.effective_redis_url, "namespace": "kiln-dramatiq",
                "heartbeat_timeout": 30_000, "maintenance_chance": 100_000},
    "MIDDLEWARE": [
        "dramatiq.middleware.AgeLimit",
        "dramatiq.middleware.TimeLimit",
        "dramatiq.middleware.Callbacks",
        "dramatiq.middleware.Pipelines",
        "dramatiq.middleware.Retries",
        "django_dramatiq.middleware.DbConnectionsMiddleware",
        "kiln_project.worker_middleware.KilnWorkerMiddleware",
    ],
}
DRAMATIQ_RESULT_BACKEND = {
    "BACKEND": "dramatiq.results.backends.redis.RedisBackend",
    "BACKEND_OPTIONS": {"url": KILN.effective_redis_url, "namespace": "kiln-results"},
    "MIDDLEWARE_OPTIONS": {"result_ttl": 10 * 60 * 1000},
}
DRAMATIQ_AUTODISCOVER_MODULES = ["tasks"]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 8}},
]
LOGIN_URL = "/ui/login/"
LOGIN_REDIRECT_URL = "/ui/"
LOGOUT_REDIRECT_URL = "/ui/login/"

DATA_UPLOAD_MAX_MEMORY_SIZE = KILN.max_request_bytes
FILE_UPLOAD_MAX_MEMORY_SIZE = KILN.max_request_bytes

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "/static/"
STATIC_ROOT = KILN.layout.static
STATIC_ROOT.mkdir(exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "static"]
WHITENOISE_USE_FINDERS = True  # serve straight from the apps' static dirs: no collectstatic step

NINJA_PAGINATION_PER_PAGE = 50

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {"django.request": {"level": "ERROR"}, "daphne": {"level": "WARNING"}},
}
