"""OpenEnv WebSocket frames: the typed server messages and their strict parsing (openenv-protocol.md §4).

Pure module: no Django, no network. Server frames are `{"type", "data"}` objects of type
observation, state, error or mcp; observation data is `{observation, reward, done, metadata?}`
and error data `{code, message, errors?, active_sessions?, max_sessions?, factory_name?}`, unknown
fields rejected. Anything else raises the poisoning error that names what was wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from openenv.client.errors import (
    TERMINAL_WIRE_CODES,
    WIRE_CODES,
    OpenEnvCapacityReached,
    OpenEnvInvalidMessage,
    OpenEnvMalformedJson,
    OpenEnvProtocolError,
    OpenEnvUnknownFrameType,
)
from openenv.client.http import JsonError, strict_json

SERVER_TYPES = ("observation", "state", "error", "mcp")
OBSERVATION_KEYS = frozenset({"observation", "reward", "done", "metadata"})
ERROR_KEYS = frozenset({"code", "message", "errors", "active_sessions", "max_sessions", "factory_name"})


@dataclass(frozen=True)
class Observation:
    """An observation frame's data: `{observation, reward, done, metadata?}`, the reward as on the wire."""

    observation: Any
    reward: None | bool | int | float
    done: bool
    metadata: Any = None
    has_metadata: bool = False

    def to_json(self) -> dict:
        out = {"observation": self.observation, "reward": self.reward, "done": self.done}
        if self.has_metadata:
            out["metadata"] = self.metadata
        return out


@dataclass(frozen=True)
class ErrorFrame:
    code: str
    message: str
    errors: list | None = None
    active_sessions: int | None = None
    max_sessions: int | None = None
    factory_name: str | None = None

    @property
    def recoverable(self) -> bool:
        return self.code not in TERMINAL_WIRE_CODES

    def to_json(self) -> dict:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        for key in ("errors", "active_sessions", "max_sessions", "factory_name"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


def _int_or_none(value, key):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OpenEnvInvalidMessage(f"error frame {key} must be a non-negative integer")
    return value


def parse_observation(data: Any) -> Observation:
    if not isinstance(data, dict):
        raise _broken_observation("observation data is not a JSON object")
    unknown = set(data) - OBSERVATION_KEYS
    if unknown:
        raise _broken_observation(f"observation data has unknown fields {sorted(unknown)[:5]}")
    missing = [key for key in ("observation", "reward", "done") if key not in data]
    if missing:
        raise _broken_observation(f"observation data needs observation, reward and done; it lacks {', '.join(missing)}")
    reward = data["reward"]
    if not (reward is None or isinstance(reward, (bool, int))
            or (isinstance(reward, float) and math.isfinite(reward))):
        raise _broken_observation("the reward must be null, a boolean or a finite number")
    if not isinstance(data["done"], bool):
        raise _broken_observation("done must be a boolean")
    return Observation(data["observation"], reward, data["done"], data.get("metadata"), "metadata" in data)


def _broken_observation(message: str) -> OpenEnvInvalidMessage:
    return OpenEnvInvalidMessage(message, hint=OpenEnvInvalidMessage.observation_hint)


def parse_error(data: Any) -> ErrorFrame:
    if not isinstance(data, dict):
        raise OpenEnvInvalidMessage("error data is not a JSON object")
    unknown = set(data) - ERROR_KEYS
    if unknown:
        raise OpenEnvInvalidMessage(f"error data has unknown fields {sorted(unknown)[:5]}")
    code, message = data.get("code"), data.get("message")
    if code not in WIRE_CODES:
        raise OpenEnvInvalidMessage(f"unknown error code {str(code)[:40]!r}")
    if not isinstance(message, str):
        raise OpenEnvInvalidMessage("error message must be a string")
    errors = data.get("errors")
    if errors is not None and not isinstance(errors, list):
        raise OpenEnvInvalidMessage("error errors must be a list")
    factory = data.get("factory_name")
    if factory is not None and not isinstance(factory, str):
        raise OpenEnvInvalidMessage("error factory_name must be a string")
    return ErrorFrame(code, message[:4096], errors, _int_or_none(data.get("active_sessions"), "active_sessions"),
                      _int_or_none(data.get("max_sessions"), "max_sessions"), factory)


def parse_server_frame(text: str) -> tuple[str, Any]:
    """(type, parsed data) of one server text frame; raises a poisoning error when it is not one."""
    try:
        frame = strict_json(text)
    except JsonError as exc:
        raise OpenEnvMalformedJson(f"the server sent a frame that is not JSON: {str(exc)[:120]}") from None
    if not isinstance(frame, dict) or not isinstance(frame.get("type"), str):
        raise OpenEnvInvalidMessage("a server frame must be an object with a string type")
    kind = frame["type"]
    if kind not in SERVER_TYPES:
        raise OpenEnvUnknownFrameType(f"the server sent a frame of unknown type {kind[:40]!r}")
    if set(frame) != {"type", "data"}:
        raise OpenEnvInvalidMessage("a server frame must have exactly type and data")
    data = frame["data"]
    if kind == "observation":
        return kind, parse_observation(data)
    if kind == "error":
        return kind, parse_error(data)
    return kind, data


def protocol_error(frame: ErrorFrame) -> OpenEnvProtocolError:
    return OpenEnvCapacityReached(frame) if frame.code == "CAPACITY_REACHED" else OpenEnvProtocolError(frame)
