"""The dataset split (spec §1.4) against hand-built corpora: identities, components, the small-N
rules, determinism, and the config checks. Pure: no database."""

from __future__ import annotations

import hashlib
import json
import random

import pytest

from evaluations.datasets import split as s
from evaluations.datasets.formats import FormatError, parse_rows


def _cfg(seed="0", train=80, validation=10):
    return s.parse_split_config({"seed": seed, "train_percent": train, "validation_percent": validation})


def _split(rows, **kw):
    return s.compute_split(s.row_identities(rows), _cfg(**kw))


def test_identities_are_the_digests_of_sorted_canonical_json():
    row = {"b": "Hello   World ", "a": [1, {"z": "X", "y": 2}]}
    exact = "sha256:" + hashlib.sha256(b'{"a":[1,{"y":2,"z":"X"}],"b":"Hello   World "}').hexdigest()
    normalized = "sha256:" + hashlib.sha256(b'{"a":[1,{"y":2,"z":"x"}],"b":"hello world"}').hexdigest()
    assert s.exact_identity(row) == exact
    assert s.normalized_identity(row) == normalized
    assert s.normalized_identity({"b": "hello\tworld", "a": [1, {"y": 2, "z": "x"}]}) == normalized
    ids = s.row_identities([row, {"q": 1}])
    corpus, norm = s.corpus_digests(ids)
    expected = "sha256:" + hashlib.sha256(json.dumps([exact, s.exact_identity({"q": 1})],
                                                     separators=(",", ":")).encode()).hexdigest()
    assert corpus == expected and norm != corpus
    assert [i.row for i in ids] == [1, 2]


def test_components_join_by_normalized_identity_group_and_session_ids():
    rows = [
        {"q": "What is 2+2?"},                                   # 0 ─ normalized twin of 1
        {"q": "  what IS 2+2? "},                                # 1
        {"q": "a", "group_id": "g1"},                            # 2 ─ group g1 (root) with 3 (metadata)
        {"q": "b", "metadata": {"group_id": "g1", "session_id": "s9"}},  # 3 ─ and session s9 with 4 and 5
        {"q": "c", "provenance": {"session_id": "s9"}, "extra": {"group_id": ""}},  # 4
        {"q": "d", "extra": {"session_id": "s9"}},               # 5 ─ session s9 (extra)
        {"q": "e", "group_id": "  "},                            # 6 ─ blank ids join nothing
        {"q": "f", "session_id": ""},                            # 7
        {"q": "g", "session_id": "g1"},                          # 8 ─ a session id never joins a group id
        {"q": "h", "group_id": 7}, {"q": "i", "metadata": {"group_id": "7"}},  # 9, 10 ─ 7 and "7" are one id
    ]
    comps = s.components(s.row_identities(rows))
    assert comps == [[0, 1], [2, 3, 4, 5], [6], [7], [8], [9, 10]]
    ids = s.row_identities(rows)
    assert ids[4].session_ids == ("s9",) and ids[4].group_ids == ()
    assert s.count_distinct(ids, "group_id") == 2 and s.count_distinct(ids, "session_id") == 2
    split = _split(rows)
    for members in comps:  # a component is never divided
        assert len({split.partitions[i] for i in members}) == 1


def test_component_identity_does_not_depend_on_row_order():
    rows = [{"q": f"question {i}", "group_id": f"g{i // 3}"} for i in range(60)]
    shuffled = rows[:]
    random.Random(3).shuffle(shuffled)
    first, second = _split(rows, seed="11"), _split(shuffled, seed="11")
    by_row = {json.dumps(r, sort_keys=True): p for r, p in zip(rows, first.partitions, strict=True)}
    assert all(by_row[json.dumps(r, sort_keys=True)] == p for r, p in zip(shuffled, second.partitions, strict=True))


def test_one_component_goes_to_train_for_every_seed():
    for seed in range(40):
        split = _split([{"q": "only"}, {"q": "ONLY "}], seed=str(seed))
        assert split.partitions == ["train", "train"] and split.num_components == 1


def test_two_components_fill_train_and_holdout_for_every_seed():
    for seed in range(60):
        split = _split([{"q": "a"}, {"q": "b"}], seed=str(seed), train=50, validation=40)
        assert sorted(split.partitions) == ["holdout", "train"], seed


def test_three_components_fill_all_three_partitions_for_every_seed():
    for seed in range(60):
        split = _split([{"q": "a"}, {"q": "b"}, {"q": "c"}], seed=str(seed), train=98, validation=1)
        assert sorted(split.partitions) == ["holdout", "train", "validation"], seed
        assert split.component_counts == {"train": 1, "validation": 1, "holdout": 1}


def test_three_components_without_validation_percent_leave_validation_empty():
    for seed in range(30):
        split = _split([{"q": "a"}, {"q": "b"}, {"q": "c"}], seed=str(seed), train=90, validation=0)
        assert split.counts["validation"] == 0 and split.counts["train"] >= 1 and split.counts["holdout"] >= 1


def test_small_n_repair_moves_whole_components():
    rows = [{"q": "a", "group_id": "big"}, {"q": "b", "group_id": "big"}, {"q": "c", "group_id": "big"}, {"q": "z"}]
    for seed in range(30):
        split = _split(rows, seed=str(seed))
        assert split.num_components == 2
        assert len(set(split.partitions[:3])) == 1 and split.partitions[3] != split.partitions[0]


def test_the_same_seed_gives_the_same_split_and_another_seed_moves_rows():
    rows = [{"q": f"question {i}", "answer": str(i)} for i in range(200)]
    a, b, c = _split(rows, seed="7"), _split(rows, seed="7"), _split(rows, seed="8")
    assert a.partitions == b.partitions
    moved = sum(x != y for x, y in zip(a.partitions, c.partitions, strict=True))
    assert moved >= 1
    assert 120 <= a.counts["train"] <= 190 and a.counts["validation"] >= 5 and a.counts["holdout"] >= 5


def test_the_draw_is_the_documented_hash():
    config = _cfg(seed="5")
    digest = hashlib.sha256(b'{"component":"sha256:abc","schema":"kiln.dataset-split.v1","seed":"5"}').hexdigest()
    assert s.component_draw(config, "sha256:abc") == int(digest[:16], 16) / 2**64


@pytest.mark.parametrize("body, field", [
    ({"train_percent": 0}, "train_percent"),
    ({"train_percent": -5}, "train_percent"),
    ({"train_percent": 101}, "train_percent"),
    ({"train_percent": 90, "validation_percent": 10}, "validation_percent"),
    ({"train_percent": 60, "validation_percent": 50}, "validation_percent"),
    ({"validation_percent": -1}, "validation_percent"),
    ({"train_percent": True}, "train_percent"),
    ({"train_percent": "80"}, "train_percent"),
    ({"train_percent": float("nan")}, "train_percent"),
    ({"seed": "-1"}, "seed"),
    ({"seed": "abc"}, "seed"),
    ({"seed": "1.5"}, "seed"),
    ({"seed": str(2**64)}, "seed"),
    ({"seed": None}, "seed"),
    ({"sead": "9"}, "sead"),  # a misspelt setting is refused, not re-split with the defaults
])
def test_bad_split_configs_name_the_field(body, field):
    with pytest.raises(s.SplitError) as err:
        s.parse_split_config(body)
    assert err.value.field == field


def test_config_defaults_and_normalization():
    assert s.parse_split_config(None).to_dict() == {"seed": "0", "train_percent": 80, "validation_percent": 10}
    assert s.parse_split_config({"seed": 42, "train_percent": 70.0}).to_dict() == \
        {"seed": "42", "train_percent": 70, "validation_percent": 10}
    assert s.parse_split_config({"seed": str(2**64 - 1)}).seed == str(2**64 - 1)
    assert s.parse_split_config({"seed": "007"}).seed == "7"


def test_split_manifest_lists_every_row():
    rows = [{"q": "a", "metadata": {"group_id": "g"}}, {"q": "b", "session_id": "s", "group_id": "g"}, {"q": "c"}]
    ids = s.row_identities(rows)
    split = s.compute_split(ids, _cfg())
    manifest = s.split_manifest(dataset="d", identities=ids, split=split)
    assert manifest["config"] == {"seed": "0", "train_percent": 80, "validation_percent": 10}
    assert manifest["counts"] == split.counts and sum(split.counts.values()) == 3
    assert manifest["rows"][0] == {"row": 1, "exact_identity": ids[0].exact, "normalized_identity": ids[0].normalized,
                                   "partition": split.partitions[0], "group_id": "g"}
    assert manifest["rows"][1]["session_id"] == "s" and "group_id" not in manifest["rows"][2]


def test_formats_name_the_file_line():
    group = {"messages": [{"role": "user", "content": "2+3?"}], "completions": [{"text": "5", "reward": 1}]}
    data = (json.dumps(group) + "\n\n" + json.dumps({**group, "completions": [{"text": "5"}]}) + "\n").encode()
    with pytest.raises(FormatError) as err:
        parse_rows(data, "grpo_groups")
    assert err.value.line == 3 and "completions[0].reward" in err.value.message
    rows, lines = parse_rows(b'{"a": 1}\n\n  \n{"b": 2}\n', "raw")
    assert rows == [{"a": 1}, {"b": 2}] and lines == [1, 4]
    for bad, fmt, line in [(b'{"a": 1}\n[1]\n', "raw", 2), (b'{"a": NaN}\n', "raw", 1), (b'{"a": \n', "raw", 1),
                           (b'{"messages": [{"role": "user", "content": "hi"}]}\n', "sft_chat", 1),
                           (b'{"messages": "hi"}\n', "sft_chat", 1), (b'{"a": 18446744073709551616}', "raw", 1)]:
        with pytest.raises(FormatError) as err:
            parse_rows(bad, fmt)
        assert err.value.line == line and err.value.message.startswith(f"file line {line}:")
    with pytest.raises(FormatError):
        parse_rows(b"\n\n", "raw")
