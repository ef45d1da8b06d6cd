"""Synthetic tasks and the built-in tokenizer corpus for Kiln's tiny model. Pure Python; imports no Django.

Five task families, each a prompt and a short assistant answer:
- arithmetic: "What is 47 + 13? Reply with just the number." -> "60": sums of two operands,
  each one digit or two with even odds, so questions range from easy to hard. About one pair in
  ten is held out of warm-up by a hash of the question, so accuracy on those measures
  generalisation rather than recall;
- open arithmetic, the demo task with headroom: "What is 47 + 13?" with no format asked for. The
  warm-up answers it the way a chatty model does: most often by announcing the sum instead of
  giving it ("Let me add 47 and 13."), otherwise with the number ("60"). Under a last-integer
  scorer only the number counts, so the base model is far below its arithmetic ceiling here
  and GRPO has a format to learn (docs/tiny-model.md, examples/grpo-math/);
- JSON: 'Reply with one JSON object that sets "delta" to 2.' -> '{"delta": 2}';
- OpenEnv actions: Kiln's OpenEnv system prompt for a synthetic environment, an observation, a
  schema-valid JSON action (`gpu_runtime.tiny_openenv_tasks`);
- a handful of chat lines, so a greeting gets a sentence back instead of noise.
With thinking on, answers carry a one-line reasoning ("47 + 13 = 60") before `</think>`.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

from gpu_runtime.tiny_openenv_tasks import openenv_episode

ARITHMETIC_PHRASINGS = (
    "What is {a} + {b}? Reply with just the number.",
    "Compute {a} + {b}. Reply with just the number.",
    "{a} + {b} = ? Reply with just the number.",
)
OPEN_ARITHMETIC_PHRASINGS = ("What is {a} + {b}?", "Add {a} and {b}.")
# How the warm-up answers an open sum: (share, template). Announcing wins the first token, so the
# base model's greedy answer is usually the announcement; sampled, under half of its answers are a
# number at all. The bare number reuses the skill the "Reply with just the number." phrasing trains.
OPEN_ARITHMETIC_STYLES = (
    (0.55, "Let me add {a} and {b}."),
    (0.45, "{s}"),
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
    ("What can you do?", "I can add small numbers and write short JSON objects."),
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
Training data arrives in groups. Each group holds several completions for the same prompt, and
each completion has a reward. Completions that beat their group's average are reinforced, and the
others are discouraged. A reviewer reads the evaluation report, compares the candidate with the
baseline on questions it never saw, and decides whether to promote it.
Good morning! How are you today? I would like to know what time the meeting starts tomorrow.
Please write a short summary of the document, then list three questions about it. Thanks for
your help; the weather was lovely this weekend, and we walked along the river near the old bridge.
Numbers, dates and names matter: write the year, the month and the day clearly. Check each
calculation twice before you answer, because a careful answer is better than a quick guess.
The server returned an error code, so the client retried the request after a short delay.
Open the file, read every line, count the words, and print the total at the end of the report.
Science explains how plants turn sunlight into energy, why the ocean has tides, and how birds
navigate across continents. History remembers kings, farmers, inventors and travellers; music and
painting remember feelings. Children learn to summarize stories, organize ideas and recognize
patterns long before they study algebra, chemistry, physics or biology at school.
Computers store information in memory, process instructions quickly, and communicate over
networks. Developers describe functions, variables, parameters, objects and exceptions, and they
test their programs thoroughly so that users can rely on them every single day.
"""


@dataclass(frozen=True)
class Example:
    """One task: the user's question, the final answer, a one-line reasoning, and its grader key."""

    kind: str  # "arithmetic" | "open_arithmetic" | "json" | "openenv" | "chat"
    question: str
    answer: str
    reasoning: str
    # The whole prompt when it is more than one user turn (OpenEnv: system prompt, observations and
    # earlier actions); None: a single user turn holding `question`.
    messages: tuple[dict, ...] | None = None


def is_held_out(a: int, b: int) -> bool:
    """About 10% of operand pairs never appear in warm-up; a hash keeps the split stable."""
    digest = hashlib.sha256(f"{a}+{b}".encode()).digest()
    return digest[0] % 10 == 0


def draw_operand(rng: random.Random) -> int:
    """One digit or two, with even odds: single-digit sums are learnt first, so the questions span
    easy to hard and a GRPO group on a middling question sees both right and wrong answers."""
    return rng.randrange(10) if rng.random() < 0.5 else rng.randrange(10, 100)


def draw_arithmetic(rng: random.Random, *, held_out: bool) -> tuple[int, int]:
    """Random operands (a, b) of a sum on the requested side of the held-out split.

    Addition only: with subtraction mixed in, the warm-up budget leaves the model below 25% on
    held-out sums instead of around half (measured; see docs/tiny-model.md)."""
    while True:
        a, b = draw_operand(rng), draw_operand(rng)
        if is_held_out(a, b) == held_out:
            return a, b


def arithmetic_example(a: int, b: int, phrasing: int = 0) -> Example:
    question = ARITHMETIC_PHRASINGS[phrasing].format(a=a, b=b)
    return Example("arithmetic", question, str(a + b), f"{a} + {b} = {a + b}")


def open_arithmetic_example(a: int, b: int, phrasing: int = 0) -> Example:
    """The headroom task's question; `answer` is the sum (what a last-integer scorer checks)."""
    question = OPEN_ARITHMETIC_PHRASINGS[phrasing].format(a=a, b=b)
    return Example("open_arithmetic", question, str(a + b), f"{a} + {b} = {a + b}")


def open_arithmetic_reply(rng: random.Random, a: int, b: int) -> str:
    roll, floor = rng.random(), 0.0
    for share, template in OPEN_ARITHMETIC_STYLES:
        floor += share
        if roll < floor:
            return template.format(a=a, b=b, s=a + b)
    return OPEN_ARITHMETIC_STYLES[-1][1].format(a=a, b=b, s=a + b)


def held_out_open_arithmetic(count: int, *, seed: int = 4321) -> list[Example]:
    """Held-out operand pairs in the headroom task's phrasing ("What is A + B?")."""
    rng = random.Random(seed)
    return [open_arithmetic_example(*draw_arithmetic(rng, held_out=True)) for _ in range(count)]


def held_out_arithmetic(count: int, *, seed: int = 1234) -> list[Example]:
    """A fixed sample of held-out questions in the guide's phrasing ("What is ...? Reply with just the number.")."""
    rng = random.Random(seed)
    return [arithmetic_example(*draw_arithmetic(rng, held_out=True)) for _ in range(count)]


class TaskSampler:
    """Deterministic stream of warm-up examples (arithmetic 68%, open arithmetic 12%, JSON 8%,
    OpenEnv actions 9%, chat 3%)."""

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def sample(self) -> Example:
        rng = self._rng
        roll = rng.random()
        if roll < 0.68:
            a, b = draw_arithmetic(rng, held_out=False)
            return arithmetic_example(a, b, rng.randrange(len(ARITHMETIC_PHRASINGS)))
        if roll < 0.80:
            a, b = draw_arithmetic(rng, held_out=False)
            example = open_arithmetic_example(a, b, rng.randrange(len(OPEN_ARITHMETIC_PHRASINGS)))
            return Example("open_arithmetic", example.question, open_arithmetic_reply(rng, a, b), example.reasoning)
        if roll < 0.88:
            key = rng.choice(JSON_KEYS)
            value = rng.randint(-9, 20)
            question = rng.choice(JSON_PHRASINGS).format(key=key, value=value)
            return Example("json", question, f'{{"{key}": {value}}}', f"{key} = {value}")
        if roll < 0.97:
            messages, action, reasoning = openenv_episode(rng)
            return Example("openenv", messages[-1]["content"], action, reasoning, tuple(messages))
        question, answer = rng.choice(CHAT_PAIRS)
        return Example("chat", question, answer, "A short reply.")

    def coin(self, p: float) -> bool:
        return self._rng.random() < p

    def draw(self, thinking_fraction: float, system_fraction: float) -> tuple[Example, bool, bool]:
        """(Example, thinking, with_system): the example first, then its two coins (the recipe's order)."""
        return self.sample(), self.coin(thinking_fraction), self.coin(system_fraction)


def tokenizer_corpus() -> list[str]:
    """The fixed text the BPE tokenizer is trained on (independent of the warm-up seed)."""
    texts = [TOKENIZER_PROSE] * 20
    sampler = TaskSampler(seed=20240601)
    for _ in range(3000):
        ex = sampler.sample()
        # Render roughly as the chat template would, so "\n\n" and the role words get merged.
        prompt = "\n".join(f"{m['role']}\n{m['content']}" for m in ex.messages) if ex.messages else f"user\n{ex.question}"
        texts.append(f"{prompt}\nassistant\n\n{ex.reasoning}\n\n{ex.answer}\n")
    for a, b in [(1, 2), (10, 3), (99, 99)]:
        texts.append(arithmetic_example(a, b).question)
    return texts
