"""Warm-up episodes that teach the tiny model which values an action schema allows (its third phase).

Why: after the second phase (`gpu_runtime.tiny_schema_tasks`) the demo model copies field names from
any schema, but not the values an enum lists: it drew enum members from the same few dozen words it
used for free strings, so it answered `{"move": "score"}` to rock-paper-scissors and
`{"action": "stake"}` to blackjack, and every such episode ended at its first action. In a schema
with two fields of different types it also wrote each field's value by position (`{"side": 13,
"quantity": "one two"}`). This phase draws the same kind of episodes with:

- enum members that cannot be recalled: runs of the tokenizer's letter-only pieces about half the
  time, otherwise everyday words, both words of a list of its own and the very words the second
  phase wrote for free strings (a model taught that members are never those would refuse `red` in a
  paint shop); about one member in ten is held out by hash and never trained;
- enums and bounded integers most of the time, with two or three fields of different types more
  often, so a value has to be read from its own field's schema;
- bounded integers whose ranges start where real environments start them (0 and 1 above all),
  reach up to 100, and whose values sit at the bounds more often than a uniform draw would put them.

Pure Python; imports no Django and no torch.
"""

from __future__ import annotations

import hashlib

from gpu_runtime.tiny_schema_tasks import KEY_WORDS, STRING_WORDS, SchemaEpisodes, SecondPhaseSampler

SECOND_PHASE_WORDS = tuple(word for word in STRING_WORDS + KEY_WORDS if " " not in word)

# Enum members that are everyday words besides the second phase's (STRING_WORDS, KEY_WORDS); the words
# real environments use most (rock, paper, hit, stand, heads, buy, ...) are left out so that a probe
# with them measures copying.
MEMBER_WORDS = (
    "small", "medium", "large", "low", "high", "on", "off", "true_value", "none", "all", "first", "last",
    "cat", "dog", "bird", "fish", "tree", "flower", "house", "car", "boat", "train", "plane", "horse",
    "pink", "purple", "orange", "black", "white", "gray", "brown", "gold", "silver", "copper",
    "spring", "summer", "autumn", "winter", "morning", "evening", "night", "noon",
    "add", "remove", "keep", "drop", "raise", "fold", "call_bet", "check", "wait", "skip", "retry",
    "forward", "backward", "inside", "outside", "top", "bottom", "middle", "center",
    "easy", "hard", "normal", "quick", "careful", "bold", "calm", "angry", "happy", "sad",
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
)
# Field kinds of this phase: enums and bounded integers most of the time, the others kept in practice.
FIELD_KINDS = ("enum", "enum", "enum", "enum", "int_bounded", "int_bounded", "int_bounded", "string", "int",
               "number", "boolean")
# Common starts of an integer range in real environments (0-based and 1-based indices above all).
RANGE_LOWS = (0, 0, 0, 1, 1, 1, -1, -2, -3, -5, 2, 5, 10)
RANGE_WIDTHS = (1, 2, 2, 3, 3, 4, 5, 6, 8, 9, 10, 12, 15, 20, 31, 50, 99, 100)
EDGE_SHARE = 0.3  # of bounded-integer values: the minimum or the maximum itself


def is_held_out_member(member: str) -> bool:
    """About one enum member in ten never appears in this phase (a stable split by hash)."""
    return hashlib.sha256(f"member:{member}".encode()).digest()[0] % 10 == 0


class ValueEpisodes(SchemaEpisodes):
    """`SchemaEpisodes` whose enums list members that must be copied and whose integer ranges vary widely."""

    field_kinds = FIELD_KINDS
    field_counts = (1, 1, 2, 2, 2, 3)
    members_held_out = False  # set per schema: a held-out schema lists only held-out members

    def schema(self, *, held_out: bool = False) -> tuple[dict, list[str], dict]:
        self.members_held_out = held_out
        return super().schema(held_out=held_out)

    def member(self) -> str:
        rng = self.rng
        while True:
            roll = rng.random()
            if roll < 0.3:
                member = rng.choice(MEMBER_WORDS)
            elif roll < 0.55:
                member = rng.choice(SECOND_PHASE_WORDS)
            else:
                member = "".join(rng.choice(self.pieces) for _ in range(rng.choice((1, 1, 2, 2, 3))))
            if len(member) <= 16 and is_held_out_member(member) == self.members_held_out:
                return member

    def enum_members(self) -> list[str]:
        members: list[str] = []
        count = self.rng.choice((2, 2, 3, 3, 4, 4, 5, 6))
        while len(members) < count:
            member = self.member()
            if member not in members:
                members.append(member)
        return sorted(members) if self.rng.random() < 0.5 else members

    def integer_bounds(self) -> tuple[int, int]:
        low = self.rng.choice(RANGE_LOWS)
        return low, low + self.rng.choice(RANGE_WIDTHS)

    def bounded_integer(self, low: int, high: int) -> int:
        if self.rng.random() < EDGE_SHARE:
            return self.rng.choice((low, high))
        return self.rng.randint(low, high)


class ThirdPhaseSampler(SecondPhaseSampler):
    """The second phase's mix (value episodes, counters and bandits, the first phase's tasks), drawing
    its schema episodes from `ValueEpisodes`."""

    def __init__(self, seed: int, pieces: list[str], schema_fraction: float, openenv_fraction: float):
        super().__init__(seed, pieces, schema_fraction, openenv_fraction)
        self._episodes = ValueEpisodes(self._rng, pieces)
