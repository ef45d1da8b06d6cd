"""URL map: /ui/ pages, /v1/ API, /health, /metrics, /admin/. Imports no torch (import-linter enforces it)."""

from django.contrib import admin
from django.db import DatabaseError
from django.http import HttpResponse, JsonResponse
from django.urls import include, path
from django.views.generic import RedirectView

from core.accounts.auth import api_auth, require_api_user
from core.errors import KilnError, error_envelope
from core.metrics.selectors import CONTENT_TYPE, exposition
from kiln_project.api import api
from kiln_project.health import health_report, public_view


def health(request):
    """The one route without auth: status fields for anyone, the full report for a signed-in caller."""
    status, body = health_report()
    try:
        signed_in = api_auth(request) is not None
    except KilnError:  # a throttled address gets what anyone gets
        signed_in = False
    if not signed_in:
        body = public_view(body)
    return JsonResponse(body, status=status)


@require_api_user
def metrics(request):
    """Prometheus's scrape (text format 0.0.4), with the API's auth: a scraper sends a Bearer token
    (`authorization: {credentials: ...}` in its scrape config) or, where allowed, scrapes over loopback."""
    if request.method not in ("GET", "HEAD"):
        response = JsonResponse(error_envelope("method_not_allowed", f"{request.method} /metrics is not served",
                                               "scrape it with GET"), status=405)
        response["Allow"] = "GET, HEAD"
        return response
    try:
        body = exposition()
    except DatabaseError as exc:  # the counters and gauges are rows: no database, no numbers
        return JsonResponse(error_envelope("metrics_unavailable", f"the database did not answer: {exc}"[:500],
                                           "check GET /health; Prometheus records the failed scrape and retries"),
                            status=503)
    response = HttpResponse(b"" if request.method == "HEAD" else body.encode(), content_type=CONTENT_TYPE)
    response["Content-Length"] = str(len(body.encode()))
    response["Cache-Control"] = "no-store"
    return response


urlpatterns = [
    path("", RedirectView.as_view(url="/ui/", permanent=False)),
    path("health", health, name="health"),
    path("metrics", metrics, name="metrics"),
    path("v1/", api.urls),
    path("ui/", include("kiln_project.ui.urls")),
    path("admin/", admin.site.urls),
]

# A body over KILN_MAX_REQUEST_BYTES on a dashboard form: Kiln's page with request_too_large, not Django's bare 400.
handler400 = "kiln_project.ui.views.bad_request"
handler404 = "kiln_project.ui.views.not_found"
