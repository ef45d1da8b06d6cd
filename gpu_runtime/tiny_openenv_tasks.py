"""OpenEnv-style warm-up examples for the tiny model: Kiln's own system prompt, an observation, a JSON action.

Why: an OpenEnv run shows the model `core.contracts.openenv_prompt.system_prompt` (the environment's
name, description and action JSON Schema) and then observations. A model that answers that prompt
with noise ends every episode at its first action, so no group ever has different returns and
GRPO has nothing to learn. The warm-up therefore renders that exact prompt for synthetic
environments (one integer field, the Pydantic-style schema an `openenv` Action produces) and trains
a valid action as the answer. The action is the helpful one only part of the time
(`HELPFUL_FRACTION`) and otherwise a uniform draw from the schema's range: the demo model acts
validly but not well, so returns differ within a group and there is something to learn.

Pure Python; imports no Django and no torch.
"""

from __future__ import annotations

import json
import random

from core.contracts.openenv_prompt import system_prompt

HELPFUL_FRACTION = 0.35
RESET_LABEL = "OpenEnv reset result (observation, reward, done, and optional metadata JSON):\n"
STEP_LABEL = "OpenEnv step result (observation, reward, done, and optional metadata JSON):\n"

# (environment names, descriptions, action field names, field descriptions[, what the counter is called])
REACH_FAMILY = (
    ("counter", "number_line", "kiln_counter", "stepper", "dial", "tally"),
    ("Reach a target with bounded moves.", "Move a counter to the target value.",
     "Add small amounts until the value equals the goal.", "A counter that must reach a target."),
    ("delta", "step", "move", "amount"),
    ("Amount to add to the counter", "How far to move", "Change to apply", "Signed step size"),
    ("counter", "value", "dial", "position"),
)
CHOOSE_FAMILY = (
    ("bandit", "slot_machine", "arms", "picker", "chooser"),
    ("Pull one arm and receive its reward.", "Choose one option; some pay more than others.",
     "A multi-armed bandit.", "Pick an index and see what it pays."),
    ("arm", "index", "choice", "option"),
    ("Which arm to pull", "Index of the option", "The option to choose", "Zero-based index"),
)


def action_schema(key: str, title: str, description: str, low: int, high: int) -> dict:
    """The JSON Schema `openenv` serves for an Action with one bounded integer field."""
    return {
        "additionalProperties": False,
        "properties": {
            "metadata": {"additionalProperties": True, "description": "Additional metadata for the action",
                         "title": "Metadata", "type": "object"},
            key: {"description": description, "maximum": high, "minimum": low, "title": key.capitalize(),
                  "type": "integer"},
        },
        "required": [key],
        "title": title,
        "type": "object",
    }


def inspection(name: str, description: str, schema: dict) -> dict:
    return {"identity": {"metadata": {"name": name, "description": description}}, "schema": {"action": schema}}


def _action(key: str, value: int) -> str:
    return json.dumps({key: value})


def _wire(observation: dict, reward, done: bool) -> str:
    return json.dumps({"observation": observation, "reward": reward, "done": done}, separators=(",", ":"))


def reach_episode(rng: random.Random) -> tuple[list[dict], str, str]:
    """A counter episode: (messages so far, the action JSON to answer, its one-line reasoning)."""
    names, descriptions, keys, field_descriptions, things = REACH_FAMILY
    key, limit = rng.choice(keys), rng.randint(1, 5)
    schema = action_schema(key, rng.choice(("CountAction", "CounterAction", "MoveAction", "StepAction")),
                           rng.choice(field_descriptions), -limit, limit)
    env = inspection(rng.choice(names), rng.choice(descriptions), schema)
    thing, value, target = rng.choice(things), 0, rng.randint(-9, 9)
    raw = rng.random() < 0.3  # no input_text: the model sees the complete observation JSON
    if raw:
        first = RESET_LABEL + _wire({"value": value, "target": target, "steps_left": 6}, None, False)
    else:
        first = f"The {thing} is {value}. Reach {target} with moves of at most {limit}."
    messages = [{"role": "system", "content": system_prompt(env)}, {"role": "user", "content": first}]
    for _ in range(rng.choice((0, 0, 1, 2))):
        move = _choose_move(rng, value, target, limit)
        messages.append({"role": "assistant", "content": _action(key, move)})
        before, value = abs(target - value), value + move
        reward = float(before - abs(target - value))
        if raw:
            text = STEP_LABEL + _wire({"value": value, "target": target, "steps_left": 5}, reward, False)
        else:
            text = f"The {thing} is {value}; the target is {target}."
        messages.append({"role": "tool", "content": text})
    move = _choose_move(rng, value, target, limit)
    return messages, _action(key, move), f"{key} = {move}"


def _choose_move(rng: random.Random, value: int, target: int, limit: int) -> int:
    helpful = max(-limit, min(limit, target - value))
    if helpful != 0 and rng.random() < HELPFUL_FRACTION:
        return helpful
    return rng.choice([m for m in range(-limit, limit + 1) if m != 0])


def choose_episode(rng: random.Random) -> tuple[list[dict], str, str]:
    """A bandit-like episode: pick an index in the schema's range."""
    names, descriptions, keys, field_descriptions = CHOOSE_FAMILY
    key, count = rng.choice(keys), rng.randint(2, 6)
    schema = action_schema(key, rng.choice(("ArmAction", "ChoiceAction", "PickAction")),
                           rng.choice(field_descriptions), 0, count - 1)
    env = inspection(rng.choice(names), rng.choice(descriptions), schema)
    if rng.random() < 0.3:
        first = RESET_LABEL + _wire({"arms": count, "pulls_left": 5}, None, False)
    else:
        first = f"Choose one of {count} options, numbered 0 to {count - 1}."
    messages = [{"role": "system", "content": system_prompt(env)}, {"role": "user", "content": first}]
    for _ in range(rng.choice((0, 0, 1))):
        pick = rng.randrange(count)
        messages.append({"role": "assistant", "content": _action(key, pick)})
        messages.append({"role": "tool", "content": f"Option {pick} paid {rng.choice((0, 0, 1))}."})
    pick = rng.randrange(count)
    return messages, _action(key, pick), f"{key} = {pick}"


def openenv_episode(rng: random.Random) -> tuple[list[dict], str, str]:
    return reach_episode(rng) if rng.random() < 0.7 else choose_episode(rng)
