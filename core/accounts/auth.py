"""How /v1/ requests authenticate: a Bearer token, or the browser session with CSRF.

Anonymous API access exists only when KILN_ALLOW_ANONYMOUS_API is on (off by default) and the
request comes from a loopback address, naming this machine as its Host (not a rebound page name).
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from ninja.utils import check_csrf

from core.accounts.permissions import APPROVE_PROMOTION, DELETE_OTHERS_WORK, approval_required, team_exists
from core.errors import KilnError


def _is_loopback(request) -> bool:
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


class LoopbackAnonymous(AnonymousUser):
    """The caller when anonymous loopback access is allowed: it may do what a user may. Where a team
    governs (more than one active user, or promotions that need approval), it is no approver and may not
    act on others' work: a program without credentials changed the active adapter, unrecorded, while
    the team's users needed an approver to."""

    def has_perm(self, perm, obj=None) -> bool:
        if perm == APPROVE_PROMOTION:
            return not approval_required()
        if perm == DELETE_OTHERS_WORK:
            return not team_exists()
        return True


# Token guessing: this many wrong bearer tokens from one client address within the window, and
# every further wrong token from there answers 429 with Retry-After until the window has passed.
# A valid token is always answered: the address may be a proxy the whole team shares, and one
# script with a stale token must not lock everyone out (tokens are too long to guess anyway).
BAD_TOKEN_LIMIT = 20
BAD_TOKEN_WINDOW_SECONDS = 300


def _bad_token_key(request) -> str:
    return f"kiln:bad-token:{request.META.get('REMOTE_ADDR', '')}"


def _check_token_throttle(request) -> None:
    from django.core.cache import cache

    if cache.get(_bad_token_key(request), 0) >= BAD_TOKEN_LIMIT:
        raise KilnError("too_many_requests", "too many wrong API tokens from this address", status=429,
                        hint=f"check the token you send (a valid one is still answered); wrong tokens are refused "
                             f"for {BAD_TOKEN_WINDOW_SECONDS} s; create a token with: kiln token create USER",
                        headers={"Retry-After": str(BAD_TOKEN_WINDOW_SECONDS)})


def _count_bad_token(request) -> None:
    from core.accounts.login_throttle import count_in_window

    count_in_window(_bad_token_key(request), BAD_TOKEN_WINDOW_SECONDS)


def api_auth(request):
    """ninja auth callable: the authenticated user, or None (answered as 401 `unauthorized`)."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, secret = header.partition(" ")
        user = None
        if scheme.lower() == "bearer" and secret.strip():
            from core.accounts.services import token_authenticate

            user = token_authenticate(secret=secret.strip())
        if user is not None:
            request.user = user
            return user
        from core.accounts.services import TOKEN_PREFIX

        # Only a well-formed "Bearer <placeholder>": a real token sent malformed (without the scheme, or as
        # "Bearer Bearer kiln_...") must stay a 401, not become an anonymous caller whose work nobody owns.
        placeholder = scheme.lower() == "bearer" and " " not in secret.strip() and TOKEN_PREFIX not in header
        if placeholder and _anonymous_allowed(request):
            # A placeholder the openai client insists on (api_key="EMPTY", "none"): not a Kiln token, so not a
            # wrong one; where programs on this machine need none, it is read as none (QA: it was 401).
            request.user = LoopbackAnonymous()
            return request.user
        _check_token_throttle(request)
        _count_bad_token(request)
        return None
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        if request.method not in ("GET", "HEAD", "OPTIONS") and check_csrf(request) is not None:
            raise KilnError("csrf_failed", "CSRF check failed for this session request", status=403,
                            hint="send the csrftoken cookie's value in the X-CSRFToken header, or use a Bearer token")
        return user
    if _anonymous_allowed(request):
        request.user = LoopbackAnonymous()
        return request.user
    return None


def _anonymous_allowed(request) -> bool:
    return settings.KILN.allow_anonymous_api and _is_loopback(request) and _named_for_this_machine(request) \
        and not _from_a_web_page(request)


def _named_for_this_machine(request) -> bool:
    """Whether the Host a request names is this machine's loopback (or a host the operator configured).
    A page whose own name was rebound to 127.0.0.1 (DNS rebinding) reaches the loopback socket, but it
    sends its own name as Host (QA: `Host: evil.example` was answered like curl)."""
    from django.http.request import split_domain_port, validate_host

    host = request.META.get("HTTP_HOST")
    if host is None:
        return True  # no name at all (HTTP/1.0): no page's name either
    domain, _ = split_domain_port(host)
    if validate_host(domain, [*settings.LOOPBACK_HOSTS, *settings.KILN.allowed_hosts]):
        return True
    try:
        return ipaddress.ip_address(domain.strip("[]")).is_loopback
    except ValueError:
        return False


def anonymous_refusal_hint(request) -> str | None:
    """Why a loopback caller without credentials was refused where anonymous loopback access is on."""
    if not (settings.KILN.allow_anonymous_api and _is_loopback(request)):
        return None
    if not _named_for_this_machine(request):
        return ("anonymous access answers programs that address this machine as localhost or 127.0.0.1 (a page "
                "whose name was rebound to it must not get it): use http://127.0.0.1:PORT, or send Authorization: "
                "Bearer <token> (kiln token create USER)")
    if _from_a_web_page(request):
        return "a request a browser sends for a web page gets no anonymous access: log in, or send a Bearer token"
    return None


def _from_a_web_page(request) -> bool:
    """Whether a browser sent this on behalf of a page. Anonymous loopback access is for programs on
    this machine (curl, the openai client, scripts); any web page the user has open could otherwise
    reach 127.0.0.1 and act without credentials (a cross-site request needs no CORS answer to land).
    Browsers mark such requests with Origin and Sec-Fetch-Site; curl and HTTP libraries send neither.
    Kiln's own pages use the session and its CSRF token instead."""
    site = request.headers.get("Sec-Fetch-Site")
    return bool(request.headers.get("Origin")) or (site is not None and site != "none")


def require_api_user(view):
    """Decorate a plain Django view (ninja's OpenAPI document and docs page) with the API's auth:
    a Bearer token, a logged-in session, or anonymous loopback access where allowed; else 401."""
    from functools import wraps

    from django.http import JsonResponse

    from core.errors import error_envelope

    @wraps(view)
    def guarded(request, *args, **kwargs):
        try:
            user = api_auth(request)
        except KilnError as exc:  # throttled
            response = JsonResponse(exc.envelope(), status=exc.status)
            for name, value in exc.headers.items():
                response[name] = value
            return response
        if user is None:
            return JsonResponse(error_envelope(
                "unauthorized", "authentication required",
                "send Authorization: Bearer <token> (create one with: kiln token create USER), or log in at /ui/"),
                status=401)
        return view(request, *args, **kwargs)

    return guarded


def require_permission(request, codename: str) -> None:
    """Raise 403 `permission_denied` unless the caller holds jobs.<codename>."""
    if not request.user.has_perm(f"jobs.{codename}"):
        raise KilnError("permission_denied", f"this user lacks the {codename} permission", status=403,
                        hint="an administrator can grant it in /admin/ (Users → permissions)")
