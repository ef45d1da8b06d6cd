"""The scorer output contract against hostile output and rewards training would refuse: JSON nested
200000 levels deep is `scorer_output_invalid` (never a RecursionError), and so is a finite reward
beyond 2**53 in size, the bound GRPO training applies (core.contracts.groups.reward_in_range)."""

import pytest

from evaluations.sandbox import ScorerError, parse_reward


def test_deeply_nested_output_is_invalid_not_a_recursion_error():
    for text in ("[" * 200_000 + "]" * 200_000, '{"reward": ' + "[" * 100_000 + "]" * 100_000 + "}"):
        with pytest.raises(ScorerError) as info:
            parse_reward(text.encode())
        assert info.value.code == "scorer_output_invalid"


@pytest.mark.parametrize("text", ["1e300", "-1e17", '{"reward": 1e300}', '{"score": -10000000000000000000}',
                                  str(2**60), '{"value": 1' + "0" * 5000 + "}"])
def test_a_reward_beyond_2_53_in_size_is_invalid(text):
    with pytest.raises(ScorerError) as info:
        parse_reward(text.encode())
    assert info.value.code == "scorer_output_invalid"
    if "0" * 5000 not in text:  # that one is not even a Python-readable JSON number
        assert "at most 2**53 (about 9.0e15) in size" in info.value.message


@pytest.mark.parametrize("text, reward", [(str(2**53), 2.0**53), ("-9007199254740992", -(2.0**53)),
                                          ('{"reward": 9e15}', 9e15)])
def test_the_bound_itself_is_accepted(text, reward):
    assert parse_reward(text.encode()) == reward
