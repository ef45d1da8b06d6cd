"""Whatever goes wrong, a kiln command answers one `error: code: message` line and a non-zero exit,
never a Python traceback (KILN_DEBUG=1 shows the traceback for a report)."""

from __future__ import annotations

import gzip

import pytest

from kiln_project.cli.main import main


@pytest.fixture(autouse=True)
def _django_already_set_up(monkeypatch):
    """The local commands call django.setup(), which would point the logging handlers at this test's
    captured stderr: later tests' log lines would then fail on a closed stream ("Logging error")."""
    from kiln_project.cli import accounts_cmd

    monkeypatch.setattr(accounts_cmd, "_setup", lambda: None)


def _run(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def test_a_compressed_request_file_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    packed = tmp_path / "rounds.jsonl.gz"
    packed.write_bytes(gzip.compress(b'{"messages": []}\n'))
    code, err = _run(capsys, ["train", "grpo", "--file", str(packed), "--adapter", "x-r001",
                              "--url", "http://127.0.0.1:9"])
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ")


def test_a_malformed_url_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    code, err = _run(capsys, ["jobs", "list", "--url", "http://[::1"])
    assert code == 1 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: invalid_url: ")


def test_an_unwritable_model_folder_is_one_line(capsys, monkeypatch):
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    code, err = _run(capsys, ["model", "create-tiny", "/proc/kiln-no-such-folder/model"])
    assert code != 0 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_an_unforeseen_error_is_one_line_and_kiln_debug_shows_the_traceback(capsys, monkeypatch):
    from kiln_project.cli import client

    def broken(self, *args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(client.KilnClient, "__init__", broken)
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    code, err = _run(capsys, ["jobs", "list"])
    assert code == 1 and err.strip() == ("error: unexpected_error: RuntimeError: boom (hint: set KILN_DEBUG=1 to "
                                         "see the traceback, and report it)")
    monkeypatch.setenv("KILN_DEBUG", "1")
    with pytest.raises(RuntimeError, match="boom"):
        main(["jobs", "list"])


@pytest.mark.django_db
@pytest.mark.parametrize("name, code", [("bad name!", "invalid_username"), ("taken", "user_exists")])
def test_user_create_refuses_a_bad_or_taken_name_before_asking_a_password(capsys, monkeypatch, name, code):
    import getpass

    from core.accounts.services import user_create

    user_create(username="taken", password="long-enough-pw")
    monkeypatch.delenv("KILN_PASSWORD", raising=False)
    monkeypatch.setattr(getpass, "getpass", lambda prompt: pytest.fail("asked a password"))
    code_out, err = _run(capsys, ["user", "create", name])
    assert code_out == 1 and err.startswith(f"error: {code}: "), err


def test_a_closed_stdin_at_the_password_prompt_is_one_line(capsys, monkeypatch, db):
    import io
    import sys

    monkeypatch.delenv("KILN_PASSWORD", raising=False)
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    monkeypatch.setattr(sys, "stdin", io.StringIO(""))  # no terminal, and nothing to read
    code, err = _run(capsys, ["user", "create", "newcomer"])
    assert code == 1 and err.startswith("error: input_closed: ") and "KILN_PASSWORD" in err
