"""`kiln train grpo --file F`: JSONL of groups goes by the streamed route (`dataset_path`, read by the
server); a JSON batch (a list) or a request object goes inline as written. Before, a JSON batch in
a dataset root was sent as `dataset_path` and the server, reading lines, refused it."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest

from kiln_project.cli.train_cmd import _submit_grpo

GROUP = {"messages": [{"role": "user", "content": "hi"}],
         "completions": [{"text": "a", "reward": 1}, {"text": "b", "reward": 0}]}


class Client:
    def __init__(self):
        self.posts = []

    def post(self, path, json):
        self.posts.append(json)
        return {"job_id": "j"}


def _args(path):
    return Namespace(file=path, adapter="inl-3", lora_rank=None, checkpoint_interval=None, resume_checkpoint=None,
                     no_shared_prefix_reference=False)


@pytest.mark.parametrize(("text", "streamed"), [
    (json.dumps(GROUP) + "\n" + json.dumps(GROUP) + "\n", True),  # JSONL
    (json.dumps(GROUP) + "\n", True),  # JSONL of one line
    (json.dumps([GROUP, GROUP]), False),  # a JSON batch
    (json.dumps({"groups": [GROUP]}), False),  # a request with only groups
    (json.dumps({"groups": [GROUP], "config": {"kl_coeff": 0.2}}), False),
])
def test_only_jsonl_goes_by_dataset_path(tmp_path, text, streamed):
    path = tmp_path / "batch.json"
    path.write_text(text)
    client = Client()
    _submit_grpo(client, _args(path))
    [body] = client.posts
    assert ("dataset_path" in body) is streamed and ("groups" in body) is not streamed
    if streamed:
        assert body["dataset_path"] == str(path.resolve())
    else:
        assert all(group == GROUP for group in body["groups"])
    assert body["config"]["output_name"] == "inl-3"
