"""`kiln serve` refuses a port that something already listens on, before it starts anything."""

from __future__ import annotations

import socket

import pytest

from kiln_project.cli.client import CliError
from kiln_project.cli.serve import check_port_free


def test_a_port_in_use_is_refused_by_name_and_a_free_one_passes():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(CliError) as refused:
            check_port_free("127.0.0.1", port)
        assert refused.value.code == "port_in_use"
        assert f"127.0.0.1:{port}" in refused.value.message and "--port" in refused.value.hint
    check_port_free("127.0.0.1", port)  # closed again: free
