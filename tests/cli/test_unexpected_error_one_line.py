"""An error no command foresaw is still one `error: unexpected_error: ...` line when its message has
several lines (a database error's DETAIL line, say)."""

from __future__ import annotations

from kiln_project.cli.main import main, unexpected_error


def test_a_multi_line_message_is_one_line():
    from django.db.utils import IntegrityError

    exc = IntegrityError('duplicate key value violates unique constraint "x"\nDETAIL:  Key (a)=(1) already exists.')
    mapped = unexpected_error(exc)
    assert mapped.code == "unexpected_error"
    assert mapped.message == ('IntegrityError: duplicate key value violates unique constraint "x" DETAIL: Key (a)=(1) '
                              "already exists.")


def test_the_cli_prints_it_as_one_line(capsys, monkeypatch):
    from kiln_project.cli import client

    def broken(self, *args, **kwargs):
        raise RuntimeError("first line\nsecond line")

    monkeypatch.setattr(client.KilnClient, "__init__", broken)
    monkeypatch.delenv("KILN_DEBUG", raising=False)
    assert main(["jobs", "list"]) == 1
    assert capsys.readouterr().err == ("error: unexpected_error: RuntimeError: first line second line (hint: set "
                                       "KILN_DEBUG=1 to see the traceback, and report it)\n")
