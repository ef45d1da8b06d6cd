"""Row identities and the deterministic train/validation/holdout split of a dataset (spec §1.4).

Pure module: no Django, no torch, no ORM (the import contracts keep it so).

- A row's exact identity is the `sha256:` digest of its RFC 8785 canonical JSON (keys sorted
  recursively); its normalized identity is the same digest after every string value is lower-cased
  and its whitespace collapsed (runs of whitespace become one space, ends trimmed; keys are kept).
- Rows that share a normalized identity, a non-empty `group_id` or a non-empty `session_id` (read
  from the row's root and from its `metadata`, `provenance` and `extra` objects) are one connected
  component, and a component is assigned whole.
- A component's identity is the digest of its members' sorted, distinct normalized identities, so
  it does not depend on row order. Its partition comes from a 64-bit draw
  u = int(sha256(canonical {schema, seed, component})[:16], 16) / 2**64: train when
  100·u < train_percent, validation when 100·u < train_percent + validation_percent, else holdout.
- Small-N rules, applied after the draw by moving whole components (deterministically: from the
  fullest partition that can spare one, the component whose draw lies nearest the empty partition's
  range): at least 1 component → train is non-empty; at least 2 → train and holdout; at least 3 with
  validation_percent > 0 → all three.
"""

from __future__ import annotations

import hashlib
import math
import re
from dataclasses import dataclass

from core.canonical import canonical_json, json_digest

SPLIT_SCHEMA = "kiln.dataset-split.v1"
DATASET_MANIFEST_SCHEMA = "kiln.dataset-manifest.v1"
IDENTITY_SCHEMA = "kiln.dataset-identity.v1"
PARTITIONS = ("train", "validation", "holdout")
ID_CONTAINERS = ("metadata", "provenance", "extra")
MAX_SEED = 2**64 - 1
DEFAULT_SPLIT_CONFIG = {"seed": "0", "train_percent": 80, "validation_percent": 10}
_WHITESPACE = re.compile(r"\s+")


class SplitError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class SplitConfig:
    seed: str  # a decimal u64
    train_percent: float | int
    validation_percent: float | int

    def to_dict(self) -> dict:
        return {"seed": self.seed, "train_percent": self.train_percent,
                "validation_percent": self.validation_percent}


def _percent(value, field: str) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SplitError(field, "must be a number between 0 and 100")
    if not 0 <= value <= 100:
        raise SplitError(field, f"must be between 0 and 100, got {value}")
    return int(value) if float(value).is_integer() else float(value)


def parse_split_config(value) -> SplitConfig:
    """`{seed, train_percent, validation_percent}`, each defaulting to DEFAULT_SPLIT_CONFIG."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise SplitError("split", "must be an object with seed, train_percent and validation_percent")
    # A misspelt setting would otherwise re-split with the defaults: rows move between partitions.
    for key in value:
        if key not in DEFAULT_SPLIT_CONFIG:
            raise SplitError(str(key)[:80], "is not a split setting: they are seed, train_percent and "
                             "validation_percent (a setting left out takes its default)")
    seed = value.get("seed", DEFAULT_SPLIT_CONFIG["seed"])
    if isinstance(seed, int) and not isinstance(seed, bool):
        seed = str(seed)
    if not isinstance(seed, str) or not seed.isascii() or not seed.isdigit() or len(seed) > 20 \
            or int(seed) > MAX_SEED:
        raise SplitError("seed", "must be a decimal u64 string, e.g. \"0\" or \"42\"")
    seed = str(int(seed))
    train = _percent(value.get("train_percent", DEFAULT_SPLIT_CONFIG["train_percent"]), "train_percent")
    validation = _percent(value.get("validation_percent", DEFAULT_SPLIT_CONFIG["validation_percent"]),
                          "validation_percent")
    if train <= 0:
        raise SplitError("train_percent", "must be greater than 0")
    if train + validation >= 100:
        raise SplitError("validation_percent", f"train_percent + validation_percent must be below 100 "
                         f"(got {train} + {validation}); the rest is the holdout")
    return SplitConfig(seed, train, validation)


# -- identities ---------------------------------------------------------------------------------

def normalize_value(value):
    """Lower-case every string value and collapse its whitespace, recursively (keys unchanged)."""
    if isinstance(value, str):
        return _WHITESPACE.sub(" ", value.lower()).strip()
    if isinstance(value, list):
        return [normalize_value(item) for item in value]
    if isinstance(value, dict):
        return {key: normalize_value(item) for key, item in value.items()}
    return value


def exact_identity(row) -> str:
    return json_digest(row)


def normalized_identity(row) -> str:
    return json_digest(normalize_value(row))


def id_value(value) -> str | None:
    """A declared group/session id as text (non-empty strings, integers; 7 equals \"7\"), else None."""
    if isinstance(value, str) and value.strip():
        return value.strip()
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return None


def declared_ids(row: dict, key: str) -> list[str]:
    """The distinct non-empty values of `key` at the row's root and in metadata/provenance/extra."""
    found: list[str] = []
    if not isinstance(row, dict):
        return found
    for holder in (row, *(row.get(c) for c in ID_CONTAINERS)):
        if isinstance(holder, dict):
            value = id_value(holder.get(key))
            if value is not None and value not in found:
                found.append(value)
    return found


@dataclass(frozen=True)
class RowIdentity:
    row: int  # 1-based position among the dataset's rows (= line of data.jsonl)
    exact: str
    normalized: str
    group_ids: tuple[str, ...]
    session_ids: tuple[str, ...]


def row_identities(rows: list[dict]) -> list[RowIdentity]:
    return [RowIdentity(i, exact_identity(r), normalized_identity(r), tuple(declared_ids(r, "group_id")),
                        tuple(declared_ids(r, "session_id"))) for i, r in enumerate(rows, start=1)]


def corpus_digests(identities: list[RowIdentity]) -> tuple[str, str]:
    """(corpus_sha256, normalized_corpus_sha256): the digest of the ordered list of row identities."""
    return (json_digest([i.exact for i in identities]), json_digest([i.normalized for i in identities]))


# -- components ---------------------------------------------------------------------------------

def components(identities: list[RowIdentity]) -> list[list[int]]:
    """Connected components (lists of 0-based row indexes, ascending), in order of their first row."""
    parent = list(range(len(identities)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    first_seen: dict[tuple[str, str], int] = {}
    for index, ident in enumerate(identities):
        keys = [("n", ident.normalized), *(("g", g) for g in ident.group_ids),
                *(("s", s) for s in ident.session_ids)]
        for key in keys:
            other = first_seen.setdefault(key, index)
            a, b = find(index), find(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict[int, list[int]] = {}
    for index in range(len(identities)):
        groups.setdefault(find(index), []).append(index)
    return sorted(groups.values(), key=lambda members: members[0])


def component_identity(identities: list[RowIdentity], members: list[int]) -> str:
    return json_digest(sorted({identities[i].normalized for i in members}))


def component_draw(config: SplitConfig, component: str) -> float:
    """The component's deterministic position in [0, 1) for this seed and schema."""
    digest = hashlib.sha256(canonical_json({"schema": SPLIT_SCHEMA, "seed": config.seed,
                                            "component": component})).hexdigest()
    return int(digest[:16], 16) / 2**64


def _ranges(config: SplitConfig) -> dict[str, tuple[float, float]]:
    t = config.train_percent / 100
    v = (config.train_percent + config.validation_percent) / 100
    return {"train": (0.0, t), "validation": (t, v), "holdout": (v, 1.0)}


def _distance(draw: float, bounds: tuple[float, float]) -> float:
    low, high = bounds
    return 0.0 if low <= draw < high else min(abs(draw - low), abs(draw - high))


def required_partitions(n_components: int, config: SplitConfig) -> tuple[str, ...]:
    if n_components >= 3 and config.validation_percent > 0:
        return ("train", "holdout", "validation")
    if n_components >= 2:
        return ("train", "holdout")
    return ("train",) if n_components >= 1 else ()


def assign_components(draws: list[float], config: SplitConfig) -> list[str]:
    """The partition of each component: by its draw, then repaired so the small-N rules hold."""
    ranges = _ranges(config)
    assigned = [next((p for p in PARTITIONS if draw < ranges[p][1]), "holdout") for draw in draws]
    required = required_partitions(len(draws), config)
    for wanted in required:
        if wanted in assigned:
            continue
        counts = {p: assigned.count(p) for p in PARTITIONS}
        donors = [p for p in PARTITIONS if p != wanted and (counts[p] >= 2 or (p not in required and counts[p]))]
        donor = max(donors, key=lambda p: (counts[p], -PARTITIONS.index(p)))
        candidates = [i for i, p in enumerate(assigned) if p == donor]
        chosen = min(candidates, key=lambda i: (_distance(draws[i], ranges[wanted]), i))
        assigned[chosen] = wanted
    return assigned


# -- the split and the manifests ----------------------------------------------------------------

@dataclass(frozen=True)
class Split:
    config: SplitConfig
    partitions: list[str]  # per row, in row order
    counts: dict[str, int]  # rows per partition
    component_counts: dict[str, int]
    num_components: int

    def rows_of(self, partition: str) -> list[int]:
        """0-based indexes of the rows in `partition`."""
        return [i for i, p in enumerate(self.partitions) if p == partition]


def compute_split(identities: list[RowIdentity], config: SplitConfig) -> Split:
    comps = components(identities)
    draws = [component_draw(config, component_identity(identities, members)) for members in comps]
    assigned = assign_components(draws, config)
    partitions = [""] * len(identities)
    for members, partition in zip(comps, assigned, strict=True):
        for index in members:
            partitions[index] = partition
    counts = {p: partitions.count(p) for p in PARTITIONS}
    component_counts = {p: assigned.count(p) for p in PARTITIONS}
    return Split(config, partitions, counts, component_counts, len(comps))


def split_manifest(*, dataset: str, identities: list[RowIdentity], split: Split) -> dict:
    """The DatasetSplitManifest (split.json): identities, config, counts and one entry per row."""
    corpus, normalized = corpus_digests(identities)
    rows = []
    for ident, partition in zip(identities, split.partitions, strict=True):
        entry = {"row": ident.row, "exact_identity": ident.exact, "normalized_identity": ident.normalized,
                 "partition": partition}
        if ident.group_ids:
            entry["group_id"] = ident.group_ids[0]
        if ident.session_ids:
            entry["session_id"] = ident.session_ids[0]
        if len(ident.group_ids) > 1:
            entry["group_ids"] = list(ident.group_ids)
        if len(ident.session_ids) > 1:
            entry["session_ids"] = list(ident.session_ids)
        rows.append(entry)
    return {"schema": SPLIT_SCHEMA, "dataset": dataset, "corpus_sha256": corpus,
            "normalized_corpus_sha256": normalized, "config": split.config.to_dict(), "counts": dict(split.counts),
            "component_counts": dict(split.component_counts), "num_components": split.num_components,
            "rows": rows}


def split_manifest_bytes(manifest: dict) -> bytes:
    """split.json's bytes: canonical JSON, so the file's sha256 equals the manifest's digest."""
    return canonical_json(manifest)


def count_distinct(identities: list[RowIdentity], key: str) -> int:
    values = {v for ident in identities for v in (ident.group_ids if key == "group_id" else ident.session_ids)}
    return len(values)


def dataset_manifest(*, name: str, fmt: str, description: str, identities: list[RowIdentity], split: Split,
                     split_sha256: str, created_at: str, source_sha256: str) -> dict:
    """manifest.json: what GET /v1/eval/datasets/{name} answers (DatasetManifest)."""
    corpus, normalized = corpus_digests(identities)
    return {"schema": DATASET_MANIFEST_SCHEMA, "name": name, "format": fmt, "description": description,
            "rows": len(identities), "corpus_sha256": corpus, "normalized_corpus_sha256": normalized,
            "source_sha256": source_sha256, "split_manifest_sha256": split_sha256,
            "split_config": split.config.to_dict(), "split_counts": dict(split.counts),
            "num_components": split.num_components, "num_groups": count_distinct(identities, "group_id"),
            "num_sessions": count_distinct(identities, "session_id"), "created_at": created_at}


def identity_document(*, name: str, fmt: str, identities: list[RowIdentity], source_sha256: str) -> dict:
    """identity.json: the corpus identity and every row's exact and normalized identity."""
    corpus, normalized = corpus_digests(identities)
    return {"schema": IDENTITY_SCHEMA, "dataset": name, "format": fmt, "rows": len(identities),
            "source_sha256": source_sha256, "corpus_sha256": corpus, "normalized_corpus_sha256": normalized,
            "row_identities": [{"row": i.row, "exact_identity": i.exact, "normalized_identity": i.normalized}
                               for i in identities]}
