"""The collector against fake OpenEnv servers, with a deterministic fake policy (not a model).

Seeds, seed-free reset plans, round-robin of whole groups, generation seeds, every termination,
schema-invalid actions never stepped, identity drift and budget overflow publishing nothing, and
artifacts that pass the corpus checker.
"""

import asyncio
import json

import pytest

from core.canonical import json_digest
from core.contracts.groups import admit_jsonl
from openenv.client.actions import generation_seed
from openenv.collector import CollectionError, collect
from tests.openenv.collector_fakes import FAKE_BEHAVIOR, FakeCounterPolicy, config_for, run_collection
from tests.openenv.fake_server import CounterEnv, FakeServer, error

pytestmark = pytest.mark.timeout(120)


def read(path):
    return path.read_bytes()


def lines(path):
    return [json.loads(line) for line in read(path).splitlines()]


def steps_sent(server):
    return [f for f in server.received if f.get("type") == "step"]


def test_seeds_reset_plan_round_robin_and_generation_seeds(tmp_path):
    policy = FakeCounterPolicy()
    with FakeServer() as a, FakeServer() as b:
        config = config_for([a.url, b.url], tmp_path, groups=4, group_size=2,
                            environment_reset_options=[{"seed": 999, "target": 2, "max_steps": 3}, None])
        bundle = run_collection(config, policy)
        resets_a = [f["data"] for f in a.settle().received if f["type"] == "reset"]
        resets_b = [f["data"] for f in b.settle().received if f["type"] == "reset"]
    # whole groups rotate: groups 0 and 2 on the first URL, 1 and 3 on the second; the caller seed is replaced
    assert sorted(r["seed"] for r in resets_a) == [100, 100, 102, 102]
    # each reset names the seed's episode id: every candidate of a group starts the same episode
    assert all(r == {"target": 2, "max_steps": 3, "seed": r["seed"], "episode_id": f"kiln-seed-{r['seed']}"}
               for r in resets_a)
    assert sorted(r["seed"] for r in resets_b) == [101, 101, 103, 103]
    assert all(r == {"seed": r["seed"], "episode_id": f"kiln-seed-{r['seed']}"} for r in resets_b)
    summary = bundle.summary_value
    assert summary["reset_plan_sha256"] == json_digest([{"target": 2, "max_steps": 3}, {}])
    replay = json.loads(bundle.replay)
    assert [(g["group_index"], g["environment_index"], g["seed"]) for g in replay["groups"]] == [
        (0, 0, 100), (1, 1, 101), (2, 0, 102), (3, 1, 103)]
    # generation seeds per candidate and step
    for request in policy.requests:
        group_seed = 100 + request.group_index
        assert request.seed == generation_seed(group_seed, request.candidate_index, request.step_index)
    assert {(r.candidate_index, r.step_index) for r in policy.requests} >= {(0, 0), (1, 0)}
    # the artifacts: canonical AgenticGroup JSONL that the corpus checker admits byte for byte
    data = read(config.output_path)
    assert admit_jsonl(data).jsonl == data and data == bundle.dataset
    groups = lines(config.output_path)
    assert len(groups) == 4 and all(len(g["completions"]) == 2 for g in groups)
    first = groups[0]["completions"][0]
    assert first["openenv"]["schema"] == "kiln.openenv-rollout.v1"
    assert first["openenv"]["reset_sha256"] == json_digest({"target": 2, "max_steps": 3, "seed": 100,
                                                                  "episode_id": "kiln-seed-100"})
    assert first["openenv"]["behavior_policy"] == FAKE_BEHAVIOR
    assert first["reward"] == first["openenv"]["episode_return"]
    assert groups[0]["messages"][0]["role"] == "system" and '"maximum": 3' in groups[0]["messages"][0]["content"]
    assert summary["rollout_count"] == 8 and len(summary["rollouts"]) == 8
    assert json.loads(read(config.summary_output_path)) == summary


def test_shared_reset_options_go_to_every_environment(tmp_path):
    with FakeServer() as a, FakeServer() as b:
        config = config_for([a.url, b.url], tmp_path, reset_options={"target": 1, "seed": 5})
        run_collection(config)
        resets = [f["data"] for s in (a, b) for f in s.settle().received if f["type"] == "reset"]
    assert sorted(r["seed"] for r in resets) == [100, 100, 101, 101]
    assert all(r["target"] == 1 for r in resets)


def test_thinking_keeps_reasoning_in_the_action_segment_and_steps_only_the_answer(tmp_path):
    policy = FakeCounterPolicy(reasoning="plan: go up")
    with FakeServer() as server:
        config = config_for([server.url], tmp_path, groups=1, reset_options={"target": 2})
        run_collection(config, policy)
        sent = steps_sent(server.settle())
    completion = lines(config.output_path)[0]["completions"][0]
    action = completion["trajectory"][0]
    assert action == {"role": "assistant", "content": 'plan: go up</think>{"delta": 2}', "kind": "action"}
    assert sent[0]["data"] == {"delta": 2}
    assert all("plan" not in json.dumps(f) for f in sent)
    assert completion["trajectory"][1]["kind"] == "observation" and completion["trajectory"][1]["role"] == "tool"


def test_thinking_off_keeps_the_answer_only(tmp_path):
    policy = FakeCounterPolicy()
    with FakeServer() as server:
        config = config_for([server.url], tmp_path, groups=1, thinking=False, reset_options={"target": 1})
        run_collection(config, policy)
    action = lines(config.output_path)[0]["completions"][0]["trajectory"][0]
    assert action["content"] == '{"delta": 1}'
    assert all(r.sampling.thinking is False for r in policy.requests)


def test_max_steps_termination(tmp_path):
    with FakeServer() as server:
        config = config_for([server.url], tmp_path, groups=1, max_steps=1, reset_options={"target": 6})
        bundle = run_collection(config, FakeCounterPolicy())
    stats = bundle.summary_value["stats"]
    assert stats["max_steps_count"] == 2 and stats["total_environment_steps"] == 2
    replay = json.loads(bundle.replay)
    assert all("final_state" in c for c in replay["groups"][0]["candidates"])


@pytest.mark.parametrize(("content", "code"), [
    ("", "MODEL_ACTION_NO_OUTPUT"),
    ("move up please", "INVALID_MODEL_ACTION"),
    ('{"delta": 9}', "ACTION_SCHEMA_VALIDATION_FAILED"),
    ('```json\n{"delta": 1, "speed": 2}\n```', "ACTION_SCHEMA_VALIDATION_FAILED"),
])
def test_invalid_model_actions_never_reach_the_server(tmp_path, content, code):
    policy = FakeCounterPolicy(reasoning="still thinking", content=lambda request: content)
    with FakeServer() as server:
        config = config_for([server.url], tmp_path, groups=1, protocol_error_reward=-0.5)
        bundle = run_collection(config, policy)
        assert steps_sent(server.settle()) == []  # nothing was stepped
    completion = lines(config.output_path)[0]["completions"][0]
    assert completion["openenv"]["termination"] == "invalid_model_action"
    assert completion["reward"] == -0.5 and completion["openenv"]["steps"] == 0
    action, harness = completion["trajectory"]
    if code == "MODEL_ACTION_NO_OUTPUT":
        assert action["content"] == "still thinking"  # kept, never closed by an invented </think>
    else:
        assert action["content"] == "still thinking</think>" + content
    body = json.loads(harness["content"])
    assert body["openenv_harness_error"]["code"] == code and body["done"] is True
    assert harness["warning_prefix_len"] == len(harness["content"].encode())
    candidate = json.loads(bundle.replay)["groups"][0]["candidates"][0]
    assert candidate["harness_error"]["code"] == code and candidate["exchanges"] == []
    if code == "ACTION_SCHEMA_VALIDATION_FAILED":
        assert candidate["harness_error"]["errors"][0]["keyword"] in ("maximum", "additionalProperties")


class FailingEnv(CounterEnv):
    def step(self, data):
        return error("the environment broke", "EXECUTION_ERROR")


class SessionErrorEnv(CounterEnv):
    def step(self, data):
        return error("session lost", "SESSION_ERROR")


def test_recoverable_errors_are_feedback_then_end_as_protocol_error(tmp_path):
    with FakeServer(env_factory=FailingEnv) as server:
        config = config_for([server.url], tmp_path, groups=1, group_size=1, max_recoverable_errors=1)
        bundle = run_collection(config, FakeCounterPolicy())
        assert len(steps_sent(server.settle())) == 2
    candidate = json.loads(bundle.replay)["groups"][0]["candidates"][0]
    assert [e["result"]["continued"] for e in candidate["exchanges"]] == [True, False]
    assert candidate["termination"] == "protocol_error" and candidate["protocol_error_code"] == "EXECUTION_ERROR"
    assert candidate["episode_return"] == -2.0 and candidate["recoverable_protocol_errors"] == 2
    assert "final_state" in candidate
    trajectory = lines(config.output_path)[0]["completions"][0]["trajectory"]
    errors = [s for s in trajectory if s["kind"] == "observation"]
    assert [json.loads(s["content"])["recoverable"] for s in errors] == [True, True]
    assert all(s["warning_prefix_len"] == len(s["content"].encode()) for s in errors)
    assert bundle.summary_value["stats"]["recoverable_protocol_error_count"] == 2


def test_a_terminal_code_ends_the_candidate_without_a_final_state(tmp_path):
    with FakeServer(env_factory=SessionErrorEnv) as server:
        config = config_for([server.url], tmp_path, groups=1, group_size=1)
        bundle = run_collection(config, FakeCounterPolicy())
    candidate = json.loads(bundle.replay)["groups"][0]["candidates"][0]
    assert candidate["termination"] == "protocol_error" and candidate["protocol_error_code"] == "SESSION_ERROR"
    assert "final_state" not in candidate and len(candidate["exchanges"]) == 1
    assert bundle.summary_value["stats"]["protocol_error_count"] == 1


def _existing_outputs(config):
    for path in (config.output_path, config.replay_output_path, config.summary_output_path):
        path.write_bytes(b"old " + path.name.encode())


def _unchanged(config):
    return all(p.read_bytes() == b"old " + p.name.encode()
               for p in (config.output_path, config.replay_output_path, config.summary_output_path))


def test_identity_change_after_the_last_episode_publishes_nothing(tmp_path):
    with FakeServer() as server:
        inner = FakeCounterPolicy()

        async def drifting(request):
            server.documents["/metadata"]["version"] = "0.2.0"  # redeployed while episodes run
            return await inner(request)

        config = config_for([server.url], tmp_path, groups=1)
        _existing_outputs(config)
        with pytest.raises(CollectionError) as info:
            run_collection(config, drifting)
    assert info.value.code == "environment_identity_changed"
    assert info.value.stage == "identity_verification" and info.value.failure_code == "environment_identity_changed"
    assert "discovery_sha256" in info.value.message
    assert _unchanged(config)


def test_the_retained_bytes_budget_aborts_with_nothing_published(tmp_path):
    with FakeServer() as server:
        config = config_for([server.url], tmp_path, retained_bytes_limit=3000, concurrency=2)
        with pytest.raises(CollectionError) as info:
            run_collection(config)
    assert info.value.code == "openenv_budget_exceeded"
    assert not config.output_path.exists() and not config.summary_output_path.exists()


def test_the_behavior_policy_must_not_change(tmp_path):
    changed = dict(FAKE_BEHAVIOR, inference_config_sha256="sha256:" + "99" * 32)
    policy = FakeCounterPolicy(behavior=lambda r: changed if r.candidate_index == 1 else FAKE_BEHAVIOR)
    with FakeServer() as server:
        config = config_for([server.url], tmp_path, groups=1, concurrency=1)
        with pytest.raises(CollectionError) as info:
            run_collection(config, policy)
    assert info.value.code == "openenv_behavior_policy_changed" and "inference_config_sha256" in info.value.message
    assert not config.output_path.exists()


class RandomResetEnv(CounterEnv):
    count = 0

    def reset(self, data):
        RandomResetEnv.count += 1
        return super().reset({**data, "target": RandomResetEnv.count % 5 + 1})


def test_a_group_whose_resets_differ_is_rejected(tmp_path):
    with FakeServer(env_factory=RandomResetEnv) as server:
        config = config_for([server.url], tmp_path, groups=1)
        with pytest.raises(CollectionError) as info:
            run_collection(config)
    assert info.value.code == "openenv_reset_not_identical"
    assert "(first difference at reset.observation.target)" in info.value.message
    assert "`seed`" in info.value.hint and "episode_id" in info.value.hint


def test_configuration_bounds_fail_before_any_connection(tmp_path):
    with FakeServer() as a, FakeServer() as b:
        for overrides, text in (({"groups": 1}, "groups must be at least"),
                                ({"reset_options": {}, "environment_reset_options": [{}, {}]}, "not both"),
                                ({"environment_reset_options": [{}]}, "environment_reset_options"),
                                ({"thinking": False, "thinking_budget_tokens": 8}, "thinking"),
                                ({"max_action_tokens": 256, "thinking_budget_tokens": 300},
                                 "thinking_budget_tokens must be an integer in 1..255"),
                                ({"max_action_tokens": 256, "thinking_budget_tokens": 256}, "1..255"),
                                ({"capacity_wait_seconds": 0}, "capacity_wait_seconds")):
            config = config_for([a.url, b.url], tmp_path, **overrides)
            with pytest.raises(CollectionError) as info:
                asyncio.run(collect(config, FakeCounterPolicy()))
            assert info.value.code == "openenv_invalid_collection" and text in info.value.message
        assert a.request_headers == [] and b.request_headers == []


def test_the_rollout_cli_bounds_the_thinking_budget_by_the_action_tokens(tmp_path, capsys):
    """The same bound as POST /v1/openenv/runs: one line, non-zero, before any connection."""
    from kiln_project.cli.main import main

    with FakeServer() as server:
        assert main(["openenv", "rollout", server.url, "--max-action-tokens", "256", "--thinking-budget-tokens", "300",
                     "--output", str(tmp_path / "o.jsonl")]) == 1
        assert server.request_headers == []
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: openenv_invalid_collection: thinking_budget_tokens must be an integer in 1..255")
    assert "\n" not in err


def test_capacity_of_one_session_is_retried_and_counted(tmp_path):
    with FakeServer(max_sessions=1) as server:
        config = config_for([server.url], tmp_path, groups=1, group_size=2, concurrency=2, capacity_wait_seconds=30)
        bundle = run_collection(config)
    stats = bundle.summary_value["stats"]
    assert stats["capacity_retry_count"] >= 1 and stats["done_count"] + stats["max_steps_count"] == 2


def test_an_observations_input_text_is_the_prompt_verbatim_else_the_whole_wire_json():
    """The guide: "Optional observation input_text is pasted verbatim as the model-facing prompt, while the
    complete wire observation remains in rollout and replay provenance. Observations without that optional
    profile use the complete wire JSON.\""""
    from openenv.collector.prompts import observation_text

    with_text = {"observation": {"input_text": "Board:\n X | O \n  Your move?", "board": [1, 2]}, "reward": 0.5,
                 "done": False}
    assert observation_text(with_text, "step") == "Board:\n X | O \n  Your move?"
    plain = {"observation": {"board": [1, 2], "input_text": ""}, "reward": None, "done": False, "metadata": {"k": 1}}
    assert observation_text(plain, "reset") == (
        "OpenEnv reset result (observation, reward, done, and optional metadata JSON):\n"
        '{"observation":{"board":[1,2],"input_text":""},"reward":null,"done":false,"metadata":{"k":1}}')
    assert observation_text({"observation": {"input_text": 7}, "reward": 0, "done": True}, "step").endswith(
        '{"observation":{"input_text":7},"reward":0,"done":true}')
