"""Eval suite examples from a dataset partition. Pure module: no Django, no torch.

Strategies (each format has a default):
- grpo_groups `reference` (default): the prompt is the group's messages, the target the row's
  `reference`, `answer` or `target` field (first found at the root, then in `metadata`/`extra`);
- grpo_groups `best_completion`: the prompt is the group's messages, the target the text of its
  highest-reward completion (the first of equal rewards); a group whose completions all scored the
  same says nothing about which answer is right, so it makes no example (a suite of such "targets"
  would reward whatever the model happened to say);
- sft_chat `last_assistant` (default): the prompt is every message before the last assistant
  message, the target that message's content;
- raw `fields` (default): the prompt is the row's `messages`, or its `prompt` string as one user
  message; the target its `reference`, `answer` or `target` field.
Every example has id `row-<row>` and `metadata.kiln_dataset_provenance` = {dataset, partition,
row, exact_identity, normalized_identity, group_id?, session_id?, corpus_sha256,
split_manifest_sha256} (plus `group_ids`/`session_ids` lists when a row declares several); the row's own `metadata` object is kept beside it.
"""

from __future__ import annotations

STRATEGIES = {"grpo_groups": ("reference", "best_completion"), "sft_chat": ("last_assistant",),
              "raw": ("fields",)}
TARGET_FIELDS = ("reference", "answer", "target")
PROVENANCE_KEY = "kiln_dataset_provenance"


class SynthesisError(ValueError):
    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def default_strategy(fmt: str) -> str:
    return STRATEGIES[fmt][0]


def check_strategy(fmt: str, strategy) -> str:
    if strategy is None:
        return default_strategy(fmt)
    if strategy not in STRATEGIES[fmt]:
        raise SynthesisError("strategy", f"must be one of {', '.join(STRATEGIES[fmt])} for a {fmt} dataset, "
                                         f"not {strategy!r}")
    return strategy


def _declared_target(row: dict):
    for holder in (row, row.get("metadata"), row.get("extra")):
        if isinstance(holder, dict):
            for key in TARGET_FIELDS:
                value = holder.get(key)
                if isinstance(value, str | int | float) and not isinstance(value, bool):
                    return value
    return None


def _messages(messages) -> list[dict]:
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):  # content parts, as the group contract flattens them
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        out.append({"role": message["role"], "content": content if isinstance(content, str) else ""})
    return out


def prompt_and_target(row: dict, fmt: str, strategy: str, row_number: int) -> tuple[list[dict], object] | None:
    where = f"row {row_number}"
    if strategy == "reference" or strategy == "fields":
        if strategy == "fields":
            if isinstance(row.get("messages"), list) and row["messages"]:
                if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in row["messages"]):
                    raise SynthesisError(where, "messages must be chat messages with a role")
                prompt = _messages(row["messages"])
            elif isinstance(row.get("prompt"), str) and row["prompt"].strip():
                prompt = [{"role": "user", "content": row["prompt"]}]
            else:
                raise SynthesisError(where, "has neither messages nor a prompt string")
        else:
            prompt = _messages(row["messages"])
        target = _declared_target(row)
        if target is None:
            hint = " (or use strategy best_completion)" if fmt == "grpo_groups" else ""
            raise SynthesisError(where, f"has no {', '.join(TARGET_FIELDS)} field to use as the target{hint}")
        return prompt, target
    if strategy == "best_completion":
        completions = row.get("completions") or row.get("rollouts")
        rewards = [c["reward"] for c in completions]
        if max(rewards) == min(rewards):
            return None  # no completion stands out: no target to trust
        best = max(range(len(completions)), key=lambda i: (completions[i]["reward"], -i))
        return _messages(row["messages"]), completions[best]["text"]
    messages = row["messages"]  # last_assistant
    last = max(i for i, m in enumerate(messages) if m["role"] == "assistant")
    if last == 0:
        raise SynthesisError(where, "its last assistant message has no prompt before it")
    return _messages(messages[:last]), messages[last]["content"]


def synthesize_examples(*, dataset: str, fmt: str, strategy: str, partition: str, rows: list[dict],
                        entries: list[dict], corpus_sha256: str, split_manifest_sha256: str) -> list[dict]:
    """One example per row (best_completion skips groups without a best completion); `entries` are
    the split manifest's entries of those rows (same order)."""
    examples = []
    for row, entry in zip(rows, entries, strict=True):
        picked = prompt_and_target(row, fmt, strategy, entry["row"])
        if picked is None:
            continue
        prompt, target = picked
        provenance = {"dataset": dataset, "partition": partition, "row": entry["row"],
                      "exact_identity": entry["exact_identity"], "normalized_identity": entry["normalized_identity"],
                      "corpus_sha256": corpus_sha256, "split_manifest_sha256": split_manifest_sha256}
        for key in ("group_id", "session_id", "group_ids", "session_ids"):
            if key in entry:
                provenance[key] = entry[key]
        own = row.get("metadata") if isinstance(row.get("metadata"), dict) else {}
        metadata = {**{k: v for k, v in own.items() if k != PROVENANCE_KEY}, PROVENANCE_KEY: provenance}
        examples.append({"id": f"row-{entry['row']}", "messages": prompt, "target": target, "metadata": metadata})
    if rows and not examples:
        raise SynthesisError("strategy", f"best_completion found no group with a best completion: in all "
                             f"{len(rows)} groups every completion scored the same")
    return examples
