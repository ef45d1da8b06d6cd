"""Settings for in-process tests: a throw-away KILN_HOME, an in-memory channel layer, a stub broker.

Tests that need real Redis, workers and a web server use tests/support/stack.py, whose processes run
with the product settings (kiln_project.settings), not these.
"""

import dataclasses
import os
import tempfile
from pathlib import Path

# Parallel test processes (pytest-xdist) inherit the first process's environment: each gets its own home.
if "KILN_HOME" not in os.environ or os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["KILN_HOME"] = tempfile.mkdtemp(prefix=f"kiln-test-home-{os.environ.get('PYTEST_XDIST_WORKER', '')}")
os.environ.setdefault("KILN_SECRET_KEY", "test-secret-key-not-for-production-0123456789")
os.environ["KILN_EXTRA_JOB_MODULES"] = "tests.support.job_kinds"
# Tests write their corpora under the temp folder: a dataset root, as a user's own folder is.
os.environ.setdefault("KILN_DATASET_ROOTS", tempfile.gettempdir())
os.environ.setdefault("KILN_ALLOWED_HOSTS", "testserver")  # the host Django's test client and communicators use

from kiln_project.settings import *  # noqa: E402,F403

CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
DRAMATIQ_BROKER = {
    "BROKER": "dramatiq.brokers.stub.StubBroker",
    "OPTIONS": {},
    "MIDDLEWARE": ["dramatiq.middleware.TimeLimit", "dramatiq.middleware.Retries"],
}
DRAMATIQ_RESULT_BACKEND = {
    "BACKEND": "dramatiq.results.backends.stub.StubBackend",
    "BACKEND_OPTIONS": {},
    "MIDDLEWARE_OPTIONS": {"result_ttl": 60000},
}
# A configured model, as on a real install: training is refused at submission (503 mock_mode) without
# one. Nothing is built there; tests that run the model point this at the tiny model, and the ones
# about a missing model set it to None.
KILN = dataclasses.replace(KILN, model_path=Path(tempfile.gettempdir()) / "kiln-test-model-not-loaded")  # noqa: F405
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins in tests
