"""Kiln's Django project: settings, URLs, ASGI app, the /v1 API, the job lifecycle, auth and the CLI."""
