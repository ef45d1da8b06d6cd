"""Dashboard pages. Views only read (selectors) and call services; no domain decisions here."""

from django.contrib.auth.decorators import login_required
from django.http import HttpResponse


@login_required
def overview(request):
    return HttpResponse("Kiln")
