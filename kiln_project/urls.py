"""URL map: /ui/ pages, /v1/ API, /health, /admin/. Imports no torch (import-linter enforces it)."""

from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path
from django.views.generic import RedirectView

from core.accounts.auth import api_auth
from core.errors import KilnError
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


urlpatterns = [
    path("", RedirectView.as_view(url="/ui/", permanent=False)),
    path("health", health, name="health"),
    path("v1/", api.urls),
    path("ui/", include("kiln_project.ui.urls")),
    path("admin/", admin.site.urls),
]

# A body over KILN_MAX_REQUEST_BYTES on a dashboard form: Kiln's page with request_too_large, not Django's bare 400.
handler400 = "kiln_project.ui.views.bad_request"
