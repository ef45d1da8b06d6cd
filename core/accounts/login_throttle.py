"""Password guessing from one client address, across accounts (issue 11: "per account and per client
address"). django-axes locks an account after 10 wrong passwords from anywhere; spraying one password
over many accounts never trips that, so wrong logins are also counted per address: past
LOGIN_ADDRESS_LIMIT within the window, every login from that address (any account, right password or
not) answers 429 with Retry-After until the window has passed. The limit is high because a team behind
one reverse proxy shares its address, and a few typos each must not lock everyone out.
"""

from __future__ import annotations

from django.core.cache import cache
from django.http import HttpResponse
from django.template.loader import render_to_string

LOGIN_ADDRESS_LIMIT = 50
LOGIN_ADDRESS_WINDOW_SECONDS = 900
LOGIN_PATHS = ("/ui/login/", "/admin/login/")


def _key(request) -> str:
    return f"kiln:bad-login:{request.META.get('REMOTE_ADDR', '')}"


def count_in_window(key: str, window_seconds: int) -> None:
    """One more under `key` in the cache; the count lapses `window_seconds` after its first."""
    if not cache.add(key, 1, window_seconds):
        try:
            cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.add(key, 1, window_seconds)


def count_failed_login(sender, credentials=None, request=None, **kwargs) -> None:
    """`user_login_failed` receiver: one more wrong login from the request's address."""
    if request is not None:
        count_in_window(_key(request), LOGIN_ADDRESS_WINDOW_SECONDS)


class LoginAddressThrottleMiddleware:
    """Refuses a login POST from an address past the limit, before any password is checked."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.method == "POST" and request.path in LOGIN_PATHS \
                and cache.get(_key(request), 0) >= LOGIN_ADDRESS_LIMIT:
            page = render_to_string("registration/address_locked_out.html", {
                "failure_limit": LOGIN_ADDRESS_LIMIT, "minutes": LOGIN_ADDRESS_WINDOW_SECONDS // 60}, request=request)
            return HttpResponse(page, status=429, headers={"Retry-After": str(LOGIN_ADDRESS_WINDOW_SECONDS)})
        return self.get_response(request)
