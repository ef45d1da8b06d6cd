"""Action / observation (env) token masks from trajectory segments (spec §2.2).

Pure Python: imports neither torch nor Django. The chat template and the tokenizer come in as
callables, so tests use a fake renderer and the trainer passes the pinned tokenizer:

    render(messages: list[dict]) -> str                          # the chat template
    encode(text: str) -> (token_ids, [(char_start, char_end)])   # offsets into `text`

`kind` (not `role`) selects the loss: action tokens get the policy gradient, observation tokens
the ECHO cross-entropy, context tokens nothing. Prompt + trajectory render as one chat; each
segment's content is located in the rendered text, and a token belongs to a segment when its
character span overlaps the segment's content. With the warning filter on (ECHO `env_only`),
the env mask starts after the observation's warning prefix: a token is kept only if it starts
at or after the end of `warning_prefix_len` bytes, so no warning byte is ever trained on. |O|
(`observation_tokens`) still counts the full observation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

KINDS = ("context", "action", "observation")
_SENTINEL = "\ue000kiln-segment-{}\ue001"  # private-use code points: never in real content


class MaskBuildError(ValueError):
    """The trajectory cannot be masked (content not rendered verbatim, masks overlap, ...)."""


@dataclass(frozen=True)
class TurnSegment:
    role: str
    content: str
    kind: str  # context | action | observation
    tool_call_id: str | None = None
    warning_prefix_len: int | None = None  # bytes (UTF-8) of a harness warning prefix

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise MaskBuildError(f"segment kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if not isinstance(self.content, str):
            raise MaskBuildError("segment content must be a string")
        wp = self.warning_prefix_len
        if wp is not None and (isinstance(wp, bool) or not isinstance(wp, int) or wp < 0):
            raise MaskBuildError(f"warning_prefix_len must be a non-negative integer, got {wp!r}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TurnSegment:
        return cls(
            role=data["role"],
            content=data.get("content") or "",
            kind=data["kind"],
            tool_call_id=data.get("tool_call_id"),
            warning_prefix_len=data.get("warning_prefix_len"),
        )

    def message(self, content: str | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content if content is None else content}
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def warning_chars(self) -> int:
        """The warning prefix in characters. A byte count that ends inside a character counts
        that whole character as warning, so trimming never keeps part of the warning."""
        count = nbytes = 0
        for char in self.content:
            if nbytes >= (self.warning_prefix_len or 0):
                break
            nbytes += len(char.encode("utf-8"))
            count += 1
        return count


@dataclass(frozen=True)
class TrajectoryMasks:
    input_ids: list[int]
    action_mask: list[bool]
    env_mask: list[bool]
    observation_tokens: int  # |O|: observation tokens before warning trimming (ECHO's divisor)
    segment_spans: list[tuple[int, int, str]] = field(default_factory=list)  # token [start, end), kind
    token_counts: dict[str, int] = field(default_factory=dict)  # the receipt's token_counts block


def build_trajectory_masks(
    prompt_messages: Sequence[Mapping[str, Any]],
    trajectory: Sequence[TurnSegment | Mapping[str, Any]],
    *,
    render: Callable[[list[dict[str, Any]]], str],
    encode: Callable[[str], tuple[Sequence[int], Sequence[tuple[int, int]]]],
    warning_filter: bool = True,
    env_mask_mode: str = "env_only",
) -> TrajectoryMasks:
    """Render prompt + trajectory once, tokenize, and build the two disjoint masks."""
    if env_mask_mode not in ("env_only", "full_obs"):
        raise MaskBuildError(f"unknown env_mask_mode {env_mask_mode!r}")
    segments = [s if isinstance(s, TurnSegment) else TurnSegment.from_dict(s) for s in trajectory]
    prompt = [dict(m) for m in prompt_messages]
    text = render(prompt + [s.message() for s in segments])
    spans = _locate_segments(prompt, segments, text, render)
    ids, offsets = encode(text)
    ids, offsets = list(ids), [tuple(o) for o in offsets]
    if len(ids) != len(offsets):
        raise MaskBuildError("encode returned different numbers of ids and offsets")

    trim = warning_filter and env_mask_mode == "env_only"
    n = len(ids)
    action, env, in_observation = [False] * n, [False] * n, [False] * n
    seg_spans: list[tuple[int, int, str]] = []
    for seg, (start, end) in zip(segments, spans, strict=True):
        if seg.kind == "context":
            continue
        env_from = start + (seg.warning_chars() if trim and seg.kind == "observation" else 0)
        touched = [i for i, (a, b) in enumerate(offsets) if a < b and a < end and b > start]
        for i in touched:
            if seg.kind == "action":
                action[i] = True
            else:
                in_observation[i] = True
                if offsets[i][0] >= env_from or env_from == start:
                    env[i] = True
        if touched:
            seg_spans.append((touched[0], touched[-1] + 1, seg.kind))
    overlap = [i for i in range(n) if action[i] and (env[i] or in_observation[i])]
    if overlap:
        raise MaskBuildError(f"action and observation masks overlap at token {overlap[0]}")
    if action and action[0] or env and env[0]:
        # Token 0 has no preceding logits, so it cannot be trained; a prompt always precedes it.
        raise MaskBuildError("a trained token sits at position 0: the prompt rendered empty")

    counts = {
        "action_tokens": sum(action),
        "env_tokens": sum(env),
        "env_tokens_before_warning_filter": sum(in_observation),
        "env_tokens_after_warning_filter": sum(env),
        "warning_tokens_filtered": sum(in_observation) - sum(env),
        "context_tokens": n - sum(action) - sum(in_observation),
    }
    return TrajectoryMasks(ids, action, env, sum(in_observation), seg_spans, counts)


def sum_token_counts(items: Sequence[TrajectoryMasks]) -> dict[str, int]:
    """Add per-rollout token counts for the receipt."""
    total: dict[str, int] = {}
    for item in items:
        for key, value in item.token_counts.items():
            total[key] = total.get(key, 0) + value
    return total


def _locate_segments(prompt, segments, text, render) -> list[tuple[int, int]]:
    """Character span of each segment's content in `text`.

    First try exact placement: render once more with each content replaced by a unique
    sentinel; if substituting the contents back reproduces `text`, the sentinel positions are the
    spans. Templates that transform content (e.g. split reasoning at </think>) fail that check;
    then each content is searched verbatim, in order, after the rendered prompt.
    """
    sentinels = [_SENTINEL.format(i) for i in range(len(segments))]
    marked = render(prompt + [s.message(sentinels[i]) for i, s in enumerate(segments)])
    spans, rebuilt, cursor = [], [], 0
    for sentinel, seg in zip(sentinels, segments, strict=True):
        at = marked.find(sentinel, cursor)
        if at < 0:
            break
        rebuilt.append(marked[cursor:at])
        start = sum(map(len, rebuilt)) + sum(len(s.content) for s in segments[: len(spans)])
        spans.append((start, start + len(seg.content)))
        cursor = at + len(sentinel)
    else:
        if "".join(_interleave(rebuilt, [s.content for s in segments])) + marked[cursor:] == text:
            return spans

    prompt_text = render(prompt) if prompt else ""
    cursor = _common_prefix(prompt_text, text)
    spans = []
    for index, seg in enumerate(segments):
        at = text.find(seg.content, cursor)
        if at < 0:
            raise MaskBuildError(
                f"segment {index} ({seg.kind}) content is not rendered verbatim by the chat template"
            )
        spans.append((at, at + len(seg.content)))
        cursor = at + len(seg.content)
    return spans


def _interleave(gaps: list[str], contents: list[str]):
    for gap, content in zip(gaps, contents, strict=True):
        yield gap
        yield content


def _common_prefix(a: str, b: str) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def hf_encode(tokenizer) -> Callable[[str], tuple[list[int], list[tuple[int, int]]]]:
    """`encode` for a Hugging Face fast tokenizer (the rendered chat already has its specials)."""

    def encode(text: str):
        out = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(out["input_ids"]), [tuple(o) for o in out["offset_mapping"]]

    return encode


def hf_render(tokenizer, **template_kwargs) -> Callable[[list[dict[str, Any]]], str]:
    """`render` through the tokenizer's chat template (no generation prompt: the chat is complete)."""

    def render(messages: list[dict[str, Any]]) -> str:
        return tokenizer.apply_chat_template(messages, tokenize=False, **template_kwargs)

    return render
