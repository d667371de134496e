"""Bedrock ``converse-stream`` streams as the engine decodes: botocore's own event-stream parser, real Strands.

The scripted engine with a per-token delay makes the timing deterministic
(as tests/test_streaming.py does for the other protocols). Every call goes
through the ``mtrl_adapters`` redirect of a boto3 ``bedrock-runtime`` client
with dummy AWS credentials; the ``aws`` fixture refuses any lookup but
loopback (fixtures shared with tests/test_protocol_bedrock.py).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from _adapter_support import OFFSET, key_of, lookup, specs, tasks, value_of
from mtrl_adapters import rollout, rollout_scope
from mtrl_runtime.chat import message_key
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply

boto3 = pytest.importorskip("boto3")
from botocore.exceptions import ClientError, EventStreamError  # noqa: E402
from test_protocol_bedrock import MODEL_ID, TOOL_CONFIG, aws, bedrock_served  # noqa: E402,F401  (fixtures)

LONG = "Sure, here is a longer answer with quite a few words in it, so that it takes many tokens to write out."
STEP = 0.04


def _timed_events(client: Any, **kwargs: Any) -> tuple[list[tuple[float, dict]], float]:
    """Every event of one ``converse_stream`` call with the seconds since the call was made, and the total."""
    started = time.perf_counter()
    response = client.converse_stream(modelId=MODEL_ID, **kwargs)
    events = [(time.perf_counter() - started, event) for event in response["stream"]]
    return events, time.perf_counter() - started


def _blocks(events: list[dict]) -> list[dict]:
    """The content blocks a client assembles from the stream (as Strands and LangChain do), in index order."""
    blocks: dict[int, dict] = {}
    for event in events:
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            tool = start["start"]["toolUse"]
            blocks[start["contentBlockIndex"]] = {"toolUse": {**tool, "input": ""}}
        elif "contentBlockDelta" in event:
            delta, index = event["contentBlockDelta"]["delta"], event["contentBlockDelta"]["contentBlockIndex"]
            if "text" in delta:
                blocks.setdefault(index, {"text": ""})["text"] += delta["text"]
            elif "reasoningContent" in delta:
                block = blocks.setdefault(index, {"reasoningContent": {"reasoningText": {"text": ""}}})
                block["reasoningContent"]["reasoningText"]["text"] += delta["reasoningContent"]["text"]
            else:
                blocks[index]["toolUse"]["input"] += delta["toolUse"]["input"]
    for block in blocks.values():
        if "toolUse" in block:
            block["toolUse"]["input"] = json.loads(block["toolUse"]["input"])
    return [blocks[i] for i in sorted(blocks)]


def test_converse_stream_leaves_as_tokens_are_decoded_and_equals_converse(bedrock_served, aws, tiny_tok):
    reply = ScriptedReply.tool_call("lookup", {"key": "K01"}, text="<think>plan it</think>" + LONG + " ")
    engine = ScriptedEngine(tiny_tok, lambda request, prompt: reply)  # the whole answer, to compare with: at once
    handle = bedrock_served(engine)
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    streamed, whole = specs(handle, tasks(2)[1:] * 2)  # one task, two rollouts
    ask = dict(messages=[{"role": "user", "content": [{"text": "What is the value of key K01 plus 5?"}]}],
               toolConfig=TOOL_CONFIG)

    @rollout
    def call(task, stream):
        return _timed_events(client, **ask) if stream else client.converse(modelId=MODEL_ID, **ask)

    with rollout_scope(whole):
        answer = call(whole.task, False)
    engine.token_delay_s = STEP  # the streamed call: one token every step
    with rollout_scope(streamed):
        timed, total = call(streamed.task, True)
    events = [e for _, e in timed]
    first = {}
    for t, event in timed:
        name = next(iter(event))
        kind = next(iter(event[name]["delta"])) if name == "contentBlockDelta" else name
        first.setdefault(kind, t)
    n_tokens = len(handle.store.get_rollout(streamed.rollout_id).turns[0].completion_ids)
    assert total >= n_tokens * STEP  # the engine really took one step per token
    # "<think>" is 6 tokens of the tiny tokenizer: the reasoning's first delta a few steps in, not after the reply,
    # the steps counted at the pace the engine really ran (a loaded machine stretches each sleep alike)
    pace = total / n_tokens
    assert first["messageStart"] < first["reasoningContent"] < first["messageStart"] + 8 * pace + 0.3 < total / 5, (
        first, total, pace)
    assert first["text"] < total / 2  # the text streamed long before the call was parsed out of the reply
    assert first["contentBlockStart"] > first["text"]  # the toolUse block only at the end
    text_deltas = [e for e in events if "text" in e.get("contentBlockDelta", {}).get("delta", {})]
    assert len(text_deltas) > 5  # deltas, not one burst

    names = [next(iter(e)) for e in events]
    assert names[0] == "messageStart" and names[-2:] == ["messageStop", "metadata"]
    assert "contentBlockStart" not in names[: names.index("messageStop") - 3]  # text blocks open with their delta
    def without_ids(blocks: list[dict]) -> list[dict]:  # each call has an id of its own
        return [{"toolUse": {**b["toolUse"], "toolUseId": None}} if "toolUse" in b else b for b in blocks]

    assert without_ids(_blocks(events)) == without_ids(answer["output"]["message"]["content"])
    assert [list(b) for b in _blocks(events)] == [["reasoningContent"], ["text"], ["toolUse"]]
    assert events[-2]["messageStop"] == {"stopReason": "tool_use"} and answer["stopReason"] == "tool_use"
    assert events[-1]["metadata"]["usage"] == answer["usage"]
    assert events[-1]["metadata"]["metrics"]["latencyMs"] >= n_tokens * STEP * 1000 * 0.9

    a, b = (handle.store.get_rollout(s.rollout_id).turns for s in (streamed, whole))
    assert len(a) == len(b) == 1
    assert a[0].prompt_ids == b[0].prompt_ids and a[0].completion_ids == b[0].completion_ids
    assert a[0].logprobs == b[0].logprobs and a[0].reasoning == b[0].reasoning == "plan it"
    assert events[-1]["metadata"]["usage"]["outputTokens"] == len(a[0].completion_ids)
    assert _blocks(events)[2]["toolUse"]["toolUseId"] == a[0].tool_calls[0]["id"]


async def test_strands_bedrock_model_streams_text_before_the_generation_ends_and_records_the_same_turns(
    bedrock_served, aws, tiny_tok
):
    """A Strands agent on ``BedrockModel(streaming=True)`` gets its text as it is decoded; its turns equal a
    ``streaming=False`` agent's, token for token (so Strands rebuilt the streamed message exactly)."""
    strands = pytest.importorskip("strands")
    from strands.models.bedrock import BedrockModel

    from mtrl_adapters.strands import agent_factory

    def scripted(request, prompt):
        key = key_of(prompt)
        if request.turn_index == 0:
            return ScriptedReply.tool_call("lookup", {"key": key}, text=LONG + " ")
        return f"{LONG} The answer for {key} is {value_of(key) + OFFSET}. DONE"

    engine = ScriptedEngine(tiny_tok, scripted)  # the streaming=False agent's turns, to compare with: at once
    handle = bedrock_served(engine)
    streamed, whole = specs(handle, tasks(2)[1:] * 2)  # one task, two rollouts
    tools = [strands.tool(lookup)]
    seen: list[tuple[float, str]] = []

    async def run(spec, streaming):
        model = BedrockModel(model_id=MODEL_ID, region_name="us-east-1", streaming=streaming, max_tokens=512)
        agent = agent_factory(lambda: strands.Agent(model=model, tools=tools, callback_handler=None))()

        @rollout
        async def go(task):
            started = time.perf_counter()
            async for event in agent.stream_async(task.prompt):
                if "data" in event:
                    seen.append((time.perf_counter() - started, event["data"]))
            return time.perf_counter() - started

        with rollout_scope(spec):
            return await go(spec.task)

    await run(whole, False)
    whole_texts = len(seen)
    engine.token_delay_s = STEP  # the streamed agent: one token every step
    total = await run(streamed, True)
    streamed_texts = seen[whole_texts:]
    a, b = (handle.store.get_rollout(s.rollout_id).turns for s in (streamed, whole))
    first_turn = len(a[0].completion_ids) * STEP
    assert streamed_texts and streamed_texts[0][0] < first_turn / 5 < total, (streamed_texts[0], first_turn, total)
    assert len([t for t, _ in streamed_texts if t < first_turn]) > 5  # pieces, while the first turn was decoded
    assert "".join(text for _, text in streamed_texts).startswith(LONG)
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert [message_key(m) for m in x.messages] == [message_key(m) for m in y.messages]
        assert x.prompt_ids == y.prompt_ids and x.completion_ids == y.completion_ids and x.logprobs == y.logprobs
    assert handle.store.get_rollout(streamed.rollout_id).tool_calls[0].name == "lookup"


def test_a_client_closing_converse_stream_mid_stream_records_no_turn(bedrock_served, aws, tiny_tok):
    engine = ScriptedEngine(tiny_tok, lambda request, prompt: LONG * 4, token_delay_s=0.02)
    handle = bedrock_served(engine)
    [spec] = specs(handle, tasks(2)[1:])
    url = f"{handle.url}/rollouts/{spec.rollout_id}/model/{MODEL_ID}/converse-stream"
    body = {"messages": [{"role": "user", "content": [{"text": "go"}]}]}
    with httpx.stream("POST", url, json=body, headers={"authorization": f"Bearer {spec.token}"}, timeout=30) as r:
        assert r.status_code == 200 and r.headers["content-type"] == "application/vnd.amazon.eventstream"
        next(r.iter_bytes())  # messageStart: the generation is under way; then hang up
    deadline = time.monotonic() + 10
    while handle.coordinator.counters["streams_closed"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert handle.coordinator.counters["streams_closed"] == 1
    time.sleep(0.1)
    assert handle.store.count_turns(spec.rollout_id) == 0
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.status.value == "running"

    client = boto3.client("bedrock-runtime", region_name="us-east-1")

    @rollout
    def again(task):  # the agent may retry: that call becomes turn 0
        return _timed_events(client, **body)[0]

    with rollout_scope(spec):
        events = again(spec.task)
    assert "".join(b.get("text", "") for b in _blocks([e for _, e in events])) == (LONG * 4).strip()
    assert [t.index for t in handle.store.get_rollout(spec.rollout_id).turns] == [0]


class _FailsMidStream(ScriptedEngine):
    """Streams a few tokens of its reply, then fails as an engine can (a worker error, a lost server)."""

    async def generate_stream(self, request: Any) -> Any:
        sent = 0
        async for item in super().generate_stream(request):
            if sent == 12:
                raise RuntimeError("the decode step failed")
            yield item
            sent += 1


def test_engine_failure_mid_stream_is_an_exception_event_botocore_raises_and_records_nothing(
    bedrock_served, aws, tiny_tok
):
    handle = bedrock_served(_FailsMidStream(tiny_tok, lambda request, prompt: LONG, token_delay_s=0.01))
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    [spec] = specs(handle, tasks(2)[1:])
    user = [{"role": "user", "content": [{"text": "go"}]}]
    received: list[dict] = []

    @rollout
    def run(task):
        with pytest.raises(ClientError) as refused:  # refused before any event: an ordinary error
            client.converse_stream(modelId=MODEL_ID, messages=user,
                                   toolConfig={**TOOL_CONFIG, "toolChoice": {"tool": {"name": "rm_rf"}}})
        assert refused.value.response["Error"]["Code"] == "ValidationException"
        with pytest.raises(EventStreamError) as failed:
            for event in client.converse_stream(modelId=MODEL_ID, messages=user)["stream"]:
                received.append(event)
        return failed.value

    with rollout_scope(spec):
        error = run(spec.task)
    assert error.response["Error"]["Code"] == "modelStreamErrorException"
    assert "the policy engine failed" in error.response["Error"]["Message"]
    text = "".join(b.get("text", "") for b in _blocks(received))
    assert text and LONG.startswith(text)  # the text before the failure had left
    assert handle.store.count_turns(spec.rollout_id) == 0 and handle.coordinator.counters["engine_failures"] == 1
