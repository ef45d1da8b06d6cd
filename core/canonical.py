"""Canonical JSON (RFC 8785) and the `sha256:<hex>` digests Kiln uses everywhere. Pure module."""

from __future__ import annotations

import hashlib

import rfc8785


def canonical_json(value) -> bytes:
    """RFC 8785 bytes: sorted keys, no whitespace, ECMAScript number formatting. Rejects NaN/Infinity."""
    return rfc8785.dumps(value)


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def json_digest(value) -> str:
    return sha256_digest(canonical_json(value))
