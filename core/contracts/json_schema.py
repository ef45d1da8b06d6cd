"""JSON Schema of a contract dataclass, for the OpenAPI document. Pure module.

The contract dataclasses are the one checker of a request; this only describes them (field names,
JSON types, defaults, choices and bounds read off the dataclass), so the documentation cannot
drift from the code that validates.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any


def dataclass_schema(cls, *, title: str | None = None, description: str = "",
                     choices: dict[str, tuple] | None = None, overrides: dict[str, dict] | None = None,
                     nested: dict[type, dict] | None = None,
                     bounds: dict[str, tuple[float | None, float | None]] | None = None) -> dict:
    """An object schema with one property per field of `cls` (a trailing `_` is dropped from the
    name, as `lambda_` is `lambda` on the wire). Unknown properties are allowed: the contracts
    ignore keys they do not know."""
    hints = typing.get_type_hints(cls)
    choices, overrides, nested, bounds = choices or {}, overrides or {}, nested or {}, bounds or {}
    properties = {}
    for f in dataclasses.fields(cls):
        if not f.init or f.name == "ignored_keys":
            continue
        key = f.name.rstrip("_")
        schema = overrides.get(key) or _type_schema(hints[f.name], nested)
        schema = dict(schema)
        if key in choices:
            schema = _with_choices(schema, choices[key])
        if key in bounds:
            schema = _with_bounds(schema, *bounds[key])
        default = _default(f)
        if default is not dataclasses.MISSING:
            schema["default"] = default
        properties[key] = schema
    out = {"title": title or cls.__name__, "type": "object", "properties": properties,
           "additionalProperties": True}
    if description:
        out["description"] = description
    return out


def _with_choices(schema: dict, values: tuple) -> dict:
    if "anyOf" in schema:  # nullable: the choices or null
        return {"anyOf": [{"type": "string", "enum": list(values)}, {"type": "null"}]}
    return {**schema, "enum": list(values)}


def _with_bounds(schema: dict, low, high) -> dict:
    limits = {k: v for k, v in (("minimum", low), ("maximum", high)) if v is not None}
    if "anyOf" in schema:  # nullable: bound the non-null member
        return {**schema, "anyOf": [{**schema["anyOf"][0], **limits}, *schema["anyOf"][1:]]}
    return {**schema, **limits}


def _default(f) -> Any:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return dataclasses.MISSING
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, tuple):
        return list(value)
    return value


def _type_schema(hint, nested: dict[type, dict]) -> dict:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = _type_schema(members[0], nested) if len(members) == 1 else {
            "anyOf": [_type_schema(m, nested) for m in members]}
        return {"anyOf": [inner, {"type": "null"}]} if type(None) in typing.get_args(hint) else inner
    if origin in (tuple, list):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        return {"type": "array", "items": _type_schema(args[0], nested) if args else {}}
    if dataclasses.is_dataclass(hint):
        return nested.get(hint) or dataclass_schema(hint, nested=nested)
    simple = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object"}
    return {"type": simple[hint]} if hint in simple else {}
