"""A running Kiln (web, GPU worker, Redis; the tiny model) and an official `openai` client for it, for
the integration tests that talk to the OpenAI-compatible routes."""

from __future__ import annotations

from contextlib import contextmanager

import openai

from tests.support.stack import Stack, wait_until


@contextmanager
def openai_stack(home, tiny_model_dir, *, user: str, threads: int):
    """(stack, client): the stack is stopped (and its log tail printed) on the way out."""
    stack = Stack(home, extra_env={"KILN_MODEL_PATH": str(tiny_model_dir)})
    try:
        stack.start_web()
        token = stack.create_user(user)
        stack.start_worker("gpu-worker", "gpu,infer", threads=threads)
        wait_until(lambda: stack.health()["training_backend"]["ready"], 120, what="the model to load")
        yield stack, openai.OpenAI(base_url=stack.url + "/v1", api_key=token, max_retries=0, timeout=120)
    finally:
        print(stack.log_tail())
        stack.stop()
