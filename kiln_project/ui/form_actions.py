"""A GET of a dashboard form's action address goes back to the page the form is on.

A form that fails re-renders its page at the address it posted to (`/ui/jobs/ID/cancel/`,
`/ui/promotions/N/reject/`, ...), which only takes POST: reloading it, or opening it again from the
history, answered an empty 405 that the browser showed as "this page isn't working". Now such a GET
is redirected up the path to the nearest page (`/ui/jobs/ID/`, `/ui/promotions/N/`).
"""

from __future__ import annotations

from django.http import HttpResponseRedirect
from django.urls import Resolver404, resolve

UI_PREFIX = "/ui/"


def nearest_page(path: str) -> str:
    """The closest address above `path` that the dashboard serves (at worst /ui/)."""
    parts = path.rstrip("/").split("/")
    while len(parts) > 2:
        parts.pop()
        candidate = "/".join(parts) + "/"
        try:
            resolve(candidate)
        except Resolver404:
            continue
        return candidate
    return UI_PREFIX


class FormActionGetMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (response.status_code == 405 and request.method in ("GET", "HEAD")
                and request.path.startswith(UI_PREFIX) and request.path != UI_PREFIX):
            return HttpResponseRedirect(nearest_page(request.path))
        return response
