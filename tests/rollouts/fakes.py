"""A fake /v1/chat/completions server answer, built the way runtime_host builds a real one.

The provenance record comes from the real `core.contracts.provenance.build_rollout_provenance`, fed
a SampleResult-shaped object, so the fakes stay in step with the record format.
"""

from __future__ import annotations

import copy
import uuid
from types import SimpleNamespace

from core.contracts.provenance import build_rollout_provenance
from evaluations.generation.template import parse_request

SHA = "sha256:" + "ab" * 32
TOKENIZER = {"vocab_sha256": "sha256:" + "01" * 32, "config_sha256": "sha256:" + "02" * 32,
             "chat_template_sha256": "sha256:" + "03" * 32}
POLICY = {"served_model_id": "kiln-tiny", "base_model_sha256": "sha256:" + "04" * 32,
          "inference_config_sha256": "sha256:" + "05" * 32, "implementation": "kiln-python-sampler"}
BACKEND = "torch-cpu"
CLOSE_IDS = [7, 8]
ADAPTER = {"name": "math-r001", "content_sha256": "sha256:" + "06" * 32}


def _sampling(body: dict) -> dict:
    parsed = parse_request(body, SimpleNamespace(id="fake"))
    record = {"temperature": float(parsed.temperature), "top_p": float(parsed.top_p), "top_k": parsed.top_k,
              "min_p": float(parsed.min_p), "max_tokens": parsed.effective_max_tokens or 256,
              "repetition_penalty": float(parsed.repetition_penalty),
              "presence_penalty": float(parsed.presence_penalty),
              "frequency_penalty": float(parsed.frequency_penalty), "stop": list(parsed.stop or [])}
    budget = {key: value for key, value in (("max_tokens", parsed.thinking_budget_tokens),
                                            ("max_time_ms", parsed.thinking_budget_ms)) if value is not None}
    if budget:
        record["thinking_budget"] = {"close_token_ids": list(CLOSE_IDS), **budget}
    return record


def answer_for(body: dict) -> str:
    """A deterministic reply: right for even seeds, wrong for odd ones (so groups have contrast)."""
    content = body["messages"][-1]["content"]
    digits = [int(t) for t in content.replace("?", " ").split() if t.isdigit()]
    total = sum(digits) if digits else 0
    return str(total if body["seed"] % 2 == 0 else total + 1)


def fake_response(body: dict, *, content: str | None = None, reasoning: str | None = None,
                  adapter: dict | None = None, forced: int = 0) -> dict:
    """The chat.completion a Kiln server would return for `body` (n=1, rollout_provenance=true)."""
    content = answer_for(body) if content is None else content
    thinking = body["chat_template_kwargs"]["enable_thinking"]
    if thinking and reasoning is None:
        reasoning = "adding the numbers"
    text = content if not thinking else reasoning + "</think>" + content
    prompt_ids = [1, 2, 3, 4, 5][: 2 + len(body["messages"])]
    completion_ids = [10 + (ord(ch) % 50) for ch in text] or [11]
    sources = ["sampled"] * len(completion_ids)
    for i in range(forced):
        completion_ids[i] = CLOSE_IDS[i % len(CLOSE_IDS)]
        sources[i] = "forced"
    identity = None
    if body["adapter"] not in (None, "", "base"):
        identity = dict(adapter or {"name": body["adapter"], "content_sha256": ADAPTER["content_sha256"]})
    policy = dict(POLICY)
    if identity is not None:
        policy["adapter"] = dict(identity)
    result = SimpleNamespace(
        prompt_token_ids=prompt_ids, completion_token_ids=completion_ids,
        token_logprobs=[-0.5] * len(completion_ids), token_sources=sources, text=text, seed=body["seed"],
        behavior_policy=policy, tokenizer=dict(TOKENIZER), sampling=_sampling(body), generation_backend=BACKEND,
        template_invocation={"tools": [], "template_kwargs": {"enable_thinking": thinking}},
    )
    messages = [{k: v for k, v in m.items() if v is not None} for m in body["messages"]]
    record = build_rollout_provenance(result, prompt_messages=messages, text=text)
    message = {"role": "assistant", "content": content}
    if thinking:
        message["reasoning_content"] = reasoning
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": 0, "model": body.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None,
                     "seed": str(body["seed"]), "adapter": identity, "rollout_provenance": record}],
        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion_ids),
                  "total_tokens": len(prompt_ids) + len(completion_ids)},
    }


class FakeServer:
    """A `post(body)` callable: answers with fake_response, optionally tampered per (task prompt, seed)."""

    def __init__(self, tamper=None):
        self.tamper = tamper
        self.bodies: list[dict] = []

    def __call__(self, body: dict) -> dict:
        self.bodies.append(copy.deepcopy(body))
        response = fake_response(body)
        if self.tamper is not None:
            response = self.tamper(body, response) or response
        return response


class FakeScore:
    """A `score(payload)` callable with the ScorerResult shape: 1.0 when content is the sum."""

    def __init__(self):
        self.payloads: list[dict] = []

    def __call__(self, payload: dict):
        self.payloads.append(payload)
        right = str(payload["task"].get("answer")) == payload["content"].strip()
        return SimpleNamespace(reward=1.0 if right else 0.0, raw_output=f"{1.0 if right else 0.0}\n", stderr_tail="",
                               elapsed_ms=1.5, sandboxed=True, mechanism="fake")
