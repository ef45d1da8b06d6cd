"""Whether this process has model weights to train or sample with: the one refusal every route that
needs them makes when none is configured (spec §1.0: 503 `mock_mode` for training; an adapter upload's
400 is the adapters app's own)."""

from __future__ import annotations

from django.conf import settings

from core.errors import KilnError

MOCK_MODE_HINT = ("set model.path in kiln.toml or KILN_MODEL_PATH, restart the server, check that /health says "
                  "training_backend ready, and submit again")


def require_model_weights(*, needed_for: str = "") -> None:
    """KilnError 503 `mock_mode` when no model is configured; `needed_for` ends the message."""
    if settings.KILN.model_path is None:
        reason = f", so there is nothing {needed_for}" if needed_for else ""
        raise KilnError("mock_mode", f"real model weights are unavailable: no model is configured{reason}",
                        status=503, hint=MOCK_MODE_HINT)
