"""`kiln token revoke` takes the value `kiln token create` printed (the whole token), or any start of it
of at least 8 characters that names exactly one active token; a shared start revokes nothing."""

from __future__ import annotations

import pytest

from core.accounts.models import ApiToken
from core.accounts.services import token_authenticate, token_create, token_revoke, user_create
from core.errors import KilnError
from kiln_project.cli.main import main

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _django_already_set_up(monkeypatch):
    from kiln_project.cli import accounts_cmd

    monkeypatch.setattr(accounts_cmd, "_setup", lambda: None)


@pytest.fixture
def alice():
    return user_create(username="alice", password="long-enough-pw")


def _issue(prefix: str) -> str:
    """A token whose stored 12-character prefix is `prefix` (to make two share a start)."""
    token, secret = token_create(username="alice")
    secret = prefix + secret[len(prefix):]
    from core.accounts.services import _hash

    ApiToken.objects.filter(id=token.id).update(prefix=secret[:12], token_hash=_hash(secret))
    return secret


def test_the_printed_token_revokes_itself(alice, capsys):
    assert main(["token", "create", "alice"]) == 0
    secret = capsys.readouterr().out.strip()
    assert token_authenticate(secret=secret) == alice
    assert main(["token", "revoke", secret]) == 0
    assert token_authenticate(secret=secret) is None
    assert ApiToken.objects.get().revoked_at is not None


@pytest.mark.parametrize("length", [8, 10, 12])
def test_a_start_of_at_least_8_characters_revokes_the_one_token(alice, length):
    secret = token_create(username="alice")[1]
    other = token_create(username="alice")[1]
    assert token_revoke(prefix=secret[:length]) == 1
    assert token_authenticate(secret=secret) is None
    assert token_authenticate(secret=other) == alice


def test_a_start_shared_by_two_tokens_revokes_nothing(alice):
    first, second = _issue("kiln_AbCdEf1"), _issue("kiln_AbCdEf2")
    with pytest.raises(KilnError) as caught:
        token_revoke(prefix="kiln_AbCdEf")
    assert caught.value.code == "token_ambiguous"
    assert caught.value.message == "2 active tokens start with 'kiln_AbCdEf'; nothing was revoked"
    assert token_authenticate(secret=first) == alice and token_authenticate(secret=second) == alice
    assert token_revoke(prefix="kiln_AbCdEf2") == 1  # more characters tell them apart
    assert token_authenticate(secret=first) == alice and token_authenticate(secret=second) is None


def test_the_start_is_compared_case_sensitively(alice):
    first = _issue("kiln_abcdefg")
    _issue("kiln_ABCDEFG")
    assert token_revoke(prefix="kiln_abcd") == 1  # SQLite's LIKE would match both
    assert token_authenticate(secret=first) is None


def test_too_short_or_unknown_values_revoke_nothing(alice):
    secret = token_create(username="alice")[1]
    with pytest.raises(KilnError) as caught:
        token_revoke(prefix="kiln_")
    assert caught.value.code == "token_prefix_too_short"
    assert token_revoke(prefix="kiln_zzzzzzz") == 0
    assert token_revoke(prefix=secret + "x") == 0  # not the token, not a start of any stored prefix
    assert token_revoke(prefix=secret[:12] + "nope") == 0
    assert token_authenticate(secret=secret) == alice
    assert token_revoke(prefix=secret) == 1 and token_revoke(prefix=secret) == 0  # once revoked, gone


def test_the_cli_turns_refusals_into_one_coded_line_and_never_echoes_a_secret(alice, capsys):
    def refused(*argv) -> str:
        assert main(["token", "revoke", *argv]) == 1
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1
        return err

    _issue("kiln_AbCdEf1"), _issue("kiln_AbCdEf2")
    assert refused("kiln_AbCdEf").startswith("error: token_ambiguous: ")
    assert refused("kiln_").startswith("error: token_prefix_too_short: ")
    secret = token_create(username="alice")[1]
    unknown = refused(secret + "x")
    assert unknown.startswith("error: token_not_found: ") and secret not in unknown
    assert main(["token", "revoke", secret]) == 0
    assert capsys.readouterr().out.strip() == f"revoked {secret[:12]}"
