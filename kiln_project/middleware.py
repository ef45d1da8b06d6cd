"""Makes every /v1/ failure an error envelope, including Django's own 404, 405, 413 and 500 pages."""

from __future__ import annotations

import json

from django.http import HttpResponse, JsonResponse

from core.errors import error_envelope

_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
          405: "method_not_allowed", 413: "request_too_large", 500: "internal_error"}


# Routes whose bodies are file uploads bounded by their own setting, not the request limit.
LARGE_UPLOAD_ROUTES = frozenset({"/v1/adapters/upload"})
MULTIPART_OVERHEAD = 1024 * 1024


def _without_body(response):
    """What HEAD answers: GET's status and headers, Content-Length included, and no body."""
    if getattr(response, "streaming", False):
        bare = HttpResponse(status=response.status_code)
        for header, value in response.items():
            bare[header] = value
        response.close()  # a file download: release the file unread
        return bare
    response["Content-Length"] = str(len(response.content))
    response.content = b""
    return response


def _is_envelope(response) -> bool:
    if not response.get("Content-Type", "").startswith("application/json"):
        return False
    try:
        body = json.loads(response.content)
    except (ValueError, AttributeError):
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict) and "code" in body["error"]


class ApiErrorEnvelopeMiddleware:
    @staticmethod
    def _refuse_large_body(request):
        """Answer 413 before any view reads a body larger than the configured limit."""
        from django.conf import settings

        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if request.path in LARGE_UPLOAD_ROUTES:  # an adapter archive: its own quota, checked again while unpacking
            from adapters.archive import too_large

            # The multipart framing may add up to MULTIPART_OVERHEAD; the quota the user set is what is stated,
            # with the code the upload route itself answers, so one cause has one code at any size.
            quota = settings.KILN.max_adapter_upload_bytes
            if length > quota + MULTIPART_OVERHEAD:
                return JsonResponse(too_large(quota, f"the request body ({length} bytes)").envelope(), status=413)
            return None
        limit, setting = settings.DATA_UPLOAD_MAX_MEMORY_SIZE, "KILN_MAX_REQUEST_BYTES"
        if limit is not None and length > limit:
            return JsonResponse(error_envelope("request_too_large", f"the request body has {length} bytes",
                                               f"the limit is {limit} bytes ({setting})"), status=413)
        return None

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        head = False
        if request.path.startswith("/v1/"):
            too_large = self._refuse_large_body(request)
            if too_large is not None:
                return too_large
            # HEAD asks what GET would answer (a monitor's probe, `curl -I`): the routes declare GET only.
            head = request.method == "HEAD"
        if head:
            request.method = "GET"
        response = self.get_response(request)
        if head:
            request.method = "HEAD"  # a refusal names the method that was sent
        response = self._envelope(request, response)
        return _without_body(response) if head else response

    @staticmethod
    def _envelope(request, response):
        if not request.path.startswith("/v1/") or response.status_code < 400 or getattr(response, "streaming", False):
            return response
        if _is_envelope(response):
            return response
        status = response.status_code
        code = _CODES.get(status, f"http_{status}")
        if status == 405:
            allowed = response.get("Allow", "")
            wrapped = JsonResponse(error_envelope(code, f"{request.method} is not allowed on {request.path}",
                                                  f"allowed: {allowed}" if allowed else "see /v1/docs for the routes"),
                                    status=405)
            if allowed:
                wrapped["Allow"] = allowed
            return wrapped
        message = {404: f"no route {request.path}", 500: "the server failed to handle this request"}.get(
            status, f"request failed with status {status}")
        hint = {404: "see /v1/docs for the routes", 500: "see the server log for the traceback"}.get(
            status, "retry; if it persists, see the server log")
        wrapped = JsonResponse(error_envelope(code, message, hint), status=status)
        if "Retry-After" in response:
            wrapped["Retry-After"] = response["Retry-After"]
        return wrapped
