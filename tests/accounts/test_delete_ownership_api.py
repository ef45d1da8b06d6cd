"""DELETE on /v1/adapters, /v1/eval/datasets and /v1/eval/suites follows the jobs' rule: the owner (an
adapter's training-job submitter or uploader; a dataset's or suite's creator) or a holder of
jobs.delete_others_jobs deletes; anyone else gets 403 with a stable code and nothing is deleted.
Anonymous loopback access (when allowed) may do what a user may, and what the one user may where no
team governs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from django.test import Client

from adapters.models import Adapter, AdapterTransition
from evaluations.models import EvalDataset, EvalSuite
from tests.accounts.support import (
    make_dataset,
    make_suite,
    make_trained_adapter,
    make_uploaded_adapter,
    refused,
)

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("make", [make_trained_adapter, make_uploaded_adapter], ids=["trained", "uploaded"])
def test_only_the_owner_or_a_delete_others_holder_deletes_an_adapter(home, users, api, make):
    make(home, "fzlr-4243", users["admin"])
    error = refused(api("bob").delete("/v1/adapters/fzlr-4243?reason=x"), "adapter_delete_forbidden")
    assert "fzlr-4243" in error["message"]
    assert Adapter.objects.filter(name="fzlr-4243").exists() and (home / "adapters" / "fzlr-4243").is_dir()
    assert not AdapterTransition.objects.filter(adapter="fzlr-4243", to_state="deleted").exists()
    assert api("carol").delete("/v1/adapters/fzlr-4243?reason=x").json()["status"] == "deleted"
    assert not Adapter.objects.exists() and not (home / "adapters" / "fzlr-4243").exists()


@pytest.mark.parametrize("make", [make_trained_adapter, make_uploaded_adapter], ids=["trained", "uploaded"])
def test_a_plain_user_deletes_their_own_adapter(home, users, api, make):
    make(home, "mine", users["bob"])
    assert api("bob").delete("/v1/adapters/mine").json()["status"] == "deleted"


def test_the_latest_owner_of_a_reused_adapter_name_counts(home, users, api):
    """Transitions outlive a deleted adapter's row: the name's current row's creator owns it."""
    make_uploaded_adapter(home, "again", users["bob"])
    assert api("bob").delete("/v1/adapters/again").status_code == 200
    make_uploaded_adapter(home, "again", users["admin"])
    refused(api("bob").delete("/v1/adapters/again"), "adapter_delete_forbidden")


def test_refused_before_the_state_checks(home, users, api):
    """A refused caller learns the refusal, not the adapter's state (active: 409 for the owner)."""
    make_trained_adapter(home, "live", users["admin"])
    Adapter.objects.filter(name="live").update(loaded=True)
    refused(api("bob").delete("/v1/adapters/live"), "adapter_delete_forbidden")
    assert api("admin").delete("/v1/adapters/live").json()["error"]["code"] == "adapter_active"


def test_only_the_creator_or_a_delete_others_holder_deletes_a_dataset(home, users, api):
    make_dataset(api("admin"), "d4")
    folder = home / "adapters" / ".eval" / "datasets" / "d4"
    refused(api("bob").delete("/v1/eval/datasets/d4"), "dataset_delete_forbidden")
    assert EvalDataset.objects.filter(name="d4").exists() and (folder / "data.jsonl").is_file()
    assert api("carol").delete("/v1/eval/datasets/d4").json() == {"name": "d4", "status": "deleted"}
    assert not EvalDataset.objects.exists() and not folder.exists()
    make_dataset(api("bob"), "own")
    assert api("bob").delete("/v1/eval/datasets/own").json()["status"] == "deleted"


def test_only_the_creator_or_a_delete_others_holder_deletes_a_suite(home, users, api):
    make_suite(api("admin"), "arith")
    path = home / "adapters" / ".eval" / "suites" / "arith.json"
    refused(api("bob").delete("/v1/eval/suites/arith"), "suite_delete_forbidden")
    assert EvalSuite.objects.filter(name="arith").exists() and path.is_file()
    assert api("carol").delete("/v1/eval/suites/arith").json() == {"name": "arith", "status": "deleted"}
    assert not EvalSuite.objects.exists() and not path.exists()
    make_suite(api("bob"), "own")
    assert api("bob").delete("/v1/eval/suites/own").json()["status"] == "deleted"


def test_anonymous_loopback_access_deletes_others_work_only_where_no_team_governs(home, users, api, settings):
    """With one active user the loopback caller is that user's programs and deletes anything; once a
    team exists it may not delete others' work (it deleted a suite its owner's teammate could not)."""
    settings.KILN = replace(settings.KILN, allow_anonymous_api=True)
    make_trained_adapter(home, "a1", users["admin"])
    make_dataset(api("admin"), "d4")
    make_suite(api("admin"), "arith")
    anonymous = Client(REMOTE_ADDR="127.0.0.1")
    paths = ("/v1/adapters/a1", "/v1/eval/datasets/d4", "/v1/eval/suites/arith")
    codes = ("adapter_delete_forbidden", "dataset_delete_forbidden", "suite_delete_forbidden")
    for path, code in zip(paths, codes, strict=True):
        refused(anonymous.delete(path), code)
    assert Adapter.objects.exists() and EvalDataset.objects.exists() and EvalSuite.objects.exists()
    users["bob"].is_active = users["carol"].is_active = False  # admin alone: no team
    users["bob"].save()
    users["carol"].save()
    for path in paths:
        response = anonymous.delete(path)
        assert response.status_code == 200 and response.json()["status"] == "deleted", (path, response.content)
    assert not Adapter.objects.exists() and not EvalDataset.objects.exists() and not EvalSuite.objects.exists()


def test_the_services_refuse_a_call_without_a_user_on_an_owned_object(home, users, api):
    """The rule lives in the services, so every caller (API, pages, CLI through the API) gets it."""
    from core.errors import KilnError
    from evaluations.dataset_services import dataset_delete
    from evaluations.suite_services import suite_delete

    make_dataset(api("admin"), "d4")
    make_suite(api("admin"), "arith")
    with pytest.raises(KilnError) as dataset_refusal:
        dataset_delete(dataset=EvalDataset.objects.get(name="d4"), user=users["bob"])
    with pytest.raises(KilnError) as suite_refusal:
        suite_delete(suite=EvalSuite.objects.get(name="arith"), user=None)
    assert (dataset_refusal.value.code, suite_refusal.value.code) == ("dataset_delete_forbidden",
                                                                      "suite_delete_forbidden")
    assert EvalDataset.objects.exists() and EvalSuite.objects.exists()


def test_replacing_or_resplitting_another_users_object_follows_the_same_rule(home, users, api):
    """Replacing a suite (force) deletes the old one, and a re-split changes what a dataset's suites
    and gates were drawn from: both took anyone's before."""
    import json

    make_suite(api("admin"), "arith")
    replaced = api("bob").post("/v1/eval/suites?force=true", data=json.dumps({**_suite_body("arith"),
                                                                            "description": "bob's"}),
                               content_type="application/json")
    refused(replaced, "suite_replace_forbidden")
    assert EvalSuite.objects.get(name="arith").created_by.username == "admin"
    ok = api("carol").post("/v1/eval/suites?force=true", data=json.dumps(_suite_body("arith")),
                           content_type="application/json")
    assert ok.status_code == 200, ok.content

    make_dataset(api("admin"), "d4")
    before = EvalDataset.objects.get(name="d4").split_config
    split = api("bob").put("/v1/eval/datasets/d4/split", data=json.dumps({"seed": 99}),
                           content_type="application/json")
    refused(split, "dataset_split_forbidden")
    assert EvalDataset.objects.get(name="d4").split_config == before
    assert api("admin").put("/v1/eval/datasets/d4/split", data=json.dumps({"seed": 99}),
                            content_type="application/json").status_code == 200


def _suite_body(name: str) -> dict:
    from tests.accounts.support import SUITE

    return {**SUITE, "name": name}
