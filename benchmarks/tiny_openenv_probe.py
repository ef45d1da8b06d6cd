"""How often a model answers Kiln's OpenEnv system prompt with a schema-valid action, per schema.

    python benchmarks/tiny_openenv_probe.py [MODEL_DIR] [--samples 8] [--thinking]

Prints, for named one-field schemas (`guess`, `message`, `direction`, ...), two fields (`row` +
`col`), the counter, action schemas as small games declare them (`--games`: rock-paper-scissors,
blackjack, a trade of an enum side and a bounded quantity, an optional field, ...; `--enum-classes`:
their enum fields typed by Enum classes, `$ref`s into `$defs`; `--structured`: fields no warm-up phase
draws, lists, tuples, dicts and nested models), and schemas whose
field names the tiny model's second warm-up phase holds out,
how many of `--samples` actions (T = 1.0, through `gpu_runtime.sampler`) pass Kiln's own parser and
validator, with a few of the answers. MODEL_DIR defaults to the shipped tiny model. This is the
probe behind docs/tiny-model.md's tables ("OpenEnv environments with any action fields").
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

METADATA = {"additionalProperties": True, "description": "Additional metadata for the action", "title": "Metadata",
            "type": "object"}
NAMED = {
    "guess": {"type": "integer", "minimum": 1, "maximum": 10},
    "column": {"type": "integer", "minimum": 1, "maximum": 10},
    "bet": {"type": "number"},
    "confirm": {"type": "boolean"},
    "message": {"type": "string"},
    "code": {"type": "string"},
    "direction": {"enum": ["down", "left", "right", "up"], "type": "string"},
}


def _enum(*members: str) -> dict:
    return {"enum": list(members), "type": "string"}


def _bounded(low: int, high: int) -> dict:
    return {"maximum": high, "minimum": low, "type": "integer"}


# Actions as small games declare them with Pydantic (`Literal[...]`, `Field(ge=, le=)`, `Optional`); none
# of their enum members is a word the warm-up trains as a member.
GAMES = {
    "rock-paper-scissors": {"move": _enum("rock", "paper", "scissors")},
    "blackjack": {"action": _enum("hit", "stand")},
    "coin": {"call": _enum("heads", "tails")},
    "paint": {"color": _enum("blue", "green", "red", "yellow")},
    "fruit": {"fruit": _enum("apple", "banana", "cherry", "mango")},
    "guess 1..100": {"guess": _bounded(1, 100)},
    "bandit arm 0..4": {"arm": _bounded(0, 4)},
    "wordle": {"guess": {"type": "string", "minLength": 5, "maxLength": 5}},
    "trade (enum + bounded)": {"side": _enum("buy", "sell"), "quantity": _bounded(1, 10)},
    "tool (enum + string)": {"tool": _enum("search", "calculator"), "query": {"type": "string"}},
    "shape (enum + bounded)": {"shape": _enum("circle", "square", "triangle"), "size": _bounded(1, 5)},
    "optional note": {"move": _bounded(-2, 2),
                      "note": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None}},
}


# Action fields whose values are not one scalar, as Pydantic declares `list[float]`, `list[int]` with a
# length bound, `list[Literal[...]]`, `tuple[int, int]`, `dict[str, int]` and a nested model (a `$ref`);
# no warm-up phase draws such a field (docs/tiny-model.md, "Known gaps").
STRUCTURED = {
    "list of numbers (portfolio weights)": {"weights": {"items": {"type": "number"}, "type": "array"}},
    "list of 1..3 digits": {"picks": {"items": _bounded(0, 9), "maxItems": 3, "minItems": 1, "type": "array"}},
    "list of enum members": {"moves": {"items": _enum("left", "right", "up", "down"), "type": "array"}},
    "tuple (row, col)": {"cell": {"maxItems": 2, "minItems": 2, "type": "array",
                                  "prefixItems": [_bounded(0, 2), _bounded(0, 2)]}},
    "dict of counts": {"order": {"additionalProperties": {"type": "integer"}, "type": "object"}},
    "nested model (x, y)": {"target": {"$ref": "#/$defs/Point"}},
}
STRUCTURED_DEFINITIONS = {"Point": {"properties": {"x": {"title": "X", "type": "integer"},
                                                   "y": {"title": "Y", "type": "integer"}},
                                    "required": ["x", "y"], "title": "Point", "type": "object"}}


def game_schema(fields: dict, enum_classes: bool = False) -> dict:
    """As Pydantic writes it; `enum_classes`: each enum field typed by an Enum class, which Pydantic
    declares as a `$ref` into `$defs` (Kiln's system prompt shows it inlined)."""
    properties, definitions = {"metadata": METADATA}, {}
    for key, prop in fields.items():
        if enum_classes and "enum" in prop:
            definitions[f"{key.title()}Kind"] = dict(prop, title=f"{key.title()}Kind")
            properties[key] = {"$ref": f"#/$defs/{key.title()}Kind"}
        elif "$ref" in prop:
            properties[key] = prop
        else:
            properties[key] = dict(prop, title=key.title())
    if any("$ref" in prop for prop in fields.values()):
        definitions.update(STRUCTURED_DEFINITIONS)
    required = [key for key, prop in fields.items() if "default" not in prop]
    schema = {"additionalProperties": False, "properties": properties, "required": required, "title": "Action",
              "type": "object"}
    return {"$defs": definitions, **schema} if definitions else schema


def one_field(key: str, prop: dict) -> dict:
    prop = dict(prop, title=key.title(), description=f"Your {key}")
    return {"additionalProperties": False, "properties": {"metadata": METADATA, key: prop}, "required": [key],
            "title": "Action", "type": "object"}


def probe_schemas(pieces: list[str], held_out: int, games: bool = False, enum_classes: bool = False,
                  structured: bool = False) -> dict[str, dict]:
    if structured:
        return {label: game_schema(fields) for label, fields in STRUCTURED.items()}
    if games:
        return {label: game_schema(fields, enum_classes) for label, fields in GAMES.items()}
    from gpu_runtime.tiny_openenv_tasks import action_schema
    from gpu_runtime.tiny_schema_tasks import SchemaEpisodes

    schemas = {key: one_field(key, prop) for key, prop in NAMED.items()}
    schemas["row+col"] = {
        "additionalProperties": False, "title": "Move", "type": "object", "required": ["row", "col"],
        "properties": {"metadata": METADATA, "row": {"type": "integer", "minimum": 0, "maximum": 2, "title": "Row"},
                       "col": {"type": "integer", "minimum": 0, "maximum": 2, "title": "Col"}}}
    schemas["counter delta -3..3"] = action_schema("delta", "CountAction", "Amount to add", -3, 3)
    episodes = SchemaEpisodes(random.Random(99), pieces)
    for _ in range(held_out):
        schema, required, _ = episodes.schema(held_out=True)
        schemas["held out: " + "+".join(required)] = schema
    return schemas


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=str(REPO / "gpu_runtime" / "assets" / "kiln-tiny"))
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--held-out", type=int, default=8, help="schemas with held-out field names")
    parser.add_argument("--thinking", action="store_true")
    parser.add_argument("--games", action="store_true", help="only the action schemas of small games (GAMES)")
    parser.add_argument("--enum-classes", action="store_true",
                        help="with --games: enum fields typed by Enum classes ($defs + $ref, as Pydantic writes them)")
    parser.add_argument("--structured", action="store_true",
                        help="only action fields no warm-up phase draws: lists, tuples, dicts, nested models")
    args = parser.parse_args(argv)

    from transformers import AutoTokenizer

    from core.contracts.openenv_prompt import system_prompt
    from gpu_runtime.model_loading import load_model
    from gpu_runtime.sample_types import SampleRequest
    from gpu_runtime.sampler import Sampler
    from gpu_runtime.sampling import SamplingParams
    from gpu_runtime.tiny_measure import letter_pieces
    from openenv.client.actions import ActionSchema, parse_and_validate_action
    from openenv.client.errors import ActionError

    sampler = Sampler(load_model(args.model))
    pieces = letter_pieces(AutoTokenizer.from_pretrained(args.model))
    total = valid_total = 0
    schemas = probe_schemas(pieces, args.held_out, args.games, args.enum_classes, args.structured)
    for label, schema in schemas.items():
        env = {"identity": {"metadata": {"name": "probe", "description": "A probe environment."}},
               "schema": {"action": schema}}
        messages = [{"role": "system", "content": system_prompt(env)}, {"role": "user", "content": "Make your move."}]
        requests = [SampleRequest(messages=messages, seed=1_000 + i, enable_thinking=args.thinking,
                                  sampling=SamplingParams(temperature=1.0, max_tokens=96 if args.thinking else 48))
                    for i in range(args.samples)]
        compiled, valid, seen = ActionSchema.compile(schema), 0, []
        for result in sampler.generate(requests):
            try:
                parse_and_validate_action(result.content, compiled)
                valid += 1
            except ActionError:
                pass
            seen.append(result.content.strip()[:40])
        total, valid_total = total + args.samples, valid_total + valid
        print(f"{label:40s} {valid:3d}/{args.samples}  {seen[:3]}")
    print(f"{'all':40s} {valid_total:3d}/{total}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
