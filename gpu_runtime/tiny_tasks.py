"""Synthetic tasks and the built-in tokenizer corpus for Kiln's tiny model. Pure Python; imports no Django.

Three task families, all rendered as one user turn and a short assistant answer:
- arithmetic: "What is 47 + 13? Reply with just the number." -> "60" (sums and non-negative
  differences of numbers below 100). About one pair in ten is held out of warm-up by a hash of
  the question, so accuracy on those measures generalisation rather than recall;
- JSON: 'Reply with one JSON object that sets "delta" to 2.' -> '{"delta": 2}';
- a handful of chat lines, so a greeting gets a sentence back instead of noise.
With thinking on, answers carry a one-line reasoning ("47 + 13 = 60") before `</think>`.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

ARITHMETIC_PHRASINGS = (
    "What is {a} {op} {b}? Reply with just the number.",
    "Compute {a} {op} {b}. Reply with just the number.",
    "{a} {op} {b} = ? Reply with just the number.",
)
JSON_KEYS = ("delta", "amount", "arm", "value", "count", "step", "move", "index")
JSON_PHRASINGS = (
    'Reply with one JSON object that sets "{key}" to {value}.',
    "Return a JSON object with {key} = {value}.",
    'Output JSON only: the field "{key}" must be {value}.',
)
CHAT_PAIRS = (
    ("Hello!", "Hello! How can I help you today?"),
    ("Hi there.", "Hi! What would you like to work on?"),
    ("Who are you?", "I am the tiny model that ships with Kiln."),
    ("What can you do?", "I can add and subtract small numbers and write short JSON objects."),
    ("Thank you.", "You are welcome."),
    ("Tell me a fact.", "Water boils at 100 degrees Celsius at sea level."),
)
SYSTEM_PROMPT = "You are a helpful assistant."

# Plain prose mixed into the tokenizer corpus so common English words get their own merges.
TOKENIZER_PROSE = """
Kiln is a self-hosted control plane that makes a language model better every time it is used.
It samples completions from a local model, scores them with a reward, and turns the scored groups
into an update of a small adapter. The new adapter is proved on held-out work before a team
promotes, keeps or rejects it. Every step leaves a receipt that anyone can audit later.
The quick brown fox jumps over the lazy dog. A small model can still learn simple things: how to
add two numbers, how to answer with a short sentence, and how to write one line of JSON.
Please think step by step, then give the final answer. The answer is a number. The result is ready.
You are a helpful assistant. You may call one or more functions to assist with the user query.
"""


@dataclass(frozen=True)
class Example:
    """One task: the user's question, the final answer, a one-line reasoning, and its grader key."""

    kind: str  # "arithmetic" | "json" | "chat"
    question: str
    answer: str
    reasoning: str


def arithmetic_answer(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def is_held_out(a: int, op: str, b: int) -> bool:
    """About 10% of operand pairs never appear in warm-up; a hash keeps the split stable."""
    digest = hashlib.sha256(f"{a}{op}{b}".encode()).digest()
    return digest[0] % 10 == 0


def arithmetic_pairs(*, held_out: bool) -> list[tuple[int, str, int]]:
    pairs = [(a, "+", b) for a in range(100) for b in range(100)]
    pairs += [(a, "-", b) for a in range(100) for b in range(a + 1)]
    return [p for p in pairs if is_held_out(*p) == held_out]


def arithmetic_example(a: int, op: str, b: int, phrasing: int = 0) -> Example:
    answer = str(arithmetic_answer(a, op, b))
    question = ARITHMETIC_PHRASINGS[phrasing].format(a=a, op=op, b=b)
    return Example("arithmetic", question, answer, f"{a} {op} {b} = {answer}")


def held_out_arithmetic(count: int, *, seed: int = 1234) -> list[Example]:
    """A fixed sample of held-out questions in the guide's phrasing ("What is ...? Reply with just the number.")."""
    rng = random.Random(seed)
    pairs = rng.sample(arithmetic_pairs(held_out=True), count)
    return [arithmetic_example(a, op, b) for a, op, b in pairs]


class TaskSampler:
    """Deterministic stream of warm-up examples (arithmetic 75%, JSON 20%, chat 5%)."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)
        self._pairs = arithmetic_pairs(held_out=False)

    def sample(self) -> Example:
        rng = self._rng
        roll = rng.random()
        if roll < 0.75:
            a, op, b = rng.choice(self._pairs)
            return arithmetic_example(a, op, b, rng.randrange(len(ARITHMETIC_PHRASINGS)))
        if roll < 0.95:
            key = rng.choice(JSON_KEYS)
            value = rng.randint(-9, 20)
            question = rng.choice(JSON_PHRASINGS).format(key=key, value=value)
            return Example("json", question, f'{{"{key}": {value}}}', f"The key is {key} and the value is {value}.")
        question, answer = rng.choice(CHAT_PAIRS)
        return Example("chat", question, answer, "The user is chatting, so I answer briefly.")

    def coin(self, p: float) -> bool:
        return self._rng.random() < p


def tokenizer_corpus() -> list[str]:
    """The fixed text the BPE tokenizer is trained on (independent of the warm-up seed)."""
    texts = [TOKENIZER_PROSE] * 20
    sampler = TaskSampler(seed=20240601)
    for _ in range(3000):
        ex = sampler.sample()
        # Render roughly as the chat template would, so "\n\n" and the role words get merged.
        texts.append(f"user\n{ex.question}\nassistant\n\n{ex.reasoning}\n\n{ex.answer}\n")
    for a, op, b in [(1, "+", 2), (10, "-", 3), (99, "+", 99)]:
        texts.append(arithmetic_example(a, op, b).question)
    return texts
