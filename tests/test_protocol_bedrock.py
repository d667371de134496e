"""Bedrock Converse on the capture endpoint: real Strands and LangChain agents on boto3, dummy AWS credentials.

Every Bedrock call lands on mtrl (a guard refuses any name lookup but
loopback, so no AWS host is ever contacted), and every request mtrl receives
is recorded: none carries the user's AWS key id, secret or session token, or
a SigV4 signature. The scripted policy of ``_adapter_support`` drives each
rollout through ``lookup`` then ``add`` then the answer, so a turn or a tool
call attributed to the wrong rollout shows up as a key that does not match.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from _adapter_support import (
    ERROR_KEY, OFFSET, TOOLS, add, afinish_episode, check_attribution, key_of, lookup, policy, refuse_network, specs,
    tasks, value_of,
)
from mtrl_adapters import UncapturedBedrockCall, rollout, rollout_scope
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine

boto3 = pytest.importorskip("boto3")
from botocore.awsrequest import AWSResponse  # noqa: E402
from botocore.exceptions import ClientError  # noqa: E402

KEY_ID, SECRET, SESSION = "AKIAUSERREALKEY12345", "user-real-secret-access-key", "user-real-session-token"
MODEL_ID = "us.anthropic.claude-sonnet-4-20250514-v1:0"
TOOL_CONFIG = {"tools": [{"toolSpec": {"name": t["function"]["name"], "description": t["function"]["description"],
                                       "inputSchema": {"json": t["function"]["parameters"]}}} for t in TOOLS]}


class Recorder:
    """The app, with every HTTP request it receives kept (path, headers, body)."""

    def __init__(self, app: Any) -> None:
        self.app, self.requests = app, []

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks: list[bytes] = []

        async def recv() -> dict:
            message = await receive()
            chunks.append(message.get("body", b""))
            return message

        try:
            await self.app(scope, recv, send)
        finally:
            self.requests.append((scope["path"], [(k.decode(), v.decode()) for k, v in scope["headers"]], b"".join(chunks)))


@pytest.fixture
def aws(monkeypatch):
    """Dummy AWS credentials, and a guard that refuses (and lists) any name lookup but loopback."""
    for name, value in {"AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET, "AWS_SESSION_TOKEN": SESSION,
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
                        "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_BEARER_TOKEN_BEDROCK", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    contacted = refuse_network(monkeypatch)
    yield contacted
    assert contacted == [], f"hosts other than mtrl were contacted: {contacted}"


@pytest.fixture
def bedrock_served(tmp_path: Path, tiny_tok):
    """The coordinator on the scripted policy, behind a request recorder."""
    from mtrl_runtime.coordinator import Coordinator
    from mtrl_runtime.server import create_app, start_server
    from mtrl_runtime.store import SQLiteStore

    started = []

    def start(engine: Any = None, config: MtrlConfig | None = None) -> Any:
        store = SQLiteStore(tmp_path / f"store{len(started)}.db")
        coordinator = Coordinator(engine or ScriptedEngine(tiny_tok, policy), store, config or MtrlConfig())
        recorder = Recorder(create_app(coordinator))
        handle = start_server(recorder, "127.0.0.1", 0)  # type: ignore[arg-type]
        handle.coordinator, handle.store, handle.requests = coordinator, store, recorder.requests  # type: ignore[attr-defined]
        started.append((handle, store))
        return handle

    yield start
    for handle, store in started:
        handle.stop()
        store.close()


def check_no_aws_credentials(requests: list) -> None:
    assert requests
    for path, headers, body in requests:
        seen = " ".join(f"{k}: {v}" for k, v in headers) + body.decode("latin-1")
        for secret in (KEY_ID, SECRET, SESSION, "AWS4-HMAC-SHA256"):
            assert secret not in seen, f"{path} carried {secret!r}"
        assert not {k for k, _ in headers} & {"x-amz-security-token", "x-amz-date", "x-amz-content-sha256"}


def check_one_sequence(store: Any, spec: Any) -> None:
    """Each turn's prompt extends the previous prompt + completion, token for token: one training sequence."""
    turns = store.get_rollout(spec.rollout_id).turns
    assert len(turns) >= 2
    for prev, turn in zip(turns, turns[1:]):
        assert turn.break_reason is None and turn.segment == 0, (turn.index, turn.break_reason)
        context = prev.prompt_ids + prev.completion_ids
        assert turn.prompt_ids[: len(context)] == context


def converse_paths(requests: list, rollout_id: str) -> set[str]:
    return {p.rsplit("/", 1)[-1] for p, _, _ in requests if p.startswith(f"/rollouts/{rollout_id}/model/")}


# ---------------------------------------------------------------------------------------------- Strands


@pytest.mark.parametrize("streaming", [True, False], ids=["converse-stream", "converse"])
async def test_strands_bedrock_model_concurrent_rollouts_share_one_model(bedrock_served, aws, streaming):
    """Strands' default model, built once before any rollout, shared by 16 (streamed) or 4 concurrent rollouts."""
    strands = pytest.importorskip("strands")
    from strands.models.bedrock import BedrockModel

    from mtrl_adapters.strands import agent_factory

    handle = bedrock_served()
    model = BedrockModel(model_id=MODEL_ID, region_name="us-east-1", streaming=streaming, max_tokens=512)
    make_agent = agent_factory(lambda: strands.Agent(model=model, tools=[strands.tool(lookup), strands.tool(add)],
                                                     callback_handler=None))

    @rollout
    async def run(task):
        agent = make_agent()
        result = await agent.invoke_async(task.prompt)
        await afinish_episode(task, sum(1 for m in agent.messages if m["role"] == "assistant"))
        return str(result)

    async def one(spec):
        with rollout_scope(spec):
            try:
                return await run(spec.task)
            except RuntimeError as exc:
                return str(exc)

    runs = specs(handle, tasks(16) if streaming else tasks(5)[1:])
    answers = await asyncio.gather(*(one(s) for s in runs))
    for spec, answer in zip(runs, answers):
        rollout_ = check_attribution(handle.store, spec)
        key = key_of(spec.task.prompt)
        if key != ERROR_KEY:
            assert f"is {value_of(key) + OFFSET}" in answer or "crashed on purpose" in answer
        check_one_sequence(handle.store, spec)
        assert converse_paths(handle.requests, spec.rollout_id) == {"converse-stream" if streaming else "converse"}
        assert rollout_.turns[0].tools and rollout_.turns[0].tools[0]["function"]["name"] == "lookup"
    counters = handle.coordinator.counters
    assert counters["auth_rejected"] == 0 and counters["tool_calls_unrecorded"] == 0
    check_no_aws_credentials(handle.requests)


# ---------------------------------------------------------------------------------------------- LangChain


@pytest.mark.parametrize("streamed", [False, True], ids=["ainvoke", "astream-messages"])
async def test_langchain_create_agent_with_chat_bedrock_converse(bedrock_served, aws, streamed):
    """LangChain v1 ``create_agent`` on ``ChatBedrockConverse``: one graph and one model for 16 (or 4) rollouts at once.

    ``ainvoke`` calls ``converse``; streaming the graph's messages makes the model call ``converse_stream``.
    """
    pytest.importorskip("langchain_aws")
    from langchain.agents import create_agent
    from langchain.agents.middleware import wrap_tool_call
    from langchain.messages import ToolMessage
    from langchain_aws import ChatBedrockConverse
    from langchain_core.tools import tool

    import mtrl_adapters.langgraph  # noqa: F401  (as the LangGraph adapter tests import it)

    @wrap_tool_call
    async def tool_errors_to_model(request, handler):  # docs/quickstart.md 3b: the model sees a tool's error
        try:
            return await handler(request)
        except Exception as exc:
            return ToolMessage(content=f"Error: {exc!r}", tool_call_id=request.tool_call["id"], status="error")

    handle = bedrock_served()
    llm = ChatBedrockConverse(model=MODEL_ID, region_name="us-east-1", max_tokens=512)
    graph = create_agent(llm, [tool(lookup), tool(add)], middleware=[tool_errors_to_model])

    @rollout
    async def run(task):
        inputs = {"messages": [{"role": "user", "content": task.prompt}]}
        if streamed:  # token messages as they come, and the state after each step (the last one: the end)
            async for mode, chunk in graph.astream(inputs, stream_mode=["messages", "values"]):
                if mode == "values":
                    state = chunk
        else:
            state = await graph.ainvoke(inputs)
        await afinish_episode(task, sum(1 for m in state["messages"] if m.type == "ai"))
        return state["messages"][-1].content

    async def one(spec):
        with rollout_scope(spec):
            try:
                return await run(spec.task)
            except RuntimeError as exc:  # K05's agent raises at its end
                return str(exc)

    # K03's lookup raises and the model sees it; streamed: K01 .. K04
    runs = specs(handle, tasks(5)[1:] if streamed else tasks(16))
    answers = await asyncio.gather(*(one(s) for s in runs))
    for spec, answer in zip(runs, answers):
        check_attribution(handle.store, spec)
        check_one_sequence(handle.store, spec)
        assert "DONE" in str(answer) or "crashed on purpose" in str(answer)
        assert converse_paths(handle.requests, spec.rollout_id) == {"converse-stream" if streamed else "converse"}
    check_no_aws_credentials(handle.requests)


# ---------------------------------------------------------------------------------------------- boto3 itself


def _client():
    return boto3.client("bedrock-runtime", region_name="us-east-1")


def test_client_is_untouched_outside_a_rollout_and_redirected_inside(bedrock_served, aws):
    """The same client: SigV4 to AWS before and after the rollout (answered here by a stub), mtrl inside it."""
    handle = bedrock_served()
    client = _client()
    seen: list[Any] = []

    def stub(request, **_):  # stands in for AWS outside the rollout
        seen.append((request.url, {k: v.decode() if isinstance(v, bytes) else v for k, v in request.headers.items()}))
        return AWSResponse(request.url, 200, {"content-type": "application/json"}, _Raw(b'{"output": {"message": '
                           b'{"role": "assistant", "content": [{"text": "from AWS"}]}}, "stopReason": "end_turn", '
                           b'"usage": {"inputTokens": 1, "outputTokens": 1, "totalTokens": 2}, "metrics": {"latencyMs": 1}}'))

    messages = [{"role": "user", "content": [{"text": "What is the value of key K01 plus 5?"}]}]

    def outside() -> None:
        client.meta.events.register("before-send.bedrock-runtime.Converse", stub, unique_id="test-stub")
        try:
            reply = client.converse(modelId=MODEL_ID, messages=messages)
        finally:
            client.meta.events.unregister("before-send.bedrock-runtime.Converse", unique_id="test-stub")
        assert reply["output"]["message"]["content"] == [{"text": "from AWS"}]
        url, headers = seen[-1]
        assert url.startswith("https://bedrock-runtime.us-east-1.amazonaws.com/model/")
        assert headers["Authorization"].startswith(f"AWS4-HMAC-SHA256 Credential={KEY_ID}/")

    outside()
    [spec] = specs(handle, tasks(2)[1:])

    @rollout
    def run(task):
        return client.converse(modelId=MODEL_ID, messages=messages, toolConfig=TOOL_CONFIG)

    with rollout_scope(spec):
        reply = run(spec.task)
    [block] = reply["output"]["message"]["content"]
    assert block["toolUse"]["name"] == "lookup" and block["toolUse"]["input"] == {"key": "K01"}
    assert reply["stopReason"] == "tool_use"
    [turn] = handle.store.get_rollout(spec.rollout_id).turns
    assert reply["usage"] == {"inputTokens": len(turn.prompt_ids), "outputTokens": len(turn.completion_ids),
                              "totalTokens": len(turn.prompt_ids) + len(turn.completion_ids)}
    assert turn.tool_calls[0]["id"] == block["toolUse"]["toolUseId"]
    outside()
    assert len(seen) == 2
    check_no_aws_credentials(handle.requests)


class _Raw:
    """A urllib3-like body for a stubbed AWS response."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def stream(self, *_: Any, **__: Any):
        yield self.data


def test_no_aws_credentials_needed_inside_a_rollout(bedrock_served, aws, monkeypatch):
    """The request is never signed inside a rollout, so an agent process without AWS credentials works.

    The model is named by an inference-profile ARN, whose ``/`` botocore escapes in the path.
    """
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    handle = bedrock_served()
    client = _client()
    [spec] = specs(handle, tasks(2)[1:])

    @rollout
    def run(task):
        return client.converse(modelId=f"arn:aws:bedrock:us-east-1:123456789012:inference-profile/{MODEL_ID}",
                               messages=[{"role": "user", "content": [{"text": task.prompt}]}], toolConfig=TOOL_CONFIG)

    with rollout_scope(spec):
        assert run(spec.task)["stopReason"] == "tool_use"
    [path] = [p for p, _, _ in handle.requests if "/model/" in p]
    assert path == f"/rollouts/{spec.rollout_id}/model/arn:aws:bedrock:us-east-1:123456789012:inference-profile/{MODEL_ID}/converse"


async def test_a_bedrock_api_key_never_leaves_the_agent(bedrock_served, aws, monkeypatch):
    """Bedrock API keys (Strands' ``api_key``, botocore's ``AWS_BEARER_TOKEN_BEDROCK``) are replaced too."""
    strands = pytest.importorskip("strands")
    from strands.models.bedrock import BedrockModel

    monkeypatch.setenv("AWS_BEARER_TOKEN_BEDROCK", "user-bedrock-env-key")
    handle = bedrock_served()
    keyed = BedrockModel(model_id=MODEL_ID, region_name="us-east-1", api_key="user-bedrock-api-key")
    from_env = BedrockModel(model_id=MODEL_ID, region_name="us-east-1")
    runs = specs(handle, tasks(3)[1:])

    for model, spec in zip((keyed, from_env), runs):
        @rollout
        async def run(task):
            agent = strands.Agent(model=model, tools=[strands.tool(lookup), strands.tool(add)], callback_handler=None)
            return str(await agent.invoke_async(task.prompt))

        with rollout_scope(spec):
            assert f"is {value_of(key_of(spec.task.prompt)) + OFFSET}" in await run(spec.task)
    for _, headers, body in handle.requests:
        seen = " ".join(f"{k}: {v}" for k, v in headers) + body.decode("latin-1")
        assert "user-bedrock-api-key" not in seen and "user-bedrock-env-key" not in seen
    check_no_aws_credentials(handle.requests)


def test_stream_events_reasoning_text_and_forced_tool_choice(bedrock_served, aws):
    """Reasoning and text blocks in both answers; the stop reasons; toolChoice ``any`` / ``tool`` force a call."""
    from mtrl_runtime.chat.formats import CHAT_FORMATS
    from mtrl_runtime.testing_formats import answer_text, call_text, family_tokenizer

    fmt = CHAT_FORMATS.get("hermes")
    call = call_text("hermes", [("add", {"a": 1, "b": 2})])

    def scripted(request, prompt):
        for name in ("add", None):
            if prompt.endswith(fmt.forced_prefix(name)):
                return call[len(fmt.forced_prefix(name)):]
        if "STOP" in prompt[-200:]:
            return "one two STOP three"
        return answer_text("hermes", "The answer is 3. DONE", reasoning="1 plus 2")

    handle = bedrock_served(ScriptedEngine(family_tokenizer("hermes"), scripted),
                            MtrlConfig.coerce({"advanced": {"chat_format": "hermes"}}))
    client = _client()
    [spec] = specs(handle, tasks(2)[1:])
    user = {"role": "user", "content": [{"text": "What is 1 plus 2?"}]}

    @rollout
    def run(task):
        out = {"json": client.converse(modelId=MODEL_ID, messages=[user], system=[{"text": "Be brief."}])}
        out["stream"] = list(client.converse_stream(modelId=MODEL_ID, messages=[user])["stream"])
        out["stop"] = client.converse(modelId=MODEL_ID, messages=[{"role": "user", "content": [{"text": "STOP"}]}],
                                      inferenceConfig={"stopSequences": ["STOP"]})
        out["short"] = client.converse(modelId=MODEL_ID, messages=[user], inferenceConfig={"maxTokens": 2})
        out["raw"] = httpx.post(f"{handle.url}/rollouts/{spec.rollout_id}/model/{MODEL_ID}/converse", timeout=30,
                                headers={"Authorization": f"Bearer {spec.token}"},  # no adapter: its maxTokens holds
                                json={"messages": [user], "inferenceConfig": {"maxTokens": 2}}).json()
        for choice in ({"any": {}}, {"tool": {"name": "add"}}):
            out[str(choice)] = client.converse(modelId=MODEL_ID, messages=[user],
                                               toolConfig={**TOOL_CONFIG, "toolChoice": choice})
        return out

    with rollout_scope(spec):
        out = run(spec.task)
    assert out["json"]["output"]["message"]["content"] == [
        {"reasoningContent": {"reasoningText": {"text": "1 plus 2"}}}, {"text": "The answer is 3. DONE"}]
    assert out["json"]["stopReason"] == "end_turn"
    names = [next(iter(e)) for e in out["stream"]]
    assert names == ["messageStart", "contentBlockDelta", "contentBlockStop", "contentBlockDelta", "contentBlockStop",
                     "messageStop", "metadata"]
    assert out["stream"][1]["contentBlockDelta"] == {"delta": {"reasoningContent": {"text": "1 plus 2"}},
                                                     "contentBlockIndex": 0}
    assert out["stream"][3]["contentBlockDelta"] == {"delta": {"text": "The answer is 3. DONE"}, "contentBlockIndex": 1}
    assert out["stream"][5]["messageStop"] == {"stopReason": "end_turn"}
    assert out["stream"][6]["metadata"]["usage"]["outputTokens"] > 0
    assert out["stop"]["stopReason"] == "stop_sequence"
    assert out["stop"]["output"]["message"]["content"] == [{"text": "one two "}]
    for choice in ("{'any': {}}", "{'tool': {'name': 'add'}}"):
        [block] = out[choice]["output"]["message"]["content"]
        assert block["toolUse"]["name"] == "add" and block["toolUse"]["input"] == {"a": 1, "b": 2}
    turns = handle.store.get_rollout(spec.rollout_id).turns
    assert turns[0].messages[0] == {"role": "system", "content": "Be brief."}
    # inside a rollout the rollout's sampling wins (specs() gives max_tokens 256), as on chat completions
    assert out["short"]["stopReason"] == "end_turn"
    sent = [json.loads(body) for path, _, body in handle.requests if path.endswith("/converse")]
    assert sent[2]["inferenceConfig"] == {"maxTokens": 256, "temperature": 1.0, "topP": 1.0} == sent[0]["inferenceConfig"]
    assert len(turns) == 7
    assert out["raw"]["stopReason"] == "max_tokens" and out["raw"]["usage"]["outputTokens"] == 2


def test_tool_result_status_error_and_reasoning_history_reach_the_prompt(bedrock_served, aws):
    """An assistant turn's reasoning and an error tool result, as Strands echoes them, in the recorded messages
    (the result's text unchanged, its failure flag kept: wires/_shared.py)."""
    handle = bedrock_served()
    client = _client()
    [spec] = specs(handle, tasks(2)[1:])
    messages = [
        {"role": "user", "content": [{"text": "What is the value of key K01 plus 5?"}]},
        {"role": "assistant", "content": [{"reasoningContent": {"reasoningText": {"text": "look it up", "signature": "s"}}},
                                          {"text": "Looking."},
                                          {"toolUse": {"toolUseId": "t1", "name": "lookup", "input": {"key": "K01"}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "status": "error",
                                                     "content": [{"text": "no such table"}, {"json": {"code": 7}}]}},
                                     {"text": "Try again."}]},
    ]

    @rollout
    def run(task):
        return client.converse(modelId=MODEL_ID, messages=messages, toolConfig=TOOL_CONFIG)

    with rollout_scope(spec):
        run(spec.task)
    [turn] = handle.store.get_rollout(spec.rollout_id).turns
    assert turn.messages[1:] == (
        {"role": "assistant", "content": "Looking.", "reasoning_content": "look it up",
         "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "lookup", "arguments": {"key": "K01"}}}]},
        {"role": "tool", "content": 'no such table\n{"code":7}', "tool_call_id": "t1", "name": "lookup", "status": "error"},
        {"role": "user", "content": "Try again."},
    )


def test_bad_input_is_a_validation_exception_naming_the_field_and_value(bedrock_served, aws):
    # maxTokens above the cap is refused only where the run says so (the default serves it up to the cap)
    handle = bedrock_served(config=MtrlConfig.from_dict({"advanced": {"server": {"max_tokens_over_cap": "refuse"}}}))
    [spec, other] = specs(handle, tasks(3)[1:])
    url = f"{handle.url}/rollouts/{spec.rollout_id}/model/{MODEL_ID}/converse"
    auth = {"Authorization": f"Bearer {spec.token}"}
    user = {"role": "user", "content": [{"text": "hi"}]}

    def post(body: Any, headers: dict | None = None, path: str = url) -> httpx.Response:
        return httpx.post(path, content=json.dumps(body), headers=headers if headers is not None else auth, timeout=30)

    cases = [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "system", "content": [{"text": "x"}]}]}, "'system'"),
        ({"messages": [{"role": "user", "content": [{"image": {"format": "png"}}]}]}, "messages.0.content.0.image: "),
        ({"messages": [{"role": "user", "content": [{"image": {"format": "png"}}]}]}, "text-only"),
        ({"messages": [{"role": "user", "content": [{"text": "a", "toolUse": {}}]}]}, "exactly one of"),
        ({"messages": [user], "inferenceConfig": {"maxTokens": "64"}}, "inferenceConfig.maxTokens"),
        ({"messages": [user], "inferenceConfig": {"temperature": True}}, "inferenceConfig.temperature"),
        ({"messages": [user], "guardrailConfig": {"guardrailIdentifier": "g"}}, "mtrl applies no guardrails"),
        ({"messages": [user], "guardrailConfig": {"guardrailIdentifier": "g"}}, "guardrailConfig: "),
        ({"messages": [user], "additionalModelRequestFields": {"top_k": 5}}, "top_k: not a field"),
        ({"messages": [user], "toolConfig": {"tools": [{"toolSpec": {"name": "f"}}]}}, "inputSchema"),
        ({"messages": [user], "toolConfig": {**TOOL_CONFIG, "toolChoice": {"tool": {"name": "rm_rf"}}}}, "rm_rf"),
        ({"messages": [user], "inferenceConfig": {"maxTokens": 10**9}}, "inferenceConfig.maxTokens: 1000000000"),
        ({"messages": [{"role": "user", "content": [{"toolUse": {"toolUseId": "a", "name": "f", "input": {}}}]}]},
         "messages[0].content[0].toolUse: only assistant messages"),
        ({"messages": [user], "surprise": 1}, "surprise"),
    ]
    for body, expected in cases:
        reply = post(body)
        assert reply.status_code == 400, (body, reply.text)
        assert reply.headers["x-amzn-errortype"] == "ValidationException"
        assert expected in reply.json()["message"], (expected, reply.json())
    denied = post({"messages": [user]}, {"Authorization": f"Bearer {other.token}"})
    assert denied.status_code in (401, 403) and denied.headers["x-amzn-errortype"] == "AccessDeniedException"
    sigv4 = post({"messages": [user]}, {"Authorization": "AWS4-HMAC-SHA256 Credential=AKIAOTHER/x"})
    assert sigv4.status_code == 401 and sigv4.headers["x-amzn-errortype"] == "AccessDeniedException"
    unnamed = post({"messages": [user]}, path=f"{handle.url}/model/{MODEL_ID}/converse-stream")
    assert unnamed.status_code == 400 and "x-mtrl-rollout-id" in unnamed.json()["message"]
    with rollout_scope(other):
        rollout(lambda task: None)(other.task)  # the rollout ends: later calls are refused, not recorded
    ended = post({"messages": [user]}, {"Authorization": f"Bearer {other.token}"},
                 path=f"{handle.url}/rollouts/{other.rollout_id}/model/{MODEL_ID}/converse")
    assert ended.status_code == 409 and ended.headers["x-amzn-errortype"] == "ConflictException", ended.text
    assert handle.store.get_rollout(spec.rollout_id).turns == ()  # nothing refused was recorded

    # the same refusals as botocore raises them for an agent
    client = _client()
    sent_before = len(handle.requests)

    @rollout
    def run(task):
        with pytest.raises(ClientError) as refused:
            client.converse(modelId=MODEL_ID, messages=[{"role": "user", "content": [
                {"image": {"format": "png", "source": {"bytes": b"\x89PNG"}}}]}])
        assert refused.value.response["Error"]["Code"] == "ValidationException"
        message = refused.value.response["Error"]["Message"]
        assert "messages.0.content.0.image" in message and "text-only" in message
        with pytest.raises(UncapturedBedrockCall, match="converse"):
            client.invoke_model(modelId=MODEL_ID, body=b"{}")

    with rollout_scope(spec):
        run(spec.task)
    check_no_aws_credentials(handle.requests[sent_before:])


def test_event_stream_framing_is_what_botocore_checks():
    """Each message's two CRC32s are the ones botocore verifies: one flipped payload byte is refused."""
    from botocore.eventstream import ChecksumMismatch, EventStreamBuffer

    from mtrl_runtime.wires.bedrock_converse.eventstream import event

    raw = event("contentBlockDelta", b'{"delta":{"text":"hi"},"contentBlockIndex":0}')
    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    [message] = list(buffer)
    assert message.headers == {":event-type": "contentBlockDelta", ":content-type": "application/json",
                               ":message-type": "event"}
    assert json.loads(message.payload) == {"delta": {"text": "hi"}, "contentBlockIndex": 0}
    corrupt = bytearray(raw)
    corrupt[-6] ^= 1
    buffer = EventStreamBuffer()
    buffer.add_data(bytes(corrupt))
    with pytest.raises(ChecksumMismatch):
        list(buffer)


def test_the_adapters_stay_light_and_install_once():
    """``import mtrl_adapters`` and ``instrument_bedrock()`` load no botocore; the redirect installs once, at
    botocore's import, whatever calls it after."""
    import subprocess
    import sys

    code = ("import sys, mtrl_adapters; assert 'botocore' not in sys.modules; "
            "waits = mtrl_adapters.instrument_bedrock(); assert 'botocore' not in sys.modules; "
            "import botocore.client; from mtrl_adapters._patches import PATCHES; "
            "print(waits, *PATCHES.layers_on(botocore.client.BaseClient, '_make_api_call'), "
            "mtrl_adapters.instrument_bedrock())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "redirect", "False"]
