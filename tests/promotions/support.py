"""Shared by the promotion tests: a private KILN_HOME, published adapters without a model, users and
API clients."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from django.test import Client

from adapters.models import Adapter
from adapters.services import adapter_publish, adapter_reserve
from core.accounts.services import token_create, user_create


@pytest.fixture
def home(settings, tmp_path):
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"


def policy(settings, **values) -> None:
    """Set `[promotion]` values on the running configuration (require_approval, allow_self_approval)."""
    settings.KILN = replace(settings.KILN, **{f"promotion_{k}": v for k, v in values.items()})


def published(home: Path, name: str, *, loaded: bool = False, job=None) -> Adapter:
    folder = home / "adapters" / name
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights of " + name.encode())
    adapter_reserve(name=name, job=job)
    return adapter_publish(name=name, path=folder, content_sha256="sha256:" + name.encode().hex().ljust(64, "0")[:64],
                           base_model_sha256="", loaded=loaded)


def approve(promotion_id: int, user, reason: str):
    """Approve, then run its activation job (the stand-in worker answers the canary) to its end."""
    from adapters.models import Promotion
    from adapters.promotions import promotion_approve
    from tests.support.canary import drain_activations

    promotion_approve(promotion_id=promotion_id, user=user, reason=reason)
    drain_activations()
    return Promotion.objects.get(id=promotion_id)


def users():
    """requester (submit only), reviewer and second reviewer (approve): a team, so the policy is on."""
    requester = user_create(username="requester", password="long-enough-pw")
    reviewer = user_create(username="reviewer", password="long-enough-pw", can_approve=True)
    other = user_create(username="other", password="long-enough-pw", can_approve=True)
    return requester, reviewer, other


def client_for(username: str) -> Client:
    return Client(headers={"Authorization": f"Bearer {token_create(username=username)[1]}"},
                  raise_request_exception=False)


def send(client: Client, path: str, body: dict | None = None):
    return client.post(path, data=json.dumps(body or {}), content_type="application/json")


def error(response, status: int, code: str) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body
    return body["error"]["message"]
