"""The adapter page's forms through the test client: "Make active (request a promotion)" goes through
the service behind POST /v1/adapters/{name}/activate (pending in a team, approved and applied after its
canary when no approval is required; a rollback too), and "Delete" through adapters.services.adapter_delete
(refusals shown on the page with their stable code and status, nothing deleted; force deletes a parent).
A viewer sees no form and a forged POST is refused; a POST without a CSRF token is refused."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.test import Client

from adapters.models import Adapter, AdapterTransition, Promotion
from adapters.selectors import adapter_active
from adapters.services import adapter_publish, adapter_reserve
from tests.promotions.support import policy
from tests.support.canary import drain_activations
from tests.ui.page_text import block_of, html_of, text_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def home(settings, tmp_path):
    """A private KILN_HOME for published adapter folders."""
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"


def _publish(home, name: str, *, user=None, base: str = "", loaded: bool = False) -> Adapter:
    folder = home / "adapters" / name
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights of " + name.encode())
    (folder / "adapter_config.json").write_text('{"r": 4}')
    adapter_reserve(name=name, base_adapter=base, actor=user)
    return adapter_publish(name=name, path=folder, content_sha256="sha256:" + name.encode().hex().ljust(64, "0"),
                           base_model_sha256="", loaded=loaded, actor=user, reason="published by the test")


@pytest.fixture
def registry(home, operator):
    """r1 serving, r2 available, both the operator's."""
    _publish(home, "r1", user=operator, loaded=True)
    _publish(home, "r2", user=operator)
    return home


_html, _text, _block = html_of, text_of, block_of


# ---- who sees the forms ------------------------------------------------------------------------

def test_the_forms_show_for_a_permitted_user_and_not_for_a_viewer(registry, operator_client, viewer_client):
    page = _html(operator_client.get("/ui/adapters/r2/"))
    assert '<form method="post" action="/ui/adapters/r2/activate/" id="activate-form">' in page
    assert '<form method="post" action="/ui/adapters/r2/delete/" id="delete-form">' in page
    assert '<textarea id="activate-reason" name="reason" rows="2" required' in page
    assert 'type="checkbox" name="force" id="delete-force"' in page
    assert "in place of\n        <span class=\"mono\">r1</span>" in page
    assert 'id="adapter-actions-needs-permission"' not in page
    # The active adapter is not offered again; it may still be asked to be deleted (the service refuses).
    active = _html(operator_client.get("/ui/adapters/r1/"))
    assert 'id="activate-form"' not in active and 'id="delete-form"' in active
    # Nor a quarantined one: its promotion could only fail its canary (QA); its alarm card says how to load it
    from adapters.models import Adapter

    Adapter.objects.filter(name="r2").update(quarantined=True)
    quarantined = _html(operator_client.get("/ui/adapters/r2/"))
    assert 'id="activate-form"' not in quarantined and 'id="adapter-quarantined"' in quarantined
    Adapter.objects.filter(name="r2").update(quarantined=False)

    viewer = _html(viewer_client.get("/ui/adapters/r2/"))
    assert 'id="activate-form"' not in viewer and 'id="delete-form"' not in viewer
    # Each form carries its CSRF token (the base layout's own form has one on both pages).
    assert page.count('name="csrfmiddlewaretoken"') == viewer.count('name="csrfmiddlewaretoken"') + 2
    assert "Users with the jobs.submit_job permission can request a promotion" in _block(
        viewer, "adapter-actions-needs-permission")


def test_another_users_adapter_shows_why_it_cannot_be_deleted(home, operator, operator_client):
    from core.accounts.services import user_create

    owner = user_create(username="owner", password="long-enough-pw")
    _publish(home, "theirs", user=owner)
    page = _html(operator_client.get("/ui/adapters/theirs/"))
    assert 'id="activate-form"' in page and 'id="delete-button"' not in page
    refused = _block(page, "delete-refused")
    assert refused.startswith("Only its owner or a user with the jobs.delete_others_jobs permission may delete it")
    assert "adapter_delete_forbidden" in refused and "ask its owner" in refused
    response = operator_client.post("/ui/adapters/theirs/delete/", {"reason": "mine now"})
    assert response.status_code == 403 and _text(_html(response), "delete-error-code") == "adapter_delete_forbidden"
    assert Adapter.objects.filter(name="theirs").exists()


# ---- make active ---------------------------------------------------------------------------------

def test_activate_in_a_team_creates_a_pending_promotion_and_redirects_to_it(registry, operator, operator_client,
                                                                            viewer):
    response = operator_client.post("/ui/adapters/r2/activate/", {"reason": "round two is better"})
    promotion = Promotion.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/ui/promotions/{promotion.id}/"
    assert (promotion.state, promotion.candidate, promotion.incumbent) == ("pending", "r2", "r1")
    assert promotion.request_reason == "round two is better" and promotion.requested_by == operator
    assert adapter_active().name == "r1"  # a reviewer decides first
    page = _html(operator_client.get(response["Location"]))
    assert f"Requested promotion {promotion.id} of r2: it is pending until a reviewer approves it." in page


def test_activate_needs_a_reason_and_shows_the_services_refusal(registry, operator_client):
    response = operator_client.post("/ui/adapters/r2/activate/", {"reason": "   "})
    html = _html(response)
    assert response.status_code == 400 and _text(html, "activate-error-code") == "reason_required"
    assert "(HTTP 400)" in html
    # The service's own rule: a reason over 2000 characters (validation_error, 422), shown with its hint.
    response = operator_client.post("/ui/adapters/r2/activate/", {"reason": "x" * 2001})
    html = _html(response)
    assert response.status_code == 422 and _text(html, "activate-error-code") == "validation_error"
    assert "at most 2000 characters" in _text(html, "activate-error-message")
    # The active adapter, posted anyway: adapter_active (409) from the service.
    response = operator_client.post("/ui/adapters/r1/activate/", {"reason": "again"})
    assert response.status_code == 409 and _text(_html(response), "activate-error-code") == "adapter_active"
    assert Promotion.objects.count() == 0


def test_activate_alone_is_approved_then_applied_and_rolls_back(registry, operator_client, canary_worker):
    response = operator_client.post("/ui/adapters/r2/activate/", {"reason": "roll forward"})
    promotion = Promotion.objects.get()
    assert response["Location"] == f"/ui/promotions/{promotion.id}/" and promotion.state == "approved"
    drain_activations()
    promotion.refresh_from_db()
    assert promotion.state == "applied" and adapter_active().name == "r2"
    # The rollback to r1 from r1's page, recorded the same way.
    response = operator_client.post("/ui/adapters/r1/activate/", {"reason": "r2 regressed"})
    back = Promotion.objects.get(candidate="r1")
    assert response["Location"] == f"/ui/promotions/{back.id}/" and back.incumbent == "r2"
    drain_activations()
    assert Promotion.objects.get(id=back.id).state == "applied" and adapter_active().name == "r1"


def test_the_policy_setting_decides_when_set(registry, operator_client, settings):
    policy(settings, require_approval=True)  # alone, yet approval is required
    operator_client.post("/ui/adapters/r2/activate/", {"reason": "needs a reviewer"})
    assert Promotion.objects.get().state == "pending" and adapter_active().name == "r1"


# ---- delete ------------------------------------------------------------------------------------

def test_delete_removes_an_available_adapter_and_redirects(registry, operator, operator_client):
    folder = registry / "adapters" / "r2"
    assert folder.is_dir()
    response = operator_client.post("/ui/adapters/r2/delete/", {"reason": "superseded"}, follow=True)
    assert response.redirect_chain == [("/ui/adapters/", 302)]
    assert "Deleted adapter r2 and its files" in _html(response)
    assert not Adapter.objects.filter(name="r2").exists() and not folder.exists()
    row = AdapterTransition.objects.filter(adapter="r2").last()
    assert (row.to_state, row.reason, row.actor) == ("deleted", "superseded", operator)
    assert Adapter.objects.filter(name="r1").exists()


def test_delete_of_the_active_adapter_is_refused_on_the_page(registry, operator_client):
    response = operator_client.post("/ui/adapters/r1/delete/", {"reason": "<script>alert(1)</script>"})
    html = _html(response)
    assert response.status_code == 409 and _text(html, "delete-error-code") == "adapter_active"
    assert "(HTTP 409)" in html and "unload it before deleting it" in _text(html, "delete-error-message")
    assert "&lt;script&gt;alert(1)&lt;/script&gt;</textarea>" in html and "<script>alert(1)" not in html
    assert Adapter.objects.get(name="r1").loaded and (registry / "adapters" / "r1").is_dir()
    assert not AdapterTransition.objects.filter(adapter="r1", to_state="deleted").exists()


def test_delete_of_a_parent_needs_the_checkbox(home, operator, operator_client):
    _publish(home, "parent", user=operator)
    _publish(home, "child", user=operator, base="parent")
    response = operator_client.post("/ui/adapters/parent/delete/", {"reason": "old"})
    html = _html(response)
    assert response.status_code == 409 and _text(html, "delete-error-code") == "adapter_has_descendants"
    assert 'type="checkbox" name="force" id="delete-force">' in html  # left unticked
    assert Adapter.objects.filter(name="parent").exists()
    response = operator_client.post("/ui/adapters/parent/delete/", {"reason": "old", "force": "on"})
    assert response.status_code == 302 and response["Location"] == "/ui/adapters/"
    assert list(Adapter.objects.values_list("name", flat=True)) == ["child"]


# ---- refusals ----------------------------------------------------------------------------------

def test_a_viewers_forged_posts_are_refused(registry, viewer_client):
    response = viewer_client.post("/ui/adapters/r2/activate/", {"reason": "let me"})
    assert response.status_code == 403
    assert "You lack the submit_job permission, so you cannot request promotions." in _text(_html(response),
                                                                                            "forbidden")
    response = viewer_client.post("/ui/adapters/r2/delete/", {"reason": "let me", "force": "on"})
    assert response.status_code == 403
    assert "so you cannot delete adapters" in _text(_html(response), "forbidden")
    assert Promotion.objects.count() == 0 and set(Adapter.objects.values_list("name", flat=True)) == {"r1", "r2"}
    assert not AdapterTransition.objects.filter(to_state="deleted").exists()


def test_the_forms_need_post_login_and_csrf(registry, operator):
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    assert strict.post("/ui/adapters/r2/delete/", {"reason": "no token"}).status_code == 403
    assert strict.post("/ui/adapters/r2/activate/", {"reason": "no token"}).status_code == 403
    assert Promotion.objects.count() == 0 and Adapter.objects.filter(name="r2").exists()
    # A GET of a form's address is no action: it goes back to the adapter's page (form_actions middleware).
    for action in ("delete", "activate"):
        response = strict.get(f"/ui/adapters/r2/{action}/")
        assert response.status_code == 302 and response["Location"] == "/ui/adapters/r2/"
    anonymous = Client().post("/ui/adapters/r2/delete/", {})
    assert anonymous.status_code == 302 and "/login" in anonymous["Location"]
    assert Client().post("/ui/adapters/nope/delete/", {}).status_code == 302
    logged_in = Client()
    logged_in.force_login(operator)
    assert logged_in.post("/ui/adapters/nope/delete/", {}).status_code == 404
    assert Adapter.objects.filter(name="r2").exists()
