"""SageMaker AI MTRL compatibility, checked with the real ``sagemaker-train`` package, offline.

Its bearer tokens are SigV4 presigns computed locally from AWS credentials,
so dummy credentials do. An agent written for SageMaker's adapters (no mtrl
code) trains against the coordinator in compatibility mode on loopback.
"""

from __future__ import annotations

import base64
import time

import httpx
import openai
import pytest
import requests

from _adapter_support import (
    CRASH_KEY,
    ERROR_KEY,
    OFFSET,
    TOOLS,
    agent_process,
    key_of,
    policy,
    run_all,
    specs,
    tasks,
    value_of,
)
from mtrl_adapters.wire import trajectory_id
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.executors import HttpExecutor
from mtrl_runtime.server import _compat_routes
from mtrl_runtime.server._compat_routes import sigv4_problem
from mtrl_runtime.testing import free_port
from mtrl_runtime.types import RolloutStatus, Task

pytest.importorskip("sagemaker.train.rft")
from sagemaker.core.token_generator import generate_token  # noqa: E402
from sagemaker.train.rft import RolloutFeedbackClient  # noqa: E402

DUMMY_AWS = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "dummy-secret", "AWS_REGION": "local"}


@pytest.fixture
def aws(monkeypatch):
    for name, value in DUMMY_AWS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def _compat(**server):
    """Compat mode, verifying SigV4 tokens against the dummy credentials the agents sign with."""
    credentials = {"sagemaker_access_key_id": DUMMY_AWS["AWS_ACCESS_KEY_ID"],
                   "sagemaker_secret": DUMMY_AWS["AWS_SECRET_ACCESS_KEY"]}
    return MtrlConfig.from_dict({"advanced": {"server": {"sagemaker_compat": True, **credentials, **server}}})


def _metadata(handle, spec):
    """The metadata HttpExecutor hands the rollout's agent (its trajectory id carries the rollout's MAC)."""
    return HttpExecutor(handle.url).request_body(spec)["metadata"]


def _one_turn(handle, spec, token, trajectory=None):
    """A model call named by SageMaker's header, with SageMaker's bearer token."""
    trajectory = trajectory or trajectory_id(spec.rollout_id, spec.token)
    client = openai.OpenAI(base_url=f"{handle.url}/v1", api_key=token, max_retries=0,
                           default_headers={"X-Amzn-SageMaker-Trajectory-Id": trajectory,
                                            "X-Amzn-SageMaker-Job-Arn": "arn:mtrl:local:job/test"})
    return client.chat.completions.create(model="policy", messages=[{"role": "user", "content": spec.task.prompt}])


def test_sigv4_tokens_are_checked_for_shape_and_expiry(aws):
    token = generate_token(region="local")
    assert sigv4_problem(token) is None
    assert "expired" in sigv4_problem(token, now=time.time() + 13 * 3600)
    assert "does not start" in sigv4_problem("sk-something")
    decoded = base64.b64decode(token[len("sagemaker-api-key-"):]).decode()
    tampered = "sagemaker-api-key-" + base64.b64encode(decoded.replace("X-Amz-Signature=", "X-Amz-Signature=zz").encode()).decode()
    assert "X-Amz-Signature" in sigv4_problem(tampered)
    assert "base64" in sigv4_problem("sagemaker-api-key-@@@")


def _port_without_404() -> int:
    """A free loopback port with no "404" in it: SageMaker's ``update_reward`` takes any error whose text holds "404",
    the URL included, for a missing trajectory and only logs it (a 409 on port 44045 passed silently)."""
    while True:
        port = free_port()
        if "404" not in str(port):
            return port


def test_feedback_client_completes_then_rewards(served, tiny_tok, aws):
    handle = served(ScriptedEngine(tiny_tok, policy), _compat(), port=_port_without_404())
    done, failed = specs(handle, tasks(2))
    _one_turn(handle, done, generate_token(region="local"))
    feedback = RolloutFeedbackClient(_metadata(handle, done))

    feedback.complete_rollout()  # SageMaker's order: complete first...
    assert handle.store.get_rollout(done.rollout_id).status is RolloutStatus.RUNNING  # ...waits for its reward
    feedback.update_reward([0.7])
    record = handle.store.get_rollout(done.rollout_id)
    assert (record.status, record.reward, record.reward_defaulted) == (RolloutStatus.COMPLETED, 0.7, False)
    assert len(record.turns) == 1
    feedback.update_reward(0.7)  # repeating is fine
    with pytest.raises(requests.HTTPError, match="409"):
        feedback.update_reward(0.1)  # a different reward after the end is refused
    assert handle.store.get_rollout(done.rollout_id).reward == 0.7

    assert handle.coordinator.counters["compat_sigv4_accepted"] >= 4


def test_a_failure_without_an_executor_ends_with_a_text_after_the_grace(served, tiny_tok, aws, monkeypatch):
    """SageMaker's report_error sends no text; with no executor to give one, the grace end names what happened."""
    monkeypatch.setattr(_compat_routes, "FAILURE_TEXT_GRACE_S", 0.3)
    handle = served(ScriptedEngine(tiny_tok, policy), _compat())
    [failed] = specs(handle, tasks(1))
    RolloutFeedbackClient(_metadata(handle, failed)).report_error("the agent broke")
    assert handle.store.get_rollout(failed.rollout_id).status is RolloutStatus.RUNNING  # waits for a text
    deadline = time.monotonic() + 10
    while handle.store.get_rollout(failed.rollout_id).status is RolloutStatus.RUNNING and time.monotonic() < deadline:
        time.sleep(0.05)
    record = handle.store.get_rollout(failed.rollout_id)
    assert (record.status, record.reward, record.reward_defaulted) == (RolloutStatus.FAILED, 0.0, False)
    assert "Status 'failed' to /complete-rollout" in record.error and "no executor answered" in record.error


def test_a_sigv4_token_reports_only_for_the_rollout_it_was_handed(served, tiny_tok, aws):
    """A verified SigV4 token stands for the run: a report needs the rollout's MAC'd trajectory id."""
    handle = served(ScriptedEngine(tiny_tok, policy), _compat())
    mine, other = specs(handle, tasks(2))
    headers = {"authorization": f"Bearer {generate_token(region='local')}"}
    mac = trajectory_id(mine.rollout_id, mine.token).split(".")[1]
    for forged in (other.rollout_id, f"{other.rollout_id}.{mac}", f"{other.rollout_id}.{'0' * 32}"):
        for path, body in (("/update-reward", {"Rewards": [1.0]}), ("/complete-rollout", {"Status": "ready"})):
            response = httpx.post(handle.url + path, json={"TrajectoryId": forged, **body}, headers=headers)
            assert response.status_code == 401, (forged, path, response.text)
        with pytest.raises(openai.AuthenticationError):
            _one_turn(handle, other, headers["authorization"][7:], trajectory=forged)
    record = handle.store.get_rollout(other.rollout_id)
    assert (record.status, record.reward, record.turns) == (RolloutStatus.RUNNING, None, ())
    # the same reports with the rollout's own MAC'd id are accepted
    _one_turn(handle, mine, headers["authorization"][7:])
    feedback = RolloutFeedbackClient(_metadata(handle, mine))
    feedback.report_complete(1.0)
    assert handle.store.get_rollout(mine.rollout_id).status is RolloutStatus.COMPLETED
    # the rollout's own token needs no MAC
    response = httpx.post(handle.url + "/update-reward", json={"TrajectoryId": other.rollout_id, "Rewards": [0.5]},
                          headers={"authorization": f"Bearer {other.token}"})
    assert response.status_code == 200 and handle.store.get_rollout(other.rollout_id).reward == 0.5


def test_a_header_that_disagrees_with_the_path_wins_and_is_counted(served, tiny_tok, aws):
    handle = served(ScriptedEngine(tiny_tok, policy), _compat())
    first, second = specs(handle, tasks(2))
    sigv4 = generate_token(region="local")
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{trajectory_id(first.rollout_id, first.token)}/v1",
                           api_key=sigv4, max_retries=0,
                           default_headers={"X-Amzn-SageMaker-Trajectory-Id": trajectory_id(second.rollout_id, second.token)})
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": second.task.prompt}])
    assert len(handle.store.get_rollout(second.rollout_id).turns) == 1
    assert handle.store.get_rollout(first.rollout_id).turns == ()
    assert handle.coordinator.counters["attribution_header_over_path"] == 1
    # mtrl's own header against the trajectory header: nothing says which is meant
    response = httpx.post(handle.url + "/v1/chat/completions",
                          json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
                          headers={"authorization": f"Bearer {sigv4}", "x-mtrl-rollout-id": first.rollout_id,
                                   "x-amzn-sagemaker-trajectory-id": trajectory_id(second.rollout_id, second.token)})
    assert response.status_code == 400 and "x-mtrl-rollout-id names rollout" in response.text


def test_mtrls_own_header_over_the_path_is_checked_against_the_headers_rollout(served, tiny_tok):
    """Outside compat mode the same rule: the header decides, and its rollout's token is required."""
    handle = served(ScriptedEngine(tiny_tok, policy))
    first, second = specs(handle, tasks(2))
    body = {"model": "policy", "messages": [{"role": "user", "content": second.task.prompt}]}
    path = f"{handle.url}/rollouts/{first.rollout_id}/v1/chat/completions"
    response = httpx.post(path, json=body, headers={"authorization": f"Bearer {first.token}",
                                                    "x-mtrl-rollout-id": second.rollout_id})
    assert response.status_code == 403  # the path's token does not open the header's rollout
    response = httpx.post(path, json=body, headers={"authorization": f"Bearer {second.token}",
                                                    "x-mtrl-rollout-id": second.rollout_id})
    assert response.status_code == 200
    assert (len(handle.store.get_rollout(first.rollout_id).turns), len(handle.store.get_rollout(second.rollout_id).turns)) == (0, 1)
    assert handle.coordinator.counters["attribution_header_over_path"] == 2


def test_instance_carries_the_dataset_rows_keys_at_the_top_level(served, tiny_tok):
    from mtrl_runtime.rollouts import task_from_row

    handle = served(ScriptedEngine(tiny_tok, policy))
    row = {"id": "q1", "prompt": "What is 6 x 7?", "answer": "42", "data": {"source": "gsm"}, "ground_truth": "42"}
    [spec] = specs(handle, [task_from_row(row)])
    instance = HttpExecutor(handle.url).request_body(spec)["instance"]
    assert instance["answer"] == "42" and instance["source"] == "gsm"  # the row's own keys, at the top level
    assert {k: instance[k] for k in ("id", "prompt", "ground_truth")} == {"id": "q1", "prompt": "What is 6 x 7?",
                                                                         "ground_truth": "42"}
    assert instance["data"] == {"source": "gsm", "answer": "42"} and instance["split"] == "train"
    collide = Task(id="t", prompt="p", data={"prompt": "a data entry named prompt", "k": 1})
    [spec] = specs(handle, [collide])
    instance = HttpExecutor(handle.url).request_body(spec)["instance"]
    assert instance["prompt"] == "p" and instance["data"]["prompt"] == "a data entry named prompt"  # the field wins
    from mtrl_adapters import AgentTask

    task = AgentTask.from_instance(instance, "fallback")  # mtrl's agent server reads the same instance back
    assert (task.id, task.prompt, dict(task.data)) == ("t", "p", {"prompt": "a data entry named prompt", "k": 1})


def test_sigv4_tokens_are_refused_outside_compat_mode_or_loopback(served, tiny_tok, aws):
    token = generate_token(region="local")
    plain = served(ScriptedEngine(tiny_tok, policy))
    [spec] = specs(plain, tasks(1))
    with pytest.raises(openai.PermissionDeniedError, match="the token does not belong to this rollout"):
        client = openai.OpenAI(base_url=f"{plain.url}/rollouts/{spec.rollout_id}/v1", api_key=token, max_retries=0)
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
    assert httpx.post(plain.url + "/complete-rollout", json={"TrajectoryId": spec.rollout_id}).status_code == 404

    exposed = served(ScriptedEngine(tiny_tok, policy), _compat(host="0.0.0.0", api_key="k"))  # bound to 127.0.0.1 here
    [spec] = specs(exposed, tasks(1))
    with pytest.raises(openai.AuthenticationError, match="accepted only on loopback"):
        _one_turn(exposed, spec, token)
    response = httpx.post(exposed.url + "/update-reward",
                          json={"TrajectoryId": trajectory_id(spec.rollout_id, spec.token), "Rewards": [1.0]},
                          headers={"authorization": f"Bearer {token}"})
    assert response.status_code == 401 and "advanced.server.sagemaker_compat_remote" in response.text
    assert exposed.store.get_rollout(spec.rollout_id).reward is None


def test_compat_remote_accepts_verified_tokens_off_loopback_and_still_checks_them(served, tiny_tok, aws):
    """sagemaker_compat_remote: a non-loopback bind takes SigV4 tokens, each one verified all the same."""
    remote = served(ScriptedEngine(tiny_tok, policy), _compat(host="0.0.0.0", api_key="k", sagemaker_compat_remote=True))
    [spec] = specs(remote, tasks(1))
    tid = trajectory_id(spec.rollout_id, spec.token)
    _one_turn(remote, spec, generate_token(region="local"))
    forged = {"authorization": "Bearer sagemaker-api-key-bm90IGEgdG9rZW4="}
    response = httpx.post(remote.url + "/update-reward", json={"TrajectoryId": tid, "Rewards": [1.0]}, headers=forged)
    assert response.status_code == 401 and remote.store.get_rollout(spec.rollout_id).reward is None
    RolloutFeedbackClient(_metadata(remote, spec)).report_complete(1.0)
    record = remote.store.get_rollout(spec.rollout_id)
    assert (record.status, record.reward, len(record.turns)) == (RolloutStatus.COMPLETED, 1.0, 1)


def test_compat_routes_refuse_bad_input(served, tiny_tok, aws):
    handle = served(ScriptedEngine(tiny_tok, policy), _compat())
    [spec] = specs(handle, tasks(1))
    headers = {"authorization": f"Bearer {generate_token(region='local')}"}
    post = lambda path, body: httpx.post(handle.url + path, json=body, headers=headers)  # noqa: E731
    tid = trajectory_id(spec.rollout_id, spec.token)
    response = post("/complete-rollout", {"TrajectoryId": tid, "Status": "sideways"})
    assert response.status_code == 400 and "Status: unknown value 'sideways'" in response.text
    response = post("/update-reward", {"TrajectoryId": tid, "Rewards": []})
    assert response.status_code == 400 and "Rewards" in response.text
    response = post("/update-reward", {"TrajectoryId": tid, "Rewards": [0.1, 0.2]})
    assert response.status_code == 400 and "turn_rewards has 2 values" in response.text  # no turns yet
    response = post("/update-reward", {"TrajectoryId": "r-unknown." + "0" * 32, "Rewards": [1.0]})
    assert response.status_code == 404
    response = post("/update-reward", {"TrajectoryId": tid[:-1] + "x", "Rewards": [1.0]})
    assert response.status_code == 401 and "does not carry rollout" in response.text
    response = httpx.post(handle.url + "/update-reward", json={"TrajectoryId": tid, "Rewards": [1.0]},
                          headers={"authorization": "Bearer sagemaker-api-key-bm90IGEgdG9rZW4="})
    assert response.status_code == 401 and "not valid" in response.text
    record = handle.store.get_rollout(spec.rollout_id)
    assert (record.status, record.reward, record.turn_rewards) == (RolloutStatus.RUNNING, None, None)


async def test_sagemaker_strands_agent_on_agentcore_trains_against_mtrl(served, tiny_tok, aws):
    """sagemaker_rft_handler + wrap_model(OpenAIModel) + RolloutFeedbackClient, unchanged, on app.run()."""
    handle = served(ScriptedEngine(tiny_tok, policy), _compat())
    with agent_process("sagemaker", handle.url, health="/ping", env=DUMMY_AWS, timeout=120) as (_, url, _):
        runs = [s for s in specs(handle, tasks(6)) if "K05" not in s.task.prompt]  # this agent has no crash path
        outcomes = await run_all(HttpExecutor.for_agentcore(url, coordinator=handle.coordinator), runs)
        for spec, outcome in zip(runs, outcomes):
            record = handle.store.get_rollout(spec.rollout_id)
            assert outcome.status is RolloutStatus.COMPLETED, outcome.error
            assert record.turn_rewards == tuple([0.0] * (len(record.turns) - 1) + [1.0])
            assert not record.reward_defaulted
            for turn in record.turns:  # attributed by the X-Amzn-SageMaker-Trajectory-Id header
                assert spec.task.prompt in str(turn.messages)
        assert handle.coordinator.counters["compat_sigv4_accepted"] > 0
        assert handle.coordinator.counters["auth_rejected"] == 0


def _answer_tasks(n: int = 16) -> list[Task]:
    """The adapter tasks as dataset rows with their own ``answer`` key (what the shared-model agent scores on)."""
    return [Task(id=t.id, prompt=t.prompt, data={"answer": value_of(key_of(t.prompt)) + OFFSET}) for t in tasks(n)]


@pytest.mark.parametrize("url_mode", ["header", "rollout"])
async def test_one_wrapped_model_shared_by_16_concurrent_rollouts(served, tiny_tok, aws, url_mode):
    """SageMaker's docstring pattern: one module-level wrap_model(OpenAIModel) for every rollout, 16 at once."""
    handle = served(ScriptedEngine(tiny_tok, policy), _compat())
    with agent_process("sagemaker-shared", handle.url, url_mode, health="/ping", env=DUMMY_AWS,
                       timeout=120) as (_, url, _):
        runs = specs(handle, _answer_tasks(16))
        outcomes = await run_all(HttpExecutor.for_agentcore(url, coordinator=handle.coordinator), runs)
        misattributed = 0
        for spec, outcome in zip(runs, outcomes):
            record = handle.store.get_rollout(spec.rollout_id)
            key = key_of(spec.task.prompt)
            misattributed += sum(key not in str(turn.messages[0]) for turn in record.turns)
        assert misattributed == 0
        for spec, outcome in zip(runs, outcomes):
            record = handle.store.get_rollout(spec.rollout_id)
            if key_of(spec.task.prompt) == CRASH_KEY:  # the failure keeps the agent's own error text
                assert outcome.status is RolloutStatus.FAILED and "agent crashed on purpose" in record.error
                continue
            assert outcome.status is RolloutStatus.COMPLETED, outcome.error
            expected = 0.0 if key_of(spec.task.prompt) == ERROR_KEY else 1.0  # K03's lookup fails: no answer
            assert (record.reward, record.reward_defaulted) == (expected, False)  # scored on instance["answer"]
            assert len(record.turns) >= 2
        assert handle.coordinator.counters["auth_rejected"] == 0
        if url_mode == "rollout":  # every rollout after the first calls under the first one's URL: the header decides
            assert handle.coordinator.counters["attribution_header_over_path"] > 0


def test_a_failure_without_text_waits_past_its_reward_for_the_executors_text():
    """The state machine's rule behind SageMaker's report_error: the reward alone does not end a text-less failure."""
    from mtrl_runtime.coordinator import RolloutLife
    from mtrl_runtime.types import AgentEnded, ExecutorEnded, RewardReported

    life = RolloutLife()
    assert life.decide(AgentEnded(RolloutStatus.FAILED, awaits_reward=True)) is None
    assert life.decide(RewardReported()) is None  # rewarded, still waiting for the failure's text
    ending = life.decide(ExecutorEnded(RolloutStatus.FAILED, "the agent server answered 500: boom"))
    assert (ending.status, ending.error, ending.default_reward) == (RolloutStatus.FAILED, "the agent server answered 500: boom", False)
    life = RolloutLife()  # a failure with a text, and a success, end at their reward as before
    life.decide(AgentEnded(RolloutStatus.FAILED, "why", awaits_reward=True))
    assert life.decide(RewardReported()).error == "why"
    life = RolloutLife()
    life.decide(AgentEnded(RolloutStatus.COMPLETED, awaits_reward=True))
    assert life.decide(RewardReported()).status is RolloutStatus.COMPLETED
    life = RolloutLife()  # an executor answer without a text still leaves one
    life.decide(AgentEnded(RolloutStatus.FAILED, awaits_reward=True))
    life.decide(RewardReported())
    assert "without an error text" in life.decide(ExecutorEnded(RolloutStatus.COMPLETED)).error


def test_a_sigv4_call_carrying_another_rollouts_header_lands_on_the_rollout_its_messages_belong_to(served, tiny_tok, aws):
    """What wrap_model's shared client_args cause, deterministically: the header names a rollout, the messages another."""
    handle = served(ScriptedEngine(tiny_tok, policy), _compat())
    mine, other = specs(handle, tasks(2))
    sigv4 = generate_token(region="local")

    def call(header_spec, messages):
        client = openai.OpenAI(base_url=f"{handle.url}/v1", api_key=sigv4, max_retries=0, default_headers={
            "X-Amzn-SageMaker-Trajectory-Id": trajectory_id(header_spec.rollout_id, header_spec.token)})
        return client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)

    first = [{"role": "user", "content": mine.task.prompt}]
    reply = call(other, first).choices[0].message  # a first turn of `mine` under `other`'s header
    assert len(handle.store.get_rollout(mine.rollout_id).turns) == 1
    assert handle.store.get_rollout(other.rollout_id).turns == ()
    follow = first + [reply.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": reply.tool_calls[0].id,
                                                            "content": str(value_of(key_of(mine.task.prompt)))}]
    call(other, follow)  # continues `mine`'s conversation
    assert len(handle.store.get_rollout(mine.rollout_id).turns) == 2
    call(other, [{"role": "user", "content": other.task.prompt}])  # its own first turn stays its own
    assert len(handle.store.get_rollout(other.rollout_id).turns) == 1
    call(mine, follow[:1] + follow[1:2])  # `mine` trimming its own history keeps it (no other candidate)
    assert len(handle.store.get_rollout(mine.rollout_id).turns) == 3
    assert handle.coordinator.counters["compat_reattributed"] == 2
    for spec in (mine, other):
        key = key_of(spec.task.prompt)
        assert all(key in str(t.messages[0]) for t in handle.store.get_rollout(spec.rollout_id).turns)


def test_rollouts_opened_over_http_name_their_trajectory_id(served, tiny_tok, aws):
    """mtrl serve + remote orchestration: POST /v1/rollouts hands back the id a SageMaker agent must be given."""
    handle = served(ScriptedEngine(tiny_tok, policy), _compat())
    created = httpx.post(handle.url + "/v1/rollouts", json={"task_id": "q", "prompt": "What is the value of key K01?"}).json()
    assert created["trajectory_id"] == trajectory_id(created["rollout_id"], created["token"])
    metadata = {"job_arn": "arn:mtrl:local:job/x", "trajectory_id": created["trajectory_id"], "endpoint": handle.url,
                "region": "local"}
    RolloutFeedbackClient(metadata).report_complete(0.25)
    record = handle.store.get_rollout(created["rollout_id"])
    assert (record.status, record.reward) == (RolloutStatus.COMPLETED, 0.25)


def test_the_model_endpoint_carries_the_mac_and_takes_the_rollouts_own_token(served, tiny_tok):
    """An agent without mtrl's adapters uses model_endpoint with its rollout token; a tampered MAC is a 401."""
    handle = served(ScriptedEngine(tiny_tok, policy))
    [spec] = specs(handle, tasks(1))
    endpoint = HttpExecutor(handle.url).request_body(spec)["model_endpoint"]
    assert endpoint == f"{handle.url}/rollouts/{trajectory_id(spec.rollout_id, spec.token)}/v1"
    client = openai.OpenAI(base_url=endpoint, api_key=spec.token, max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": spec.task.prompt}], tools=TOOLS)
    assert len(handle.store.get_rollout(spec.rollout_id).turns) == 1
    head, last = endpoint[: -len("/v1") - 1], endpoint[-len("/v1") - 1]
    tampered = openai.OpenAI(base_url=head + ("1" if last == "0" else "0") + "/v1", api_key=spec.token, max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="does not carry rollout"):
        tampered.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x"}])
    assert len(handle.store.get_rollout(spec.rollout_id).turns) == 1
