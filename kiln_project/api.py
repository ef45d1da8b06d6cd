"""The /v1/ NinjaAPI: authentication, the error envelope for every failure, and the routers.

Web-facing: imports no torch, transformers, peft or gpu_runtime (import-linter enforces it).
"""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from django.http.multipartparser import MultiPartParserError
from ninja import NinjaAPI
from ninja.errors import AuthenticationError, HttpError
from ninja.errors import ValidationError as NinjaValidationError
from ninja.parser import Parser

from core.accounts.auth import anonymous_refusal_hint, api_auth, require_api_user
from core.errors import (
    DISK_FULL_CODE,
    DISK_FULL_HINT,
    KilnError,
    caused_by,
    clip,
    error_envelope,
    is_disk_full,
)

log = logging.getLogger(__name__)

API_ERROR_SCHEMA = {
    "title": "ApiError",
    "type": "object",
    "description": "Every failure: a stable machine-readable code, a message for people, and a hint that "
                   "names the fix (empty when there is nothing more to say).",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["code", "message", "hint"],
        "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "hint": {"type": "string"}},
    }},
}
HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


class KilnNinjaAPI(NinjaAPI):
    """NinjaAPI whose OpenAPI document declares the error envelope: each operation lists its success
    status plus `default: ApiError` (spec §1.0), since every failure, whatever route, has that shape."""

    def get_openapi_schema(self, *, path_prefix=None, path_params=None):
        schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
        schema.setdefault("components", {}).setdefault("schemas", {})["ApiError"] = API_ERROR_SCHEMA
        error = {"description": "Error: {error: {code, message, hint}}",
                 "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ApiError"}}}}
        for item in schema.get("paths", {}).values():
            for method, operation in item.items():
                if method in HTTP_METHODS and isinstance(operation, dict):
                    operation.setdefault("responses", {}).setdefault("default", error)
        return schema


class BodyRefused(ValueError):
    """A body that parses as JSON but that no route takes: `path: problem`, and what to send instead."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.message, self.hint = message, hint


class KilnParser(Parser):
    """Every route's JSON body is one object whose every string (keys and values, at any depth)
    encodes as UTF-8. A lone surrogate ("\\ud800") parses, but a database query or the tokenizer cannot encode
    it (a 500); a non-object body would be read as an empty one and take every default; and nesting
    beyond MAX_BODY_DEPTH. Checked once here for every route, before anything reads or stores the body."""

    def parse_body(self, request):
        data = super().parse_body(request)
        if not isinstance(data, dict):
            raise BodyRefused(f"request: the body must be a JSON object, not {_json_kind(data)}",
                              "send one JSON object (see this route's request format in /v1/docs)")
        problem = _body_problem(data)
        if problem:
            raise BodyRefused(*problem)
        return data


def _json_kind(value) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _is_text(value: str) -> bool:
    if value.isascii():  # the common case, checked in C without encoding
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# No route takes anything nested this deep (a scorer's JSON Schema, an OpenEnv run's reset options are
# a few levels); deeper, a validator's recursion (jsonschema's check_schema at about 200) ends in a 500.
MAX_BODY_DEPTH = 64


def _body_problem(data: dict) -> tuple[str, str] | None:
    """(message, hint) for a body no route takes: a string UTF-8 cannot encode, named by its JSON path
    (e.g. `messages[0].content`), or nesting deeper than MAX_BODY_DEPTH. Iterative: a body nested as
    deep as the JSON parser allows is fine here."""
    stack = [(data, None, 1)]  # (value, its path as a linked (parent, key) pair: built out only when needed, depth)
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict | list) and depth > MAX_BODY_DEPTH:
            return (f"{_path_text(path)}: nests deeper than {MAX_BODY_DEPTH} levels of objects and arrays",
                    f"flatten the body: no route takes JSON nested more than {MAX_BODY_DEPTH} levels deep")
        if isinstance(value, dict):
            for key, item in value.items():
                if not _is_text(key):
                    return _surrogate(_path_text(path), in_key=True)
                stack.append((item, (path, key), depth + 1))
        elif isinstance(value, list):
            stack.extend((item, (path, index), depth + 1) for index, item in enumerate(value))
        elif isinstance(value, str) and not _is_text(value):
            return _surrogate(_path_text(path), in_key=False)
    return None


def _surrogate(where: str, *, in_key: bool) -> tuple[str, str]:
    return (f"{where}: {'a key ' if in_key else ''}holds a lone surrogate; send valid Unicode text",
            "an escaped surrogate (\\ud800-\\udfff) must come as a pair, high then low, e.g. \\ud83d\\ude00")


def _path_text(path) -> str:
    parts = []
    while path is not None:
        path, key = path
        parts.append(f"[{key}]" if isinstance(key, int) else "." + clip(key))
    return "".join(reversed(parts)).removeprefix(".") or "request"


api = KilnNinjaAPI(
    title="Kiln API",
    version="1",
    description="Kiln training and agent control plane: jobs, inference, GRPO training, adapters, evaluations.",
    auth=api_auth,
    urls_namespace="v1",
    parser=KilnParser(),
    docs_url="/docs",
    docs_decorator=require_api_user,  # the document and its page, like every route but /health
)


def _respond(request, status: int, code: str, message: str, hint: str = "", headers: dict | None = None):
    response = api.create_response(request, error_envelope(code, message, hint), status=status)
    for name, value in (headers or {}).items():
        response[name] = value
    return response


def fallback_hint(code: str, status: int) -> str:
    """A hint for a refusal whose raising site gave none: the envelope's hint is never empty."""
    if code.endswith("_not_found") or status == 404:
        return "check the name or id; the matching list route (GET /v1/...) shows what exists"
    if code.endswith(("_invalid_request", "_invalid")) or code == "validation_error" or status in (400, 422):
        return "see this route's request format in /v1/docs (the OpenAPI document is /v1/openapi.json)"
    if status == 409:
        return "the current state does not allow this; read the resource again and retry"
    if status in (502, 503, 504):
        return "a service Kiln depends on did not answer; check GET /health and retry"
    return "see the server log for details"


@api.exception_handler(KilnError)
def _kiln_error(request, exc: KilnError):
    return _respond(request, exc.status, exc.code, exc.message, exc.hint or fallback_hint(exc.code, exc.status),
                    exc.headers)


# Routes whose request shape errors keep the code their contract gives every other bad value.
VALIDATION_CODES = {"/v1/train/": (400, "training_invalid_request"), "/v1/training/": (400, "training_invalid_request"),
                    "/v1/eval/": (400, "eval_invalid_request"),
                    "/v1/openenv/runs": (400, "openenv_invalid_request"),
                    "/v1/openenv/training/": (400, "training_invalid_request")}


def _route_validation(request) -> tuple[int, str]:
    """The status and code this route answers a malformed request with."""
    return next((v for prefix, v in VALIDATION_CODES.items() if request.path.startswith(prefix)),
                (422, "validation_error"))


PARAM_SOURCES = ("body", "query", "path", "header", "cookie", "form", "file")


def _field_path(loc) -> str:
    """Pydantic's location as the field's JSON path: ('body', 'body', 'groups', 0, 'text') is
    `groups[0].text`, ('query', 'examples') is `examples` (the source and the body parameter's
    own name say nothing to the client)."""
    parts = list(loc)
    source = parts.pop(0) if parts and parts[0] in PARAM_SOURCES else None
    if source == "body" and parts and parts[0] in ("body", "payload"):
        parts.pop(0)
    return "".join(f"[{p}]" if isinstance(p, int) else f".{clip(str(p))}" for p in parts).removeprefix(".")


@api.exception_handler(NinjaValidationError)
def _validation_error(request, exc: NinjaValidationError):
    first = exc.errors[0] if exc.errors else {}
    where = _field_path(first.get("loc", ())) or "request"
    message = first.get("msg", "invalid")
    if where == "request" and first.get("type") == "missing":
        message = "a JSON object body is required"
    status, code = _route_validation(request)
    return _respond(request, status, code, f"{where}: {message}", f"{len(exc.errors)} problem(s) in the request")


@api.exception_handler(AuthenticationError)
def _unauthorized(request, exc):
    if request.headers.get("Authorization", "").strip():  # a credential was sent and refused
        return _respond(request, 401, "unauthorized",
                        "the credentials were not accepted: the bearer token is unknown, revoked or expired",
                        "send Authorization: Bearer <token> with a live token (create one with: kiln token create "
                        "USER)")
    return _respond(request, 401, "unauthorized", "authentication required", anonymous_refusal_hint(request) or
                    "send Authorization: Bearer <token> (create one with: kiln token create USER)")


@api.exception_handler(HttpError)
def _http_error(request, exc: HttpError):
    if isinstance(exc.__cause__, BodyRefused):  # JSON, but not a body any route takes (KilnParser)
        status, code = _route_validation(request)
        return _respond(request, status, code, exc.__cause__.message, exc.__cause__.hint)
    if exc.status_code == 400 and str(exc).startswith("Cannot parse request body"):  # not JSON, or too deep
        code = next((v[1] for prefix, v in VALIDATION_CODES.items() if request.path.startswith(prefix)),
                    "invalid_json")
        return _respond(request, 400, code, f"request: not valid JSON ({exc})", "send one JSON object")
    return _respond(request, exc.status_code, f"http_{exc.status_code}", str(exc),
                    fallback_hint(f"http_{exc.status_code}", exc.status_code))


@api.exception_handler(Http404)
def _not_found(request, exc):
    return _respond(request, 404, "not_found", str(exc) or "not found", fallback_hint("not_found", 404))


@api.exception_handler(MultiPartParserError)
def _bad_multipart(request, exc):
    return _respond(request, 400, "invalid_multipart", f"request: not a readable multipart body ({exc})",
                    "send multipart/form-data with its boundary, as an HTTP client's file upload does")


@api.exception_handler(RequestDataTooBig)
def _too_large(request, exc):
    from django.conf import settings

    return _respond(request, 413, "request_too_large", "the request body is larger than the server accepts",
                    f"the limit is {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes (KILN_MAX_REQUEST_BYTES)")


def _broker_down(exc: BaseException) -> bool:
    """Whether `exc` (or what it wraps) is Redis not answering: refused, reset or timed out."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return caused_by(exc, lambda e: isinstance(e, RedisConnectionError | RedisTimeoutError))


@api.exception_handler(Exception)
def _internal(request, exc):
    if _broker_down(exc):  # the message broker is down or stalled: a service outage, not a server fault
        log.warning("%s %s: the message broker did not answer: %s", request.method, request.path, exc)
        return _respond(request, 503, "service_unavailable", f"the message broker (Redis) did not answer: {exc}",
                        "retry shortly; GET /health shows the broker's state (kiln serve restarts its private "
                        "Redis, or check KILN_REDIS_URL)", headers={"Retry-After": "5"})
    if is_disk_full(exc):  # a route's write (a pinned snapshot, a suite) met a full disk: the spec's 507
        log.warning("%s %s: the disk is full: %s", request.method, request.path, exc)
        # Not the exception's text: it names the server's own paths.
        return _respond(request, 507, DISK_FULL_CODE,
                        f"the server's disk is full ({getattr(exc, 'strerror', None) or 'no space left'})",
                        DISK_FULL_HINT)
    log.exception("unhandled error in %s %s", request.method, request.path)
    return _respond(request, 500, "internal_error", "the server failed to handle this request",
                    "see the server log for the traceback")


def _register_routers() -> None:
    from adapters.api import router as adapters_router
    from adapters.promotions_api import router as promotions_router
    from adapters.serving.api import router as inference_router
    from core.jobs.api import router as jobs_router
    from evaluations.api import router as eval_router
    from kiln_project.system_api import router as system_router
    from training.api import router as training_router

    api.add_router("/", system_router)
    api.add_router("/jobs", jobs_router)
    api.add_router("/", inference_router)
    api.add_router("/", training_router)
    api.add_router("/adapters", adapters_router)
    api.add_router("/eval", eval_router)
    api.add_router("/openenv", "openenv.api.router")
    api.add_router("/promotions", promotions_router)


_register_routers()
