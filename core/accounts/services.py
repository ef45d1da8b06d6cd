"""Create, check and revoke API tokens; create users from the CLI."""

from __future__ import annotations

import hashlib
import logging
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError
from django.db import DatabaseError, IntegrityError, transaction
from django.utils import timezone

from core.accounts.models import ApiToken
from core.errors import KilnError

TOKEN_PREFIX = "kiln_"
log = logging.getLogger(__name__)


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def token_create(*, username: str, name: str = "") -> tuple[ApiToken, str]:
    """Return the stored token and its secret; the secret is not kept anywhere."""
    user = get_user_model().objects.filter(username=username).first()
    if user is None:
        raise KilnError("user_not_found", f"no user named {username!r}",
                        hint="create it first: kiln user create USERNAME")
    return token_issue(user=user, name=name)


def check_token_name(name) -> str:
    """A token's name is text that fits its column: SQLite would store a longer one silently, PostgreSQL
    refuse it with a DataError (and a NUL byte with a ValueError), so the rule is checked here, once."""
    limit = ApiToken._meta.get_field("name").max_length
    if not isinstance(name, str):
        raise KilnError("invalid_token_name", f"a token's name must be text, not {type(name).__name__}",
                        hint="e.g. --name laptop", field="name")
    if len(name) > limit:
        raise KilnError("invalid_token_name", f"a token's name is at most {limit} characters, not {len(name)}",
                        hint="give a shorter --name, e.g. laptop or ci", field="name")
    if "\x00" in name:
        raise KilnError("invalid_token_name", "a token's name cannot contain a NUL character",
                        hint="e.g. --name laptop", field="name")
    return name


def token_issue(*, user, name: str = "", token: ApiToken | None = None) -> tuple[ApiToken, str]:
    """Fill (or create) a token row with a fresh secret's prefix and hash; return it and the secret."""
    check_token_name(token.name if token is not None else name)
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token = token or ApiToken(user=user, name=name)
    token.user, token.prefix, token.token_hash = user, secret[:12], _hash(secret)
    token.save()
    return token, secret


def token_authenticate(*, secret: str):
    """The active user a bearer secret belongs to, or None."""
    token = ApiToken.objects.select_related("user").filter(token_hash=_hash(secret), revoked_at=None).first()
    if token is None or not token.user.is_active:
        return None
    _note_token_used(token)
    return token.user


_last_used_failing = False  # logged once per run of failures, not per request


def _note_token_used(token: ApiToken) -> None:
    """Bookkeeping only: a database that refuses writes (its disk full) must not fail the request,
    so that reading (the failed job, /health) still works while the disk is full."""
    global _last_used_failing
    try:
        with transaction.atomic():  # a savepoint: the request's own transaction stays usable
            ApiToken.objects.filter(id=token.id).update(last_used_at=timezone.now())
    except DatabaseError as exc:
        if not _last_used_failing:
            log.warning("could not record token use (last_used_at): %s; requests go on without it", exc)
        _last_used_failing = True
        return
    _last_used_failing = False


MIN_REVOKE_PREFIX = 8  # characters of a token's start that `kiln token revoke` accepts


def token_revoke(*, prefix: str) -> int:
    """Revoke one active token named by the whole secret `kiln token create` printed (matched by its
    hash, as authentication does) or by a start of it at least MIN_REVOKE_PREFIX characters long that
    only one active token has. Returns how many were revoked (0: none matches); a start shared by
    several active tokens, or one too short to tell tokens apart, is refused and revokes nothing."""
    value = (prefix or "").strip()
    active = ApiToken.objects.filter(revoked_at=None)
    if len(value) < MIN_REVOKE_PREFIX:
        raise KilnError("token_prefix_too_short",
                        f"give the token or at least its first {MIN_REVOKE_PREFIX} characters, not {len(value)}",
                        hint="the token starts with kiln_; `kiln token create` printed it")
    by_hash = active.filter(token_hash=_hash(value))
    if by_hash.exists():
        return by_hash.update(revoked_at=timezone.now())
    stored = value[: ApiToken._meta.get_field("prefix").max_length]
    if len(value) > len(stored):
        return 0  # longer than the stored prefix but not a token's secret: names nothing
    # startswith is case-insensitive on SQLite; token secrets are not: compare again exactly.
    matches = [i for i, p in active.filter(prefix__startswith=stored).values_list("id", "prefix") if p.startswith(stored)]
    if len(matches) > 1:
        raise KilnError("token_ambiguous", f"{len(matches)} active tokens start with {value!r}; nothing was revoked",
                        hint="give more of the token (its first 12 characters tell tokens apart), or all of it")
    return ApiToken.objects.filter(id__in=matches, revoked_at=None).update(revoked_at=timezone.now())


def check_new_username(username: str) -> None:
    """Refuse a name the login form would not take, or one already in use (before asking a password)."""
    User = get_user_model()
    try:  # the login form's own rule: letters, digits and @/./+/-/_ (150 at most)
        User.username_validator(username)
        if not username or len(username) > User._meta.get_field("username").max_length:
            raise ValidationError("empty or too long")
    except ValidationError:
        raise KilnError("invalid_username", f"{username!r} is not a valid user name",
                        hint="use 1-150 letters, digits and @ . + - _ (no spaces)") from None
    if User.objects.filter(username=username).exists():
        raise _user_exists(username)


def _user_exists(username: str) -> KilnError:
    return KilnError("user_exists", f"a user named {username!r} already exists")


def user_create(*, username: str, password: str | None, superuser: bool = False,
                can_submit: bool = True, can_approve: bool = False):
    User = get_user_model()
    check_new_username(username)
    try:
        # One transaction: a user is never left without the permissions asked for. Two creations of
        # one name at once both pass the check above; the database's unique name refuses the second.
        with transaction.atomic():
            if superuser:
                user = User.objects.create_superuser(username=username, password=password, email="")
            else:
                user = User.objects.create_user(username=username, password=password)
            codenames = (["submit_job"] if can_submit else []) + (["approve_promotion"] if can_approve else [])
            if codenames:
                user.user_permissions.add(*Permission.objects.filter(content_type__app_label="jobs",
                                                                     codename__in=codenames))
    except IntegrityError:
        if not User.objects.filter(username=username).exists():
            raise  # some other constraint: not a name clash
        raise _user_exists(username) from None
    return user
