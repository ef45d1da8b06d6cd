"""Where two JSON values first differ, as replay and verify report it: a field added or removed is named
by its own path, not its parent's (QA: an observation that gained a field was reported as its whole
object, twice the same 80-character prefix)."""

from __future__ import annotations

from openenv.json_compare import first_difference
from openenv.replay import _compare

RECORDED = {"observation": {"metadata": {}, "input_text": "Guess my digit", "guesses_left": 3}, "done": False}


def test_a_changed_value_is_named_by_its_path():
    now = {**RECORDED, "observation": {**RECORDED["observation"], "guesses_left": 2}}
    assert first_difference(now, RECORDED, "reset") == "reset.observation.guesses_left"
    assert first_difference([1, {"a": [2, 3]}], [1, {"a": [2, 4]}], "x") == "x[1].a[1]"


def test_an_added_or_removed_field_is_named_by_its_own_path():
    added = {**RECORDED, "observation": {**RECORDED["observation"], "secret_hint": "not in schema"}}
    assert first_difference(added, RECORDED, "reset") == "reset.observation.secret_hint"
    removed = {**RECORDED, "observation": {"metadata": {}, "input_text": "Guess my digit"}}
    assert first_difference(removed, RECORDED, "reset") == "reset.observation.guesses_left"
    reordered = {"done": False, "observation": RECORDED["observation"]}
    assert first_difference(reordered, RECORDED, "reset") == "reset"  # only the order: the object itself


def test_the_replay_divergence_says_which_side_lacks_the_field():
    group, candidate = {"group_index": 0}, {"candidate_index": 1}
    added = {**RECORDED, "observation": {**RECORDED["observation"], "secret_hint": "not in schema"}}
    divergence = _compare(group, candidate, None, "reset_observation", RECORDED, added)
    assert divergence["field"] == "reset_observation.observation.secret_hint"
    assert (divergence["expected"], divergence["actual"], divergence["absent"]) == (None, "not in schema", "expected")
    changed = _compare(group, candidate, 2, "result", {"reward": 1.0}, {"reward": None})
    assert changed["field"] == "result.reward" and changed["actual"] is None and "absent" not in changed
