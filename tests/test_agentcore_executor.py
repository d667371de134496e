"""Training a deployed AgentCore Runtime by its ARN, against a loopback stand-in of the AgentCore data plane.

The executor calls ``InvokeAgentRuntime`` through boto3's real
``bedrock-agentcore`` client (``endpoint_url`` pointed at
``mtrl_integrations.agentcore_standin``), which verifies each request's
SigV4 signature with botocore's signer from the test credentials (or the
bearer token of a runtime configured for OAuth) and runs a real
``BedrockAgentCoreApp`` on its own loopback port. The runtime's model
calls reach the coordinator at the URL the payload names.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("bedrock_agentcore")
pytest.importorskip("boto3")

import _agentcore_apps as apps  # noqa: E402
from _adapter_support import CRASH_KEY, check_attribution, key_of, policy, tasks  # noqa: E402
from mtrl_integrations.agentcore_standin import AgentCoreStandIn, TEST_ACCESS_KEY_ID, TEST_SECRET_ACCESS_KEY  # noqa: E402
from mtrl_runtime.config import ConfigError, MtrlConfig  # noqa: E402
from mtrl_runtime.engines import ScriptedEngine  # noqa: E402
from mtrl_runtime.executors import AgentCoreExecutor, AgentCoreSettings, parse_runtime_arn  # noqa: E402
from mtrl_runtime.rollouts import RolloutStack, executor_kind  # noqa: E402
from mtrl_runtime.store import SQLiteStore  # noqa: E402
from mtrl_runtime.testing import free_port
from mtrl_runtime.types import RolloutStatus  # noqa: E402

ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/mtrl_agent-a1B2c3D4e5"
STREAM_ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/mtrl_stream-a1B2c3D4e5"
OAUTH_ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/mtrl_oauth-a1B2c3D4e5"


@pytest.fixture
def aws_env(monkeypatch, tmp_path):
    """boto3's credential chain sees only the stand-in's test credentials (no files, no instance metadata)."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", "AWS_DEFAULT_REGION", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", TEST_ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", TEST_SECRET_ACCESS_KEY)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    import boto3

    # boto3.client() uses one default session per process, which keeps the credentials it first resolved: another
    # test on this worker (its own AWS_* variables) must not sign these requests
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)


def _config(tmp_path: Path, agentcore: dict[str, Any], **core: Any) -> MtrlConfig:
    base = {"run_dir": str(tmp_path / "run"), "engine": "scripted", "group_size": 2, "train_batch_size": 2,
            "max_turns": 8, "sampling_params": {"max_tokens": 64}}
    base.update(core)
    return MtrlConfig.from_dict({"core": base, "advanced": {"agentcore": agentcore, "rollout_timeout_s": 60,
                                                            "checkpoint_every": 0}})


async def _collect(config: MtrlConfig, engine: Any, agent_env: Any, tasks_: list) -> tuple[Any, list]:
    """Run one step's groups through the real dispatcher; returns the stack (closed) and the rollouts.

    Every failed rollout is counted in the step's failure metrics and trained on by no group."""
    stack = RolloutStack.build(config, store_path=config.run_folder.store, engine=engine, agent_env=agent_env)
    try:
        batch = await stack.dispatcher().collect(0, tasks_)
    finally:
        await stack.close()
    failed = [r for r in batch.rollouts if r.status is not RolloutStatus.COMPLETED]
    metrics = batch.failure_metrics()
    assert metrics["failures/rollouts_failed"] + metrics["failures/rollouts_timed_out"] == len(failed)
    kept = {r.id for g in batch.groups for r in g.kept}
    assert not kept & {r.id for r in failed}
    return stack, batch.rollouts


# -- ARNs ---------------------------------------------------------------------------------------

BAD_ARNS = [
    ("not-an-arn", "six ':'-separated parts"),
    ("arn:aws:bedrock:us-west-2:123456789012:runtime/mtrl_agent-a1B2c3D4e5", "its service is 'bedrock'"),
    ("arn:aws:bedrock-agentcore:us-west-2:123456789012:memory/mtrl_agent-a1B2c3D4e5", "not 'runtime/<id>'"),
    ("arn:aws:bedrock-agentcore:us-west-2:1234:runtime/mtrl_agent-a1B2c3D4e5", "its account '1234'"),
    ("arn:aws:bedrock-agentcore:US_WEST:123456789012:runtime/mtrl_agent-a1B2c3D4e5", "its region 'US_WEST'"),
    ("arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/mtrl_agent", "its runtime id 'mtrl_agent'"),
    ("arn:gcp:bedrock-agentcore:us-west-2:123456789012:runtime/mtrl_agent-a1B2c3D4e5", "six ':'-separated parts"),
]


@pytest.mark.parametrize("arn,why", BAD_ARNS)
def test_a_bad_arn_in_the_config_fails_at_load_naming_the_field_and_the_value(arn, why):
    with pytest.raises(ConfigError) as caught:
        MtrlConfig.from_dict({"advanced": {"agentcore": {"runtime_arn": arn}}})
    assert "advanced.agentcore.runtime_arn" in str(caught.value) and repr(arn) in str(caught.value)
    assert why in str(caught.value)


@pytest.mark.parametrize("arn,why", BAD_ARNS[1:])
def test_a_bad_arn_as_agent_env_or_on_the_command_line_names_where_it_came_from(arn, why, tmp_path):
    from mtrl_runtime.cli._agents import agent_env_for

    with pytest.raises(ValueError, match=f"agent_env: {re.escape(repr(arn))} is not an AgentCore Runtime ARN: .*{re.escape(why)}"):
        executor_kind(arn)
    with pytest.raises(ValueError, match=f"--agent: {re.escape(repr(arn))} is not an AgentCore Runtime ARN: .*{re.escape(why)}"):
        agent_env_for(arn, MtrlConfig())


def test_arn_parts_qualifier_and_urls_are_checked():
    parsed = parse_runtime_arn(ARN)
    assert (parsed.partition, parsed.region, parsed.account, parsed.runtime_id) == (
        "aws", "us-west-2", "123456789012", "mtrl_agent-a1B2c3D4e5")
    assert parse_runtime_arn(ARN.replace("arn:aws:", "arn:aws-cn:")).partition == "aws-cn"
    with pytest.raises(ConfigError, match=r"advanced.agentcore.qualifier: .*not a runtime endpoint name.*'prod-1'"):
        MtrlConfig.from_dict({"advanced": {"agentcore": {"qualifier": "prod-1"}}})
    with pytest.raises(ConfigError, match=r"advanced.agentcore.coordinator_url: .*http\(s\) URL.*'10.0.0.1:8000'"):
        MtrlConfig.from_dict({"advanced": {"agentcore": {"coordinator_url": "10.0.0.1:8000"}}})
    with pytest.raises(ConfigError, match=r"advanced.agentcore.auth: .*'sigv4' or 'bearer'.*'iam'"):
        MtrlConfig.from_dict({"advanced": {"agentcore": {"auth": "iam"}}})


# -- rollouts on the runtime ---------------------------------------------------------------------


@pytest.mark.timeout(180)
async def test_rollouts_run_on_the_runtime_by_arn_with_sigv4_one_session_each(tmp_path, tiny_tok, aws_env):
    apps.SEEN.clear()
    with AgentCoreStandIn({ARN: apps.tool_app(), STREAM_ARN: apps.streaming_tool_app()},
                          endpoints=("DEFAULT", "canary")) as service:
        settings = {"endpoint_url": service.endpoint_url, "qualifier": "canary"}
        config = _config(tmp_path, settings)
        task_list = tasks(6)  # K05 is the agent that crashes at the end of its episode
        stack, rollouts = await _collect(config, ScriptedEngine(tiny_tok, policy), ARN, task_list)
        streamed_cfg = _config(tmp_path / "s", settings)
        _, streamed = await _collect(streamed_cfg, ScriptedEngine(tiny_tok, policy), STREAM_ARN, task_list[:2])

    assert len(rollouts) == 12
    by_task = {t.id: t for t in task_list}
    store = SQLiteStore(config.run_folder.store)
    try:
        for rollout in rollouts:
            recorded = check_attribution(store, types.SimpleNamespace(rollout_id=rollout.id, task=by_task[rollout.task_id]))
            assert len(recorded.turns) >= 2
    finally:
        store.close()
    crashed = [r for r in rollouts if key_of(by_task[r.task_id].prompt) == CRASH_KEY]
    assert len(crashed) == 2 and all(r.status is RolloutStatus.FAILED for r in crashed)
    assert all(r.status is RolloutStatus.COMPLETED for r in rollouts if r not in crashed)

    invoked = [i for i in service.invocations if i.operation == "InvokeAgentRuntime"]
    assert len(invoked) == 16 and all(i.status == 200 and i.auth == "sigv4" for i in invoked)
    assert {i.qualifier for i in invoked} == {"canary"}
    assert {i.content_type for i in invoked} == {"application/json"}
    assert {i.accept for i in invoked} == {"application/json, text/event-stream"}
    sessions = [i.session_id for i in invoked]
    assert len(set(sessions)) == 16 and all(len(s) >= 33 for s in sessions)
    assert sorted(service.stopped_sessions) == sorted(sessions)  # each rollout's session ended with it
    # the payload: the task's prompt at the top level and the coordinator's URL; the session the app saw is ours
    seen = {s["rollout_id"]: s for s in apps.SEEN}
    assert set(seen) == {r.id for r in rollouts}
    for rollout in rollouts:
        assert seen[rollout.id]["prompt"] == by_task[rollout.task_id].prompt
        assert seen[rollout.id]["session"] in sessions and rollout.id in seen[rollout.id]["session"]
    assert {s["endpoint"] for s in apps.SEEN} == {stack.server.url}  # no coordinator_url: the server's own

    assert len(streamed) == 4 and all(r.status is RolloutStatus.COMPLETED and len(r.turns) >= 2 for r in streamed)


@pytest.mark.timeout(180)
async def test_the_payload_names_the_configured_public_coordinator_url(tmp_path, tiny_tok, aws_env):
    """``coordinator_url`` is what the runtime calls: here ``localhost`` for the server bound on 127.0.0.1."""
    apps.SEEN.clear()
    port = free_port()
    public = f"http://localhost:{port}"
    with AgentCoreStandIn({ARN: apps.tool_app()}) as service:
        config = _config(tmp_path, {"endpoint_url": service.endpoint_url, "coordinator_url": public})
        config = config.with_overrides({"advanced.server.port": port})
        _, rollouts = await _collect(config, ScriptedEngine(tiny_tok, policy), ARN, tasks(1))
    assert {s["endpoint"] for s in apps.SEEN} == {public}
    assert len(rollouts) == 2 and all(r.status is RolloutStatus.COMPLETED and len(r.turns) == 3 for r in rollouts)


@pytest.mark.timeout(180)
async def test_a_plain_event_stream_and_a_runtime_failure(tmp_path, tiny_tok, aws_env):
    plain_arn, failing_arn = ARN.replace("mtrl_agent", "plain"), ARN.replace("mtrl_agent", "failing")
    with AgentCoreStandIn({plain_arn: apps.plain_stream_app(), failing_arn: apps.failing_app()}) as service:
        cfg = _config(tmp_path / "plain", {"endpoint_url": service.endpoint_url})
        task_list = tasks(2)
        task_list[1] = dataclasses.replace(task_list[1], prompt=task_list[1].prompt + " (break the stream)")
        _, plain = await _collect(cfg, ScriptedEngine(tiny_tok, policy), plain_arn, task_list)
        cfg = _config(tmp_path / "failing", {"endpoint_url": service.endpoint_url})
        _, failing = await _collect(cfg, ScriptedEngine(tiny_tok, policy), failing_arn, tasks(1))
    whole = [r for r in plain if r.task_id == task_list[0].id]
    broken = [r for r in plain if r.task_id == task_list[1].id]
    assert len(whole) == len(broken) == 2
    assert all(r.status is RolloutStatus.COMPLETED and len(r.turns) == 3 and r.turn_rewards for r in whole)
    for rollout in broken:  # the app's error event fails the rollout, with the app's error, and it is not rewarded
        assert rollout.status is RolloutStatus.FAILED and rollout.turns == () and not rollout.turn_rewards
        assert rollout.error == ("the runtime's stream ended in an error: RuntimeError: "
                                 "the stream broke before the episode")
    for rollout in failing:
        assert rollout.status is RolloutStatus.FAILED and rollout.turns == ()
        assert "RuntimeClientError (HTTP 424): Received error (500) from runtime" in rollout.error
        assert "the runtime's model configuration is missing" in rollout.error and failing_arn in rollout.error


@pytest.mark.timeout(180)
async def test_a_rollout_past_its_deadline_times_out_and_its_session_is_stopped(tmp_path, tiny_tok, aws_env):
    import time

    with AgentCoreStandIn({ARN: apps.slow_app(60.0)}) as service:
        cfg = _config(tmp_path, {"endpoint_url": service.endpoint_url}, group_size=1, train_batch_size=1)
        cfg = cfg.with_overrides({"advanced.rollout_timeout_s": 10.0})
        started = time.monotonic()
        stack, rollouts = await _collect(cfg, ScriptedEngine(tiny_tok, ["thinking"]), ARN, tasks(1))
        elapsed = time.monotonic() - started  # the stack's close waited for the session's stop
    assert [r.status for r in rollouts] == [RolloutStatus.TIMED_OUT] and len(rollouts[0].turns) == 1
    invoked = [i for i in service.invocations if i.operation == "InvokeAgentRuntime"]
    assert service.stopped_sessions == [invoked[0].session_id]
    assert invoked[0].error == f"RuntimeClientError: the runtime session {invoked[0].session_id} was stopped"
    assert elapsed < 40  # not the app's 60 s: stopping the session ended the invocation
    assert stack.executor.counters.sessions_stopped == 1


@pytest.mark.timeout(180)
async def test_service_errors_fail_their_rollouts_with_the_services_text_and_throttles_are_retried(
        tmp_path, tiny_tok, aws_env):
    with AgentCoreStandIn({ARN: apps.tool_app()}) as service:
        # two throttles, two retries: every rollout still runs
        cfg = _config(tmp_path / "retried", {"endpoint_url": service.endpoint_url, "throttle_retries": 2})
        service.fail_next("ThrottlingException", "Rate exceeded", times=2)
        stack, retried = await _collect(cfg, ScriptedEngine(tiny_tok, policy), ARN, tasks(1))
        assert stack.executor.counters.throttle_retries == 2
        assert all(r.status is RolloutStatus.COMPLETED for r in retried)
        # more throttles than retries, then errors the service never retries
        cfg = _config(tmp_path / "failed", {"endpoint_url": service.endpoint_url, "throttle_retries": 0},
                      group_size=4, train_batch_size=1)
        service.fail_next("ThrottlingException", "Rate exceeded")
        service.fail_next("AccessDeniedException", "User is not authorized to perform: bedrock-agentcore:InvokeAgentRuntime")
        service.fail_next("InternalServerException", "An internal error occurred")
        stack, failed = await _collect(cfg, ScriptedEngine(tiny_tok, policy), ARN, tasks(1))
        counters = stack.executor.counters
        # an unknown runtime: ResourceNotFoundException
        missing = ARN.replace("a1B2c3D4e5", "zzzzzzzzzz")
        cfg = _config(tmp_path / "missing", {"endpoint_url": service.endpoint_url}, group_size=1, train_batch_size=1)
        _, lost = await _collect(cfg, ScriptedEngine(tiny_tok, policy), missing, tasks(1))
    errors = sorted(r.error for r in failed if r.status is RolloutStatus.FAILED)
    assert len(errors) == 3 and len(failed) == 4
    assert any("ThrottlingException (HTTP 429): Rate exceeded" in e for e in errors)
    assert any("AccessDeniedException (HTTP 403): User is not authorized" in e for e in errors)
    assert any("InternalServerException (HTTP 500): An internal error occurred" in e for e in errors)
    assert counters.service_errors == {"ThrottlingException": 1, "AccessDeniedException": 1, "InternalServerException": 1}
    assert all(r.turns == () for r in failed if r.status is RolloutStatus.FAILED)
    assert [r.status for r in lost] == [RolloutStatus.FAILED]
    assert f"ResourceNotFoundException (HTTP 404): no agent runtime {missing}" in lost[0].error


@pytest.mark.timeout(180)
async def test_a_runtime_configured_for_oauth_takes_a_bearer_token_and_refuses_sigv4(tmp_path, tiny_tok, aws_env,
                                                                                     monkeypatch):
    with AgentCoreStandIn({OAUTH_ARN: apps.tool_app()}, oauth={OAUTH_ARN: "jwt-for-mtrl"}) as service:
        monkeypatch.setenv("MTRL_AGENTCORE_BEARER_TOKEN", "jwt-for-mtrl")
        cfg = _config(tmp_path / "bearer", {"endpoint_url": service.endpoint_url, "auth": "bearer"})
        _, good = await _collect(cfg, ScriptedEngine(tiny_tok, policy), OAUTH_ARN, tasks(1))
        cfg = _config(tmp_path / "sigv4", {"endpoint_url": service.endpoint_url}, group_size=1, train_batch_size=1)
        _, signed = await _collect(cfg, ScriptedEngine(tiny_tok, policy), OAUTH_ARN, tasks(1))
        monkeypatch.setenv("MTRL_AGENTCORE_BEARER_TOKEN", "an-expired-token")
        cfg = _config(tmp_path / "expired", {"endpoint_url": service.endpoint_url, "auth": "bearer"},
                      group_size=1, train_batch_size=1)
        _, expired = await _collect(cfg, ScriptedEngine(tiny_tok, policy), OAUTH_ARN, tasks(1))
    assert [r.status for r in good] == [RolloutStatus.COMPLETED] * 2 and all(len(r.turns) == 3 for r in good)
    bearer = [i for i in service.invocations if i.auth == "bearer" and i.status == 200]
    assert {i.operation for i in bearer} == {"InvokeAgentRuntime", "StopRuntimeSession"}
    assert "AccessDeniedException (HTTP 403): Authorization method mismatch" in signed[0].error
    assert "UnauthorizedException (HTTP 401): the bearer token is not valid" in expired[0].error
    monkeypatch.delenv("MTRL_AGENTCORE_BEARER_TOKEN")
    with pytest.raises(ValueError, match="advanced.agentcore.bearer_token_env: the environment variable "
                                         "'MTRL_AGENTCORE_BEARER_TOKEN' is not set"):
        AgentCoreExecutor(OAUTH_ARN, AgentCoreSettings(auth="bearer"))


def test_a_forged_or_altered_request_is_refused_by_the_stand_in(aws_env):
    """The stand-in's check can fail: a wrong secret, and a payload changed after signing."""
    import boto3
    from botocore.config import Config
    from botocore.exceptions import ClientError

    with AgentCoreStandIn({ARN: apps.tool_app()}) as service:
        no_retry = Config(retries={"total_max_attempts": 1, "mode": "standard"})
        forged = boto3.client("bedrock-agentcore", region_name="us-west-2", endpoint_url=service.endpoint_url,
                              aws_access_key_id=TEST_ACCESS_KEY_ID, aws_secret_access_key="not-the-secret",
                              config=no_retry)
        with pytest.raises(ClientError, match="InvalidSignatureException.*signature we calculated does not match"):
            forged.invoke_agent_runtime(agentRuntimeArn=ARN, runtimeSessionId="s" * 40, payload=b"{}")
        altered = boto3.client("bedrock-agentcore", region_name="us-west-2", endpoint_url=service.endpoint_url,
                               config=no_retry)
        altered.meta.events.register("before-send.bedrock-agentcore.InvokeAgentRuntime",
                                     lambda request, **_: setattr(request, "body", b'{"prompt": "y"}'))
        with pytest.raises(ClientError, match="InvalidSignatureException"):
            altered.invoke_agent_runtime(agentRuntimeArn=ARN, runtimeSessionId="s" * 40, payload=b'{"prompt": "x"}')
        wrong_region = boto3.client("bedrock-agentcore", region_name="eu-west-1", endpoint_url=service.endpoint_url,
                                    config=no_retry)
        with pytest.raises(ClientError, match="signed for region 'eu-west-1', the runtime is in 'us-west-2'"):
            wrong_region.invoke_agent_runtime(agentRuntimeArn=ARN, runtimeSessionId="s" * 40, payload=b"{}")
        user = boto3.client("bedrock-agentcore", region_name="us-west-2", endpoint_url=service.endpoint_url)
        answer = user.invoke_agent_runtime(agentRuntimeArn=ARN, runtimeSessionId="u" * 40,
                                           payload=json.dumps({"prompt": "hello"}).encode())
        assert json.loads(answer["response"].read()) == {"echo": {"prompt": "hello"}}  # users are served as before
    assert [i.status for i in service.invocations] == [403, 403, 403, 200]


# -- mtrl train / mtrl eval with --agent ARN -----------------------------------------------------


@pytest.mark.timeout(300)
def test_mtrl_train_and_eval_take_the_arn(tmp_path, tiny_model_dir, aws_env, capsys):
    from mtrl_runtime.cli import main

    rows = [{"id": f"q{n}", "prompt": f"question {n}", "ground_truth": 42} for n in range(2)]
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with AgentCoreStandIn({ARN: apps.answer_app()}) as service:
        cfg = {"core": {"engine": "scripted", "model": str(tiny_model_dir), "run_dir": str(tmp_path / "run"),
                        "group_size": 2, "train_batch_size": 2, "max_steps": 2, "val_every": 0, "max_turns": 2,
                        "pass_k_values": [1, 2], "lora_rank": 4, "lora_alpha": 8,
                        "sampling_params": {"max_tokens": 16}},
               "advanced": {"engine_options": {"script": ["ANSWER 42"]}, "rollout_timeout_s": 60,
                            "checkpoint_every": 0, "agentcore": {"endpoint_url": service.endpoint_url}}}
        (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
        assert main(["train", str(tmp_path / "cfg.yaml"), "--agent", ARN, "--dataset", str(tmp_path / "tasks.jsonl"),
                     "--no-mlflow"]) == 0
        # the ARN in the config instead of on the command line
        cfg["advanced"]["agentcore"]["runtime_arn"] = ARN
        (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
        assert main(["eval", str(tmp_path / "cfg.yaml"), "--dataset", str(tmp_path / "tasks.jsonl"),
                     "--output", str(tmp_path / "eval"), "--no-mlflow", "--samples", "2"]) == 0
    out = capsys.readouterr().out
    assert "trained steps 1..2" in out
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        trained = store.rollouts()
    finally:
        store.close()
    assert len(trained) == 8 and all(r.status is RolloutStatus.COMPLETED and len(r.turns) == 1 for r in trained)
    assert {r.reward for r in trained} == {1.0}  # the runtime scored "ANSWER 42" and reported it
    store = SQLiteStore(tmp_path / "eval" / "trajectories.db")
    try:
        evaluated = store.rollouts()
    finally:
        store.close()
    assert len(evaluated) == 4 and all(r.status is RolloutStatus.COMPLETED and r.turns for r in evaluated)
    sessions = [i.session_id for i in service.invocations if i.operation == "InvokeAgentRuntime"]
    assert len(sessions) == len(set(sessions)) == 12
