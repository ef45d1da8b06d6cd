"""The typed payload of an `eval.run` job and the pure rules around it: generation settings, seeds,
the effective-generation hash, rerun selection and the strict-replay comparison. Pure Python
(core.canonical and core.contracts.sampling only; no Django, no torch).

One kind, `eval.run`, covers every eval job; `mode` says how it was asked for:
- `run`: one suite against one target (an adapter, or None for the base model);
- `compare`: one suite against 1..MAX_TARGETS targets, paired by example id (every target gets
  the same per-example seed, so the table compares like with like);
- `rerun`: a new job over the examples of an earlier job selected by outcome kind;
- `replay`: the identical settings, targets and pinned suite of a completed job, re-generated and
  compared completion by completion with the original (`replay_verdict`).

Seeds. The job seed is the request's `generation.seed` or, when absent, `default_seed(suite_hash)`:
the first 8 bytes (big-endian u64) of sha256 over canonical JSON
`{"schema": "kiln.eval-default-seed.v1", "suite_hash": ...}`, so runs of the same suite pair up by
default. Each example is sampled with `example_seed(seed, example_id)`: the first 8 bytes of sha256
over canonical JSON `{"schema": "kiln.eval-example-seed.v1", "seed": "<decimal>", "example_id": id}`.
Seeds are u64 and travel as decimal strings.

`effective_generation_hash` = `sha256:` over RFC 8785 canonical JSON of
    {"schema": "kiln.eval-generation.v1",
     "sampling": {temperature, top_p, top_k, min_p, max_tokens, repetition_penalty,
                  presence_penalty, frequency_penalty, stop},
     "thinking": {"enabled", "budget_tokens"},
     "seed": "<decimal job seed>", "example_seed_rule": "kiln.eval-example-seed.v1",
     "model": {"base_model_sha256", "inference_config_sha256", "tokenizer": {vocab_sha256,
               config_sha256, chat_template_sha256}}}
with every default filled in (so an omitted field and its default hash alike, and key order never
matters). It binds what decides a completion other than the prompt and the adapter: the sampling
controls, thinking, the seeds and the served base model (weights, tokenizer and template, and the
inference config: device type and dtype). It deliberately excludes the target adapter and the
suite, so a candidate adapter's run and its baseline's run of one suite share the hash (the gate
pairs them on suite_hash + effective_generation_hash).
"""

from __future__ import annotations

import difflib
import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

from core.canonical import canonical_json, json_digest
from core.contracts.sampling import sampling_problem, seed_problem

KIND = "eval.run"
MODES = ("run", "compare", "rerun", "replay")
OUTCOME_KINDS = ("pass", "fail", "invalid", "error")
DEFAULT_RERUN_KINDS = ("fail", "invalid", "error")
MAX_TARGETS = 8
GENERATION_SCHEMA = "kiln.eval-generation.v1"
EXAMPLE_SEED_RULE = "kiln.eval-example-seed.v1"
DEFAULT_SEED_RULE = "kiln.eval-default-seed.v1"
SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 0.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "max_tokens": 256, "repetition_penalty": 1.0,
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "stop": [],
}
GENERATION_FIELDS = (*SAMPLING_DEFAULTS, "seed", "thinking", "thinking_budget_tokens")
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty")
MODEL_FIELDS = ("base_model_sha256", "inference_config_sha256")
TOKENIZER_FIELDS = ("vocab_sha256", "config_sha256", "chat_template_sha256")


class PayloadError(ValueError):
    """A request value is out of bounds; `field` is its JSON path (e.g. `generation.top_p`)."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def _u64_of(parts: dict) -> int:
    return int.from_bytes(hashlib.sha256(canonical_json(parts)).digest()[:8], "big")


def default_seed(suite_hash: str) -> int:
    return _u64_of({"schema": DEFAULT_SEED_RULE, "suite_hash": suite_hash})


def example_seed(seed: int, example_id: str) -> int:
    """The sampling seed of one example: the same for every target of a job, and for its replay."""
    return _u64_of({"schema": EXAMPLE_SEED_RULE, "seed": str(int(seed)), "example_id": str(example_id)})


def parse_seed(value, field: str = "generation.seed") -> int:
    if isinstance(value, str):
        text = value.strip()
        if not text.isdigit():
            raise PayloadError(field, f"{value!r} is not a decimal u64")
        value = int(text)
    problem = seed_problem(value)
    if problem:
        raise PayloadError(field, problem)
    return value


def _number(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise PayloadError(f"generation.{name}", "must be a finite number")
    return float(value)


def _integer(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise PayloadError(f"generation.{name}", "must be an integer")
    return value


def parse_generation(value, *, suite_hash: str) -> dict:
    """The effective generation settings: defaults filled in, every bound checked (core.contracts.sampling).

    {temperature, top_p, top_k, min_p, max_tokens, repetition_penalty, presence_penalty,
     frequency_penalty, stop: [..], seed: "<decimal>", seed_source: "request"|"derived",
     thinking: bool, thinking_budget_tokens: int|None}"""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise PayloadError("generation", "must be an object of generation settings")
    unknown = sorted(set(value) - set(GENERATION_FIELDS))
    if unknown:
        close = difflib.get_close_matches(str(unknown[0]), GENERATION_FIELDS, n=1)
        guess = f" (did you mean {close[0]!r}?)" if close else ""
        raise PayloadError(f"generation.{unknown[0]}",
                           f"is not a generation setting{guess} (known: {', '.join(GENERATION_FIELDS)})")
    out: dict[str, Any] = {}
    for name, default in SAMPLING_DEFAULTS.items():
        given = value.get(name)
        if given is None:
            out[name] = list(default) if isinstance(default, list) else default
        elif name in FLOAT_FIELDS:
            out[name] = _number(given, name)
        elif name == "stop":
            stops = [given] if isinstance(given, str) else given
            if not isinstance(stops, list) or any(not isinstance(s, str) for s in stops):
                raise PayloadError("generation.stop", "must be a string or a list of strings")
            try:
                "".join(stops).encode("utf-8")
            except UnicodeEncodeError:
                raise PayloadError("generation.stop", "holds a lone surrogate; send valid Unicode text") from None
            out[name] = list(stops)
        else:
            out[name] = _integer(given, name)
    problem = sampling_problem(**out)
    if problem:
        name = problem.split()[0]
        raise PayloadError(f"generation.{name if name in SAMPLING_DEFAULTS else 'stop'}", problem)
    thinking = value.get("thinking", False)
    if not isinstance(thinking, bool):
        raise PayloadError("generation.thinking", "must be true or false")
    budget = value.get("thinking_budget_tokens")
    if budget is not None:
        budget = _integer(budget, "thinking_budget_tokens")
        if budget < 1 or budget > 1 << 20:
            raise PayloadError("generation.thinking_budget_tokens", f"must lie within 1..{1 << 20}")
        if not thinking:
            raise PayloadError("generation.thinking_budget_tokens", "a thinking budget needs thinking on")
    if value.get("seed") is None:
        seed, source = default_seed(suite_hash), "derived"
    else:
        seed, source = parse_seed(value["seed"]), "request"
    return {**out, "seed": str(seed), "seed_source": source, "thinking": thinking, "thinking_budget_tokens": budget}


def model_binding(identity: dict | None) -> dict:
    """The part of the served model's identity that the generation hash binds."""
    identity = identity or {}
    missing = [k for k in MODEL_FIELDS if not isinstance(identity.get(k), str)]
    if missing:
        raise PayloadError("model", f"the served model identity lacks {', '.join(missing)}")
    tokenizer = identity.get("tokenizer") if isinstance(identity.get("tokenizer"), dict) else {}
    return {**{k: identity[k] for k in MODEL_FIELDS}, "tokenizer": {k: tokenizer.get(k) for k in TOKENIZER_FIELDS}}


def generation_hash(generation: dict, model: dict) -> str:
    """`effective_generation_hash` (see the module docstring for exactly what it binds)."""
    sampling = {name: generation[name] for name in SAMPLING_DEFAULTS}
    for name in FLOAT_FIELDS:
        sampling[name] = float(sampling[name])
    return json_digest({
        "schema": GENERATION_SCHEMA,
        "sampling": sampling,
        "thinking": {"enabled": bool(generation["thinking"]), "budget_tokens": generation.get("thinking_budget_tokens")},
        "seed": str(generation["seed"]),
        "example_seed_rule": EXAMPLE_SEED_RULE,
        "model": {"base_model_sha256": model["base_model_sha256"],
                  "inference_config_sha256": model["inference_config_sha256"],
                  "tokenizer": {k: (model.get("tokenizer") or {}).get(k) for k in TOKENIZER_FIELDS}},
    })


def target_label(adapter: str | None) -> str:
    return adapter if adapter else "base"


@dataclass(frozen=True)
class EvalJobPayload:
    mode: str
    suite: dict  # name, suite_hash, source_suite_hash, source (registered|inline), path, sha256, examples, scorers
    targets: tuple[dict, ...]  # {"adapter": name|None, "content_sha256": str|None}
    generation: dict  # parse_generation's value
    model: dict  # model_binding's value
    effective_generation_hash: str
    origin: dict | None = None  # rerun/replay: {"job_id", ...}
    route: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return int(self.generation["seed"])

    @property
    def labels(self) -> list[str]:
        return [target_label(t.get("adapter")) for t in self.targets]

    @classmethod
    def of(cls, job) -> EvalJobPayload:
        return cls.from_dict(job.payload)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalJobPayload:
        if data.get("mode") not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        targets = tuple({"adapter": t.get("adapter") or None, "content_sha256": t.get("content_sha256")}
                        for t in data["targets"])
        if not 1 <= len(targets) <= MAX_TARGETS:
            raise ValueError(f"an eval job has 1..{MAX_TARGETS} targets")
        for key in ("name", "suite_hash", "path", "sha256", "examples"):
            if key not in data["suite"]:
                raise ValueError(f"suite.{key} is missing")
        return cls(mode=data["mode"], suite=dict(data["suite"]), targets=targets, generation=dict(data["generation"]),
                   model=dict(data["model"]), effective_generation_hash=data["effective_generation_hash"],
                   origin=dict(data["origin"]) if data.get("origin") else None, route=data.get("route", ""),
                   extra=dict(data.get("extra") or {}))

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "suite": self.suite, "targets": [dict(t) for t in self.targets],
                "generation": self.generation, "model": self.model,
                "effective_generation_hash": self.effective_generation_hash, "origin": self.origin,
                "route": self.route, "extra": self.extra}


# -- rerun selection and replay comparison ------------------------------------------------------

def rerun_kinds(outcome_kinds, include_pass: bool) -> tuple[str, ...]:
    if outcome_kinds is None:
        kinds = list(DEFAULT_RERUN_KINDS)
    elif isinstance(outcome_kinds, list | tuple) and all(isinstance(k, str) for k in outcome_kinds):
        kinds = list(outcome_kinds)
    else:
        raise PayloadError("outcome_kinds", f"must be a list of outcome kinds ({', '.join(OUTCOME_KINDS)})")
    bad = [k for k in kinds if k not in OUTCOME_KINDS]
    if bad:
        raise PayloadError("outcome_kinds", f"{bad[0]!r} is not one of {', '.join(OUTCOME_KINDS)}")
    if not isinstance(include_pass, bool):
        raise PayloadError("include_pass", "must be true or false")
    if include_pass and "pass" not in kinds:
        kinds.append("pass")
    if not kinds:
        raise PayloadError("outcome_kinds", "select at least one outcome kind")
    return tuple(k for k in OUTCOME_KINDS if k in kinds)


def select_examples(records: list[dict], kinds: tuple[str, ...]) -> list[str]:
    """Example ids (in first-seen order) whose outcome, for any target, is one of `kinds`."""
    chosen: list[str] = []
    seen: set[str] = set()
    for record in records:
        example_id = record["example_id"]
        if record.get("outcome") in kinds and example_id not in seen:
            seen.add(example_id)
            chosen.append(example_id)
    return chosen


def _first_difference(a, b) -> int | None:
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def replay_verdict(original: list[dict], replayed: list[dict]) -> dict:
    """Compare a replay's records with the original's, in order, by (target_index, example_id).

    Token ids decide when both sides have them, then the completion text, then the finish reason.
    `matched` when every record agrees; else `mismatch` with the first differing record and the
    first differing token index (None when the token ids agree or are missing) and char index."""
    key = lambda r: (r.get("target_index", 0), r["example_id"])  # noqa: E731
    want = {key(r): r for r in original}
    if [key(r) for r in original] != [key(r) for r in replayed]:
        missing = next((k for k in want if k not in {key(r) for r in replayed}), None)
        return {"status": "error", "compared": 0,
                "message": f"the replay did not cover the same examples (first missing: {missing})"}
    for index, got in enumerate(replayed):
        expected = want[key(got)]
        tokens_a, tokens_b = expected.get("completion_token_ids"), got.get("completion_token_ids")
        token_index = _first_difference(tokens_a, tokens_b) if tokens_a is not None and tokens_b is not None else None
        char_index = _first_difference(expected.get("completion") or "", got.get("completion") or "")
        finish_differs = expected.get("finish_reason") != got.get("finish_reason")
        if token_index is not None or char_index is not None or finish_differs:
            return {"status": "mismatch", "compared": index + 1, "first_mismatch": {
                "example_id": got["example_id"], "target_index": got.get("target_index", 0),
                "target": got.get("target"), "token_index": token_index, "char_index": char_index,
                "expected_token": _at(tokens_a, token_index), "got_token": _at(tokens_b, token_index),
                "expected_text": _window(expected.get("completion") or "", char_index),
                "got_text": _window(got.get("completion") or "", char_index),
                "expected_finish_reason": expected.get("finish_reason"), "got_finish_reason": got.get("finish_reason"),
            }}
    return {"status": "matched", "compared": len(replayed)}


def _at(tokens, index):
    return tokens[index] if tokens is not None and index is not None and index < len(tokens) else None


def _window(text: str, index: int | None, width: int = 40) -> str | None:
    return None if index is None else text[max(0, index - 10):index + width]
