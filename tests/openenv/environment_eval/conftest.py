"""A real openenv==0.10.0 counter server (tests/openenv/real_server.py), one per module."""

from __future__ import annotations

import pytest

from tests.openenv.real_server import RealServer, openenv_python


@pytest.fixture(scope="module")
def counter(tmp_path_factory):
    server = RealServer(openenv_python(), tmp_path_factory.mktemp("openenv-eval"), max_sessions=8)
    with server:
        yield server
