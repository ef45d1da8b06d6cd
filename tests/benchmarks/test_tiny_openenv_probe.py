"""The OpenEnv probe's structured schemas (`--structured`) hold the values their labels promise, and
refuse the one-scalar answers the demo model gives them, so the probe's count means what the docs say."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import tiny_openenv_probe as probe  # noqa: E402

from openenv.client.actions import ActionSchema, parse_and_validate_action  # noqa: E402
from openenv.client.errors import ActionError  # noqa: E402

VALID = {
    "list of numbers (portfolio weights)": '{"weights": [0.5, -1.25, 3]}',
    "list of 1..3 digits": '{"picks": [0, 9, 4]}',
    "list of enum members": '{"moves": ["left", "up", "left"]}',
    "tuple (row, col)": '{"cell": [2, 0]}',
    "dict of counts": '{"order": {"apple": 2, "pear": 0}}',
    "nested model (x, y)": '{"target": {"x": 3, "y": -4}}',
}
REFUSED = {  # what the release answers (docs/tiny-model.md, "Fields whose value is not one scalar")
    "list of numbers (portfolio weights)": '{"weights": -7.6}',
    "list of 1..3 digits": '{"picks": [0, 9, 9, 1]}',
    "list of enum members": '{"moves": ["right", "er"]}',
    "tuple (row, col)": '{"cell": [1, 2, 2]}',
    "dict of counts": '{"order": 69}',
    "nested model (x, y)": '{"x": -12, "y": -17}',
}


def test_every_structured_schema_accepts_its_shape_and_refuses_a_scalar_or_a_wrong_length():
    schemas = probe.probe_schemas([], held_out=0, structured=True)
    assert set(schemas) == set(VALID) == set(REFUSED)
    for label, schema in schemas.items():
        compiled = ActionSchema.compile(schema)
        assert parse_and_validate_action(VALID[label], compiled)
        with pytest.raises(ActionError):
            parse_and_validate_action(REFUSED[label], compiled)
    assert "Point" in schemas["nested model (x, y)"]["$defs"]  # Pydantic's form: a $ref into $defs
    assert "$defs" not in schemas["dict of counts"]
