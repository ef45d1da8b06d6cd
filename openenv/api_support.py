"""What the OpenEnv routers share (openenv/api.py, openenv/runs/api.py, openenv/training/api.py). Web-facing: no torch.

Their request and response models take any JSON object, which the handler (or the service behind it)
checks itself, while the OpenAPI document shows the route's own schema; their bodies are bounded
(413 `request_too_large`) and, where the handler reads the raw body, must be JSON (400 with the
route's own code).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from core.errors import KilnError

MAX_BODY_BYTES = 1024 * 1024


class Documented(BaseModel):
    """Any JSON object, checked by the handler; the OpenAPI document shows the route's schema.
    (A plain pydantic model: ninja's Schema reads declared fields only and would drop the rest.)"""

    model_config = ConfigDict(extra="allow")

    def as_dict(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def documented(name: str, schema: dict[str, Any], module: str, *, title: str | None = None) -> type[Documented]:
    """A Documented model named `name` (its OpenAPI component) whose JSON schema is `schema`, titled
    `title` (default: the name); `module` is the defining module's `__name__`, the class's home."""
    return type(name, (Documented,), {"__module__": module, "__qualname__": name, "model_config": ConfigDict(
        extra="allow", title=title or name, json_schema_extra=lambda s, cls: s.update(schema))})


def check_body_size(request, what: str) -> None:
    """413 when the body holds more than MAX_BODY_BYTES; `what` names it ("an OpenEnv request")."""
    if len(request.body) > MAX_BODY_BYTES:
        raise KilnError("request_too_large", f"{what} may hold at most {MAX_BODY_BYTES} bytes",
                        status=413, hint="send a smaller JSON object")


def json_body(request, code: str, hint: str = "") -> Any:
    """The raw body as JSON, for a handler that checks it itself; 400 `code` when it is not JSON."""
    try:
        return json.loads(request.body)
    except ValueError:
        raise KilnError(code, "request: is not JSON", status=400, hint=hint) from None
