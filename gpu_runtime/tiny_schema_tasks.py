"""Warm-up episodes for OpenEnv environments with arbitrary action schemas (the tiny model's second phase).

Why: the first warm-up phase (`gpu_runtime.tiny_openenv_tasks`) shows one integer field under eight
names, and a model trained only on those answers every environment with one of them: an
environment whose field is `guess` or `message` gets `{"delta": 3}`, every episode ends at its first
action, and GRPO has nothing to learn. These episodes instead draw a fresh schema each time (one to
three fields of integer, number, string, enum or boolean type, some optional) whose field names are
everyday words, compounds, or runs of random word pieces from the tokenizer's own vocabulary. Keys
made of random pieces cannot be memorised, and every letter-only piece appears as a key, so the
model learns to copy the names it is shown (from the schema's `required` list, in its order) rather
than recall a few. About one name in ten is held out by a hash and never trained on, so a probe on
those names measures the copying, not recall.

The answer is a schema-valid action with every required field, in `required` order, and a value of
the field's type drawn at random: the demo model acts validly, not well, so returns differ in a group.

Pure Python; imports no Django and no torch.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import replace

from core.contracts.openenv_prompt import system_prompt
from gpu_runtime.tiny_openenv_tasks import RESET_LABEL, STEP_LABEL, inspection, openenv_episode

# Words an action field is often called (and some that are not); KEY_WORD_SHARE of all keys are drawn here.
KEY_WORDS = (
    "guess", "message", "text", "answer", "action", "move", "command", "choice", "column", "row", "col",
    "x", "y", "position", "direction", "target", "value", "number", "amount", "bet", "stake", "bid",
    "code", "word", "letter", "name", "label", "query", "prompt", "reply", "content", "tool", "args",
    "confirm", "accept", "submit", "done", "flag", "enabled", "level", "speed", "angle", "power", "force",
    "card", "slot", "cell", "tile", "piece", "square", "lane", "door", "room", "item", "price", "quantity",
    "count", "size", "index", "offset", "shift", "turn", "rotate", "jump", "steer", "throttle", "brake",
    "color", "shape", "mode", "kind", "type_name", "key", "token", "path", "url", "email", "note", "title",
    "score", "rating", "vote", "pick", "select", "option", "arm", "lever", "button", "input", "output",
    "expression", "equation", "solution", "result", "response", "statement", "claim", "hint", "seed",
)
STRING_WORDS = (
    "hello", "yes", "no", "left", "right", "up", "down", "red", "blue", "green", "north", "south", "east",
    "west", "start", "stop", "open", "close", "alpha", "beta", "apple", "river", "stone", "light", "fast",
    "slow", "hello world", "good morning", "the answer", "try again", "one two", "go left", "pass",
)
TEXT_OBSERVATIONS = (
    "Make your move.", "Your turn.", "The game has started.", "Choose an action.", "Waiting for your action.",
    "The board is ready.", "A new round begins.", "Send your reply.", "Try again.", "Not quite.",
    "The environment is ready.", "Pick a value.", "Too high.", "Too low.", "Close, but not yet.",
)
ENVIRONMENT_WORDS = ("game", "world", "puzzle", "arena", "grid", "quiz", "shop", "lab", "maze", "desk", "echo",
                     "guess", "board", "trader", "robot", "chat", "match", "track")
DESCRIPTIONS = (
    "Play one round at a time.", "Reach the goal in as few steps as possible.", "Answer each question.",
    "Find the hidden value.", "A small text game.", "Each action changes the state; the reward says how well.",
    "Echo back a message.", "Make decisions and collect rewards.", "An environment for testing agents.",
)


# Enums twice: copying one of the listed members is a skill of its own, and a common action shape.
FIELD_KINDS = ("int_bounded", "int_bounded", "int", "number", "string", "string", "enum", "enum", "boolean")
KEY_WORD_SHARE = 0.30  # of keys: an everyday word; then 0.10 two joined words; the rest word pieces


def is_held_out_key(key: str) -> bool:
    """About one key in ten never appears in the second warm-up phase (a stable split by hash)."""
    return hashlib.sha256(f"key:{key}".encode()).digest()[0] % 10 == 0


class SchemaEpisodes:
    """A deterministic stream of (messages, action JSON, reasoning) for random action schemas.

    `pieces` are the tokenizer's letter-only vocabulary entries: made-up keys are built from them so
    that every piece the tokenizer knows is, at some point, a name the model has to copy.
    """

    field_kinds = FIELD_KINDS
    field_counts = (1, 1, 1, 2, 2, 3)

    def __init__(self, rng: random.Random, pieces: list[str]):
        self.rng = rng
        self.pieces = sorted(pieces)

    def key(self, *, held_out: bool = False) -> str:
        rng = self.rng
        while True:
            roll = rng.random()
            if roll < KEY_WORD_SHARE:
                key = rng.choice(KEY_WORDS)
            elif roll < KEY_WORD_SHARE + 0.10:
                key = f"{rng.choice(KEY_WORDS)}_{rng.choice(KEY_WORDS)}"
            else:
                key = "".join(rng.choice(self.pieces) for _ in range(rng.choice((1, 2, 2, 3))))
            if len(key) <= 24 and is_held_out_key(key) == held_out:
                return key

    def field(self, key: str) -> tuple[dict, object]:
        """A Pydantic-style property schema for `key` and a valid value for it."""
        rng = self.rng
        title = key.replace("_", " ").title()
        kind = rng.choice(self.field_kinds)
        if kind == "int_bounded":
            low, high = self.integer_bounds()
            prop = {"type": "integer", "minimum": low, "maximum": high}
        elif kind == "int":
            prop = {"type": "integer"}
        elif kind == "number":
            prop = {"type": "number"}
        elif kind == "string":
            prop = {"type": "string"}
            if rng.random() < 0.3:
                prop["minLength"] = 1
        elif kind == "enum":
            prop = {"enum": self.enum_members(), "type": "string"}
        else:
            prop = {"type": "boolean"}
        value = self.value(prop)
        prop["title"] = title
        if rng.random() < 0.6:
            prop["description"] = f"The {key.replace('_', ' ')} to send"
        return prop, value

    def enum_members(self) -> list[str]:
        rng = self.rng
        members = sorted({rng.choice(STRING_WORDS + KEY_WORDS) for _ in range(rng.randint(2, 4))})
        if len(members) < 2:
            members.append(members[0] + "_b")
        return members

    def integer_bounds(self) -> tuple[int, int]:
        low = self.rng.randint(-5, 5)
        return low, low + self.rng.randint(1, 15)

    def bounded_integer(self, low: int, high: int) -> int:
        return self.rng.randint(low, high)

    def schema(self, *, held_out: bool = False) -> tuple[dict, list[str], dict]:
        """(action schema, required keys in order, one valid action)."""
        rng = self.rng
        count = rng.choice(self.field_counts)
        keys: list[str] = []
        while len(keys) < count:
            key = self.key(held_out=held_out)
            if key not in keys and key != "metadata":
                keys.append(key)
        properties = {"metadata": {"additionalProperties": True, "description": "Additional metadata for the action",
                                   "title": "Metadata", "type": "object"}}
        action = {}
        for key in keys:
            properties[key], action[key] = self.field(key)
        required = list(keys)
        if count > 1 and rng.random() < 0.25:  # an optional field with a default: the answer leaves it out
            optional = required.pop()
            properties[optional]["default"] = action.pop(optional)
        schema = {"additionalProperties": False, "properties": properties, "required": required,
                  "title": rng.choice(("Action", "GameAction", "StepAction", "EnvAction", "Move")), "type": "object"}
        return schema, required, action

    def episode(self, *, held_out: bool = False) -> tuple[list[dict], str, str]:
        """(messages so far, the action JSON to answer, its one-line reasoning)."""
        return self.conversation(*self.schema(held_out=held_out))

    def conversation(self, schema: dict, required: list[str], action: dict) -> tuple[list[dict], str, str]:
        """An episode under `schema`: Kiln's system prompt, observations, earlier actions, the next action."""
        rng = self.rng
        name = rng.choice(ENVIRONMENT_WORDS) if rng.random() < 0.5 else self.key()
        env = inspection(name, rng.choice(DESCRIPTIONS), schema)
        messages = [{"role": "system", "content": system_prompt(env)}, {"role": "user", "content": self.observation(True)}]
        for _ in range(rng.choice((0, 0, 1, 2))):
            messages.append({"role": "assistant", "content": json.dumps(self._revalue(schema, action))})
            messages.append({"role": "tool", "content": self.observation(False)})
        action = self._revalue(schema, action)
        return messages, json.dumps(action), action_reasoning(action)

    def _revalue(self, schema: dict, action: dict) -> dict:
        """The same keys with fresh values of each field's type (each turn's action differs)."""
        return {key: self.value(schema["properties"][key]) for key in action}

    def value(self, prop: dict):
        """A random value that `prop` (as `field` builds it) accepts."""
        rng = self.rng
        if "enum" in prop:
            return rng.choice(prop["enum"])
        kind = prop["type"]
        if kind == "integer":
            if "minimum" in prop:
                return self.bounded_integer(prop["minimum"], prop["maximum"])
            return rng.randint(-20, 60)
        if kind == "number":
            return round(rng.uniform(-10, 10), rng.choice((1, 2)))
        if kind == "boolean":
            return rng.random() < 0.5
        return rng.choice(STRING_WORDS) if rng.random() < 0.6 else self.key()

    def observation(self, reset: bool) -> str:
        rng = self.rng
        if rng.random() < 0.6:
            return rng.choice(TEXT_OBSERVATIONS)
        observation = {"input_text": "", "turn": rng.randint(0, 9)}
        if rng.random() < 0.5:
            observation[rng.choice(("status", "last", "feedback"))] = rng.choice(STRING_WORDS)
        reward = None if reset else rng.choice((0.0, 1.0, -1.0, 0.5))
        wire = json.dumps({"observation": observation, "reward": reward, "done": False}, separators=(",", ":"))
        return (RESET_LABEL if reset else STEP_LABEL) + wire


class SecondPhaseSampler:
    """The second warm-up phase's stream: random-schema episodes (`schema_fraction`), the first
    phase's counter and bandit episodes (`openenv_fraction`: they keep its lean toward the helpful
    move, which GRPO needs a base to show), otherwise the first phase's whole mix, so its skills are
    rehearsed while the new one is learnt.

    The thinking coin is drawn before the conversation is built because it changes the prompt:
    with thinking on, the collector sends earlier actions with their reasoning (`reasoning_content`,
    which the chat template keeps for every turn after the first observation), so those turns carry
    it here too. Without this, a model trained on reasoning-free history loses the thread from its
    second action on.
    """

    def __init__(self, seed: int, pieces: list[str], schema_fraction: float, openenv_fraction: float):
        from gpu_runtime.tiny_tasks import TaskSampler  # local: tiny_tasks is the first phase's module

        self._rng = random.Random(seed)
        self._episodes = SchemaEpisodes(self._rng, pieces)
        self._first_phase = TaskSampler(seed + 1)
        self.schema_fraction = schema_fraction
        self.openenv_fraction = openenv_fraction

    def draw(self, thinking_fraction: float, system_fraction: float):
        """(Example, thinking, with_system) for the next example."""
        from gpu_runtime.tiny_tasks import Example

        rng = self._rng
        thinking = rng.random() < thinking_fraction
        roll = rng.random()
        if roll < self.schema_fraction:
            messages, action, reasoning = self._episodes.episode()
            example = Example("openenv", messages[-1]["content"], action, reasoning, tuple(messages))
        elif roll < self.schema_fraction + self.openenv_fraction:
            messages, action, reasoning = openenv_episode(rng)
            example = Example("openenv", messages[-1]["content"], action, reasoning, tuple(messages))
        else:
            example = self._first_phase.sample()
        if thinking and example.messages is not None:
            example = replace(example, messages=with_reasoning(example.messages))
        return example, thinking, rng.random() < system_fraction


def with_reasoning(messages) -> tuple[dict, ...]:
    """`messages` with each earlier JSON action's reasoning (`key = value, ...`) as the collector
    sends it with thinking on; other turns unchanged."""
    shown = []
    for message in messages:
        if message["role"] == "assistant":
            action = json.loads(message["content"])
            message = dict(message, reasoning_content=action_reasoning(action))
        shown.append(message)
    return tuple(shown)


def action_reasoning(action: dict) -> str:
    """The one-line reasoning the warm-up writes before an action: `key = value, ...`."""
    return ", ".join(f"{key} = {json.dumps(value)}" for key, value in action.items())
