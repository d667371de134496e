"""Selective capture: a judge called inside the reward computation reaches its own endpoint, untrained.

A real Strands agent (policy ``OpenAIModel``, two tools) runs on the served
scripted policy; the reward computation asks judges before
``update_reward``: a Strands ``OpenAIModel`` and an ``anthropic`` client,
both pointed at a stub upstream (a real HTTP server on 127.0.0.1, started
here, counting the calls it receives and the key each carried). Only the
policy's calls become turns and samples; the judges' calls reach the stub
with the user's keys, and are stored as non-policy model calls.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterator

import pytest

from _adapter_support import (
    CRASH_KEY, ERROR_KEY, add, check_attribution, lookup, per_turn_rewards, policy, specs, tasks,
)
from mtrl_adapters import UnresolvedModelCall, rollout, rollout_scope, update_reward
from mtrl_runtime.algorithms.samples import build_samples
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.types import RolloutStatus

strands = pytest.importorskip("strands")
anthropic = pytest.importorskip("anthropic")
from strands import Agent, tool  # noqa: E402
from strands.models.openai import OpenAIModel  # noqa: E402

from mtrl_adapters.strands import MtrlHooks  # noqa: E402

POLICY_MODEL = "gpt-4o-mini"
JUDGE_MODEL = "judge-gpt"
CLAUDE_JUDGE = "claude-judge"
JUDGE_KEY = "sk-judge-user-key"
CLAUDE_KEY = "sk-ant-user-key"
USAGE = (17, 3)  # the stub's input / output tokens, as its responses say them


class _Stub(BaseHTTPRequestHandler):
    """An OpenAI-compatible (chat completions, streamed or not) and Anthropic Messages upstream."""

    def log_message(self, *args: Any) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.calls.append({"path": self.path, "headers": dict(self.headers), "body": body})
        if self.path.endswith("/converse-stream"):  # Bedrock ConverseStream, in AWS event-stream framing
            events = [("messageStart", {"role": "assistant"}),
                      ("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "SCORE 1"}}),
                      ("contentBlockStop", {"contentBlockIndex": 0}), ("messageStop", {"stopReason": "end_turn"}),
                      ("metadata", {"usage": {"inputTokens": USAGE[0], "outputTokens": USAGE[1],
                                              "totalTokens": sum(USAGE)}, "metrics": {"latencyMs": 1}})]
            return self._send(b"".join(_frame(name, payload) for name, payload in events),
                              "application/vnd.amazon.eventstream")
        if self.path.endswith("/converse"):  # Bedrock Converse
            return self._json({"output": {"message": {"role": "assistant", "content": [{"text": "SCORE 1"}]}},
                               "stopReason": "end_turn", "metrics": {"latencyMs": 1},
                               "usage": {"inputTokens": USAGE[0], "outputTokens": USAGE[1], "totalTokens": sum(USAGE)}})
        if self.path.endswith("/messages"):
            return self._json({"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                               "content": [{"type": "text", "text": "SCORE 1"}], "stop_reason": "end_turn",
                               "stop_sequence": None, "usage": {"input_tokens": USAGE[0], "output_tokens": USAGE[1]}})
        usage = {"prompt_tokens": USAGE[0], "completion_tokens": USAGE[1], "total_tokens": sum(USAGE)}
        if not body.get("stream"):
            return self._json({"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"],
                               "choices": [{"index": 0, "finish_reason": "stop",
                                            "message": {"role": "assistant", "content": "SCORE 1"}}], "usage": usage})
        chunk = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
        events = [
            {**chunk, "choices": [{"index": 0, "finish_reason": None,
                                   "delta": {"role": "assistant", "content": "SCORE 1"}}]},
            {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {**chunk, "choices": [], "usage": usage},
        ]
        data = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        self._send(data.encode(), "text/event-stream")

    def _json(self, payload: Any) -> None:
        self._send(json.dumps(payload).encode(), "application/json")

    def _send(self, data: bytes, content_type: str) -> None:
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _frame(event_type: str, payload: Any) -> bytes:
    """One AWS event-stream message (prelude, string headers, payload, CRC32s), as Bedrock frames ConverseStream."""
    import struct
    import zlib

    headers = b""
    for name, value in ((":event-type", event_type), (":content-type", "application/json"), (":message-type", "event")):
        headers += bytes([len(name)]) + name.encode() + b"\x07" + struct.pack(">H", len(value)) + value.encode()
    body = json.dumps(payload).encode()
    prelude = struct.pack(">II", 16 + len(headers) + len(body), len(headers))
    message = prelude + struct.pack(">I", zlib.crc32(prelude)) + headers + body
    return message + struct.pack(">I", zlib.crc32(message))


@pytest.fixture
def upstream() -> Iterator[Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Stub)
    server.calls = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    yield server
    server.shutdown()
    server.server_close()


def _turns(agent: Agent) -> int:
    return sum(1 for m in agent.messages if m["role"] == "assistant")


def _agent(upstream: Any, **decorator: Any) -> Any:
    policy_model = OpenAIModel(client_args={"api_key": "sk-user-real-key", "base_url": "https://api.openai.com/v1"},
                               model_id=POLICY_MODEL)
    judge_model = OpenAIModel(client_args={"api_key": JUDGE_KEY, "base_url": f"{upstream.url}/v1"},
                              model_id=JUDGE_MODEL)
    claude = anthropic.AsyncAnthropic(api_key=CLAUDE_KEY, base_url=upstream.url)

    async def reward_of(answer: str) -> float:
        """An LLM-as-judge reward: two judges must both say SCORE 1."""
        verdict = await Agent(model=judge_model, callback_handler=None).invoke_async(f"Grade this answer: {answer}")
        message = await claude.messages.create(model=CLAUDE_JUDGE, max_tokens=16,
                                               messages=[{"role": "user", "content": f"Grade: {answer}"}])
        return 1.0 if "SCORE 1" in str(verdict) and message.content[0].text == "SCORE 1" else 0.0

    @rollout(**decorator)
    async def run(task: Any) -> str:
        agent = Agent(model=policy_model, tools=[tool(lookup), tool(add)], callback_handler=None, hooks=[MtrlHooks()])
        answer = str(await agent.invoke_async(task.prompt))
        score = await reward_of(answer)  # the judges, inside the reward computation, before update_reward
        update_reward([r * score for r in per_turn_rewards(_turns(agent))])
        return answer

    return run


def _check_judged(handle: Any, upstream: Any, runs: list) -> None:
    judge_calls = [c for c in upstream.calls if c["path"] == "/v1/chat/completions"]
    claude_calls = [c for c in upstream.calls if c["path"] == "/v1/messages"]
    assert len(judge_calls) == len(runs) and len(claude_calls) == len(runs)  # every judge call reached the stub
    for call in judge_calls:
        assert call["headers"]["Authorization"] == f"Bearer {JUDGE_KEY}"  # the user's own key, not a rollout token
        assert call["body"]["model"] == JUDGE_MODEL and "x-mtrl-rollout-id" not in call["headers"]
    for call in claude_calls:
        assert call["headers"]["X-Api-Key"] == CLAUDE_KEY and "x-mtrl-rollout-id" not in call["headers"]
    for spec in runs:
        rollout_ = check_attribution(handle.store, spec)  # only the policy's turns, each on its own rollout
        assert all("Grade" not in json.dumps(list(t.messages)) for t in rollout_.turns)  # no judge prompt is a turn
        assert rollout_.turn_rewards[-1] == 1.0  # both judges' verdicts reached the reward
        by_protocol = {c.protocol: c for c in rollout_.model_calls}
        assert len(rollout_.model_calls) == 2 and set(by_protocol) == {"openai", "anthropic"}
        judge, claude = by_protocol["openai"], by_protocol["anthropic"]
        assert (judge.model, judge.stream, judge.status, judge.error) == (JUDGE_MODEL, True, "success", None)
        assert (claude.model, claude.stream, claude.status) == (CLAUDE_JUDGE, False, "success")
        for call in (judge, claude):
            assert (call.input_tokens, call.output_tokens) == USAGE and call.latency_s > 0
        # trained on: the samples hold the policy's completions only
        samples = build_samples(rollout_, [1.0] * len(rollout_.turns))
        assert sum(sum(s.loss_mask_T) for s in samples) == sum(len(t.completion_ids) for t in rollout_.turns)
    assert handle.coordinator.counters["model_calls_passed_through"] == 2 * len(runs)


async def test_judge_inside_reward_passes_through_named_on_decorator(served, tiny_tok, upstream):
    handle = served(ScriptedEngine(tiny_tok, policy))
    run = _agent(upstream, policy_models=[POLICY_MODEL])
    runs = [s for s in specs(handle, tasks(4)) if CRASH_KEY not in s.task.prompt and ERROR_KEY not in s.task.prompt]
    for spec in runs:
        with rollout_scope(spec):
            await run(spec.task)
    _check_judged(handle, upstream, runs)


def test_non_policy_calls_show_in_the_mlflow_trace(served, tiny_tok, upstream, tmp_path):
    """The judges' calls are spans of the rollout's trace, marked not the policy's; no LLM-turn span is theirs."""
    import asyncio

    import mlflow

    from mtrl_runtime.config import MtrlConfig
    from mtrl_runtime.tracking import Tracker

    handle = served(ScriptedEngine(tiny_tok, policy))
    run = _agent(upstream, policy_models=POLICY_MODEL)
    [spec] = [s for s in specs(handle, tasks(1))]

    async def one() -> None:
        with rollout_scope(spec):
            await run(spec.task)

    asyncio.run(one())
    stored = handle.store.get_rollout(spec.rollout_id)
    tracker = Tracker(MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path / "run")}}))
    try:
        trace_id = tracker.write_trace(stored, 0)
        tracker.flush()
        mlflow.set_tracking_uri(tracker.tracking_uri)
        [trace] = [t for t in mlflow.search_traces(locations=[tracker.experiment_id], return_type="list", flush=True)
                   if t.info.trace_id == trace_id]
    finally:
        tracker.close()
    spans = {s.name: s for s in trace.data.spans}
    judge = spans[f"non-policy openai {JUDGE_MODEL}"]
    claude = spans[f"non-policy anthropic {CLAUDE_JUDGE}"]
    for span in (judge, claude):
        assert span.attributes["mtrl.policy"] is False
        assert (span.outputs["input_tokens"], span.outputs["output_tokens"]) == USAGE
    assert len([n for n in spans if n.startswith("llm turn")]) == len(stored.turns)


async def test_policy_models_carried_on_the_spec(served, tiny_tok, upstream):
    """The run's ``advanced.policy_models`` reaches the agent on the RolloutSpec (as the dispatcher builds it)."""
    import dataclasses

    handle = served(ScriptedEngine(tiny_tok, policy))
    run = _agent(upstream)
    runs = [dataclasses.replace(s, policy_models=(POLICY_MODEL,)) for s in specs(handle, tasks(3))
            if CRASH_KEY not in s.task.prompt and ERROR_KEY not in s.task.prompt]
    for spec in runs:
        with rollout_scope(spec):
            await run(spec.task)
    _check_judged(handle, upstream, runs)


async def test_a_call_naming_no_model_is_refused_not_guessed(served, tiny_tok, upstream):
    import openai

    handle = served(ScriptedEngine(tiny_tok, policy))
    client = openai.AsyncOpenAI(api_key=JUDGE_KEY, base_url=f"{upstream.url}/v1")

    @rollout(policy_models=[POLICY_MODEL])
    async def run(task: Any) -> None:
        await client.models.list()  # a GET with no model id: policy or not cannot be told

    [spec] = specs(handle, tasks(1))
    with rollout_scope(spec):
        with pytest.raises(UnresolvedModelCall, match="names no model id"):
            await run(spec.task)
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.status is RolloutStatus.FAILED and "policy_models" in stored.error
    assert upstream.calls == []  # nothing left the process


def test_bad_policy_models_named():
    from mtrl_runtime.config import ConfigError, MtrlConfig

    with pytest.raises(ValueError, match="policy_models"):
        rollout(policy_models=[""])
    with pytest.raises(ConfigError, match="policy_models"):
        MtrlConfig.from_dict({"advanced": {"policy_models": []}})
    assert MtrlConfig.from_dict({"advanced": {"policy_models": ["m"]}}).advanced.policy_models == ["m"]


async def test_bedrock_judge_is_signed_with_the_users_credentials_and_recorded(served, tiny_tok, upstream):
    """boto3: the policy's Converse call lands on mtrl unsigned; the judge's goes to its endpoint, signed, recorded."""
    import boto3

    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "Paris."))
    creds = {"region_name": "us-east-1", "aws_access_key_id": "AKIAUSERKEY", "aws_secret_access_key": "user-secret"}
    policy_client = boto3.client("bedrock-runtime", endpoint_url="http://127.0.0.1:9", **creds)  # redirected anyway
    judge_client = boto3.client("bedrock-runtime", endpoint_url=upstream.url, **creds)
    ask = [{"role": "user", "content": [{"text": "What is the capital of France?"}]}]

    @rollout(policy_models="policy-model")
    def run(task: Any) -> None:
        answer = policy_client.converse(modelId="policy-model", messages=ask)
        text = answer["output"]["message"]["content"][0]["text"]
        verdict = judge_client.converse(modelId="judge-model", messages=[{"role": "user", "content": [{"text": text}]}])
        update_reward(1.0 if verdict["output"]["message"]["content"][0]["text"] == "SCORE 1" else 0.0)

    [spec] = specs(handle, tasks(1))
    with rollout_scope(spec):
        run(spec.task)
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.status is RolloutStatus.COMPLETED and stored.reward == 1.0
    assert [t.completion_text for t in stored.turns] == ["Paris."]  # the policy's call, captured
    [sent] = upstream.calls
    assert sent["path"] == "/model/judge-model/converse"
    assert sent["headers"]["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIAUSERKEY/")  # signed by the user
    assert "x-mtrl-rollout-id" not in sent["headers"]
    [call] = stored.model_calls
    assert (call.protocol, call.model, call.input_tokens, call.output_tokens) == ("bedrock", "judge-model", *USAGE)


async def test_strands_bedrock_judge_streams_from_its_endpoint(served, tiny_tok, upstream):
    """A Strands ``BedrockModel`` judge (ConverseStream) beside an OpenAI policy: signed, recorded with its tokens."""
    import boto3
    from strands.models.bedrock import BedrockModel

    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "Paris."))
    session = boto3.Session(aws_access_key_id="AKIAUSERKEY", aws_secret_access_key="user-secret",
                            region_name="us-east-1")
    judge_model = BedrockModel(model_id="judge-model", boto_session=session, endpoint_url=upstream.url)
    policy_model = OpenAIModel(client_args={"api_key": "sk-user-real-key"}, model_id=POLICY_MODEL)

    @rollout(policy_models=[POLICY_MODEL])
    async def run(task: Any) -> None:
        answer = await Agent(model=policy_model, callback_handler=None).invoke_async(task.prompt)
        verdict = await Agent(model=judge_model, callback_handler=None).invoke_async(f"Grade: {answer}")
        update_reward(1.0 if "SCORE 1" in str(verdict) else 0.0)

    [spec] = specs(handle, tasks(1))
    with rollout_scope(spec):
        await run(spec.task)
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.status is RolloutStatus.COMPLETED and stored.reward == 1.0, stored.error
    assert [t.completion_text for t in stored.turns] == ["Paris."]
    [sent] = upstream.calls
    assert sent["path"] == "/model/judge-model/converse-stream"
    assert sent["headers"]["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIAUSERKEY/")
    [call] = stored.model_calls
    assert (call.protocol, call.model, call.stream, call.status) == ("bedrock", "judge-model", True, "success")
    assert (call.input_tokens, call.output_tokens) == USAGE


async def test_remote_agents_get_the_runs_policy_models(served, tiny_tok):
    """HttpExecutor sends ``advanced.policy_models`` in the rollout request's metadata; the agent server reads it."""
    import dataclasses

    from mtrl_adapters import context_from_request
    from mtrl_runtime.executors import HttpExecutor

    handle = served(ScriptedEngine(tiny_tok, policy))
    [spec] = specs(handle, tasks(1))
    executor = HttpExecutor("http://127.0.0.1:9")
    try:
        named = context_from_request(executor.request_body(dataclasses.replace(spec, policy_models=(POLICY_MODEL,))))
        unnamed = context_from_request(executor.request_body(spec))
    finally:
        await executor.close()
    assert named.policy_models == frozenset({POLICY_MODEL}) and unnamed.policy_models is None
    body = executor.request_body(dataclasses.replace(spec, policy_models=("",)))
    with pytest.raises(ValueError, match="policy_models"):
        context_from_request(body)


async def test_a_policy_named_wrong_is_flagged_not_silent(served, tiny_tok, upstream, caplog):
    """policy_models naming none of the agent's models: every call passes through; the rollout is flagged, and the
    fix is logged once."""
    import openai

    handle = served(ScriptedEngine(tiny_tok, policy))
    client = openai.AsyncOpenAI(api_key=JUDGE_KEY, base_url=f"{upstream.url}/v1")

    @rollout(policy_models="a-model-the-agent-never-calls")
    async def run(task: Any) -> None:
        await client.chat.completions.create(model=JUDGE_MODEL, messages=[{"role": "user", "content": task.prompt}])

    with caplog.at_level("WARNING", logger="mtrl.coordinator"):
        for spec in specs(handle, tasks(2)):
            with rollout_scope(spec):
                await run(spec.task)
    assert len(upstream.calls) == 2 and handle.coordinator.counters["rollouts_with_no_policy_call"] == 2
    warnings = [r.getMessage() for r in caplog.records if "none to the policy" in r.getMessage()]
    assert len(warnings) == 1 and "policy_models" in warnings[0] and JUDGE_MODEL in warnings[0]


async def test_the_runs_policy_models_reach_the_agent_through_the_dispatcher(tiny_tok, upstream, tmp_path):
    """``advanced.policy_models`` in the run's config: the dispatcher's RolloutSpec carries it to the agent."""
    import openai

    from mtrl_runtime.config import MtrlConfig
    from mtrl_runtime.rollouts import collect_rollouts
    from mtrl_runtime.types import Task

    policy_client = openai.OpenAI(api_key="sk-user-real-key")
    judge = openai.OpenAI(api_key=JUDGE_KEY, base_url=f"{upstream.url}/v1")

    @rollout
    def agent(task: Any) -> None:
        answer = policy_client.chat.completions.create(model=POLICY_MODEL,
                                                       messages=[{"role": "user", "content": task.prompt}])
        verdict = judge.chat.completions.create(model=JUDGE_MODEL, messages=[
            {"role": "user", "content": f"Grade: {answer.choices[0].message.content}"}])
        update_reward(1.0 if verdict.choices[0].message.content == "SCORE 1" else 0.0)

    config = MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path / "run"), "group_size": 2, "max_turns": 2},
                                   "advanced": {"policy_models": [POLICY_MODEL], "rollout_timeout_s": 60}})
    collected = await collect_rollouts(config, agent, [Task(id="capital", prompt="The capital of France?")],
                                       engine=ScriptedEngine(tiny_tok, lambda request, prompt: "Paris."))
    assert len(collected.rollouts) == 2 and len(upstream.calls) == 2
    for stored in collected.rollouts:
        assert stored.status is RolloutStatus.COMPLETED and stored.reward == 1.0
        assert [t.completion_text for t in stored.turns] == ["Paris."]
        [call] = stored.model_calls
        assert (call.model, call.input_tokens, call.output_tokens) == (JUDGE_MODEL, *USAGE)
