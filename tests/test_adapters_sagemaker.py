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
    free_port,
    policy,
    run_all,
    spawn_agent,
    specs,
    stop_agent,
    tasks,
    wait_healthy,
)
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.executors import HttpExecutor
from mtrl_runtime.server._compat_routes import sigv4_problem
from mtrl_runtime.types import RolloutStatus

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
    return {"job_arn": "arn:mtrl:local:job/test", "trajectory_id": spec.rollout_id, "endpoint": handle.url,
            "region": "local"}


def _one_turn(handle, spec, token):
    """A model call named by SageMaker's header, with SageMaker's bearer token."""
    client = openai.OpenAI(base_url=f"{handle.url}/v1", api_key=token, max_retries=0,
                           default_headers={"X-Amzn-SageMaker-Trajectory-Id": spec.rollout_id,
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


def test_feedback_client_completes_then_rewards(served, tiny_tok, aws):
    handle = served(ScriptedEngine(tiny_tok, policy), _compat())
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

    RolloutFeedbackClient(_metadata(handle, failed)).report_error("the agent broke")
    record = handle.store.get_rollout(failed.rollout_id)
    assert (record.status, record.reward) == (RolloutStatus.FAILED, 0.0)
    assert handle.coordinator.counters["compat_sigv4_accepted"] >= 5


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
    response = httpx.post(exposed.url + "/update-reward", json={"TrajectoryId": spec.rollout_id, "Rewards": [1.0]},
                          headers={"authorization": f"Bearer {token}"})
    assert response.status_code == 401
    assert exposed.store.get_rollout(spec.rollout_id).reward is None


def test_compat_routes_refuse_bad_input(served, tiny_tok, aws):
    handle = served(ScriptedEngine(tiny_tok, policy), _compat())
    [spec] = specs(handle, tasks(1))
    headers = {"authorization": f"Bearer {generate_token(region='local')}"}
    post = lambda path, body: httpx.post(handle.url + path, json=body, headers=headers)  # noqa: E731
    response = post("/complete-rollout", {"TrajectoryId": spec.rollout_id, "Status": "sideways"})
    assert response.status_code == 400 and "Status: unknown value 'sideways'" in response.text
    response = post("/update-reward", {"TrajectoryId": spec.rollout_id, "Rewards": []})
    assert response.status_code == 400 and "Rewards" in response.text
    response = post("/update-reward", {"TrajectoryId": spec.rollout_id, "Rewards": [0.1, 0.2]})
    assert response.status_code == 400 and "turn_rewards has 2 values" in response.text  # no turns yet
    response = post("/update-reward", {"TrajectoryId": "r-unknown", "Rewards": [1.0]})
    assert response.status_code == 404
    response = httpx.post(handle.url + "/update-reward", json={"TrajectoryId": spec.rollout_id, "Rewards": [1.0]},
                          headers={"authorization": "Bearer sagemaker-api-key-bm90IGEgdG9rZW4="})
    assert response.status_code == 401 and "not valid" in response.text
    record = handle.store.get_rollout(spec.rollout_id)
    assert (record.status, record.reward, record.turn_rewards) == (RolloutStatus.RUNNING, None, None)


async def test_sagemaker_strands_agent_on_agentcore_trains_against_mtrl(served, tiny_tok, aws):
    """sagemaker_rft_handler + wrap_model(OpenAIModel) + RolloutFeedbackClient, unchanged, on app.run()."""
    handle = served(ScriptedEngine(tiny_tok, policy), _compat())
    port = free_port()
    proc = spawn_agent("sagemaker", str(port), handle.url, env=DUMMY_AWS)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url + "/ping", timeout=120)
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
    finally:
        stop_agent(proc)
