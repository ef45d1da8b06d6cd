"""The /ui/ delete forms of datasets and suites follow the API's rule: another user's object shows its
Delete form disabled with why (who may, and the jobs.delete_others_jobs permission), a POST anyway is
refused 403 with the stable code and deletes nothing; the owner and a holder of the permission delete."""

from __future__ import annotations

import re

import pytest

from evaluations.models import EvalDataset, EvalSuite
from tests.accounts.support import make_dataset, make_suite

pytestmark = pytest.mark.django_db

PAGES = [("datasets", "d4", "dataset", "dataset_delete_forbidden", EvalDataset, make_dataset),
         ("suites", "arith", "suite", "suite_delete_forbidden", EvalSuite, make_suite)]


def _delete_fieldset(html: str, kind: str) -> str:
    form = html[html.index(f'id="{kind}-delete-form"'):]
    return form[:form.index("</form>")]


@pytest.mark.parametrize("section, name, kind, code, model, make", PAGES, ids=["dataset", "suite"])
def test_another_users_object_cannot_be_deleted_from_its_page(home, api, browser, section, name, kind, code, model,
                                                              make):
    make(api("admin"), name)
    page = browser("bob").get(f"/ui/evaluations/{section}/{name}/").content.decode()
    assert re.search(r"<fieldset[^>]*\bdisabled\b", _delete_fieldset(page, kind))
    assert 'id="delete-refused"' in page and "jobs.delete_others_jobs" in page and code in page
    response = browser("bob").post(f"/ui/evaluations/{section}/{name}/delete/", {"confirm": "on"})
    html = response.content.decode()
    assert response.status_code == 403 and 'id="delete-error"' in html and code in html
    assert "jobs.delete_others_jobs" in html
    assert model.objects.filter(name=name).exists()


@pytest.mark.parametrize("section, name, kind, code, model, make", PAGES, ids=["dataset", "suite"])
@pytest.mark.parametrize("who", ["bob", "carol"])
def test_the_owner_or_a_delete_others_holder_deletes_from_the_page(home, api, browser, who, section, name, kind,
                                                                   code, model, make):
    make(api("bob" if who == "bob" else "admin"), name)
    page = browser(who).get(f"/ui/evaluations/{section}/{name}/").content.decode()
    assert not re.search(r"<fieldset[^>]*\bdisabled\b", _delete_fieldset(page, kind))
    assert 'id="delete-refused"' not in page
    response = browser(who).post(f"/ui/evaluations/{section}/{name}/delete/", {"confirm": "on"})
    assert response.status_code == 302 and not model.objects.exists()
