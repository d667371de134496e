"""aiobotocore (async botocore) ``bedrock-runtime`` clients inside rollouts: converse and converse_stream captured.

aiobotocore overrides botocore's ``_make_api_call`` with a coroutine, so only
``mtrl_adapters._aiobotocore`` redirects it. One client, built before any
rollout, runs a Converse tool loop in 4 concurrent rollouts with dummy AWS
credentials; a guard refuses every name lookup but loopback, so a call that
slipped past mtrl to AWS fails the test. Every turn is token-exact (one
sequence per rollout), every tool call recorded and its own, and no request
mtrl received carries an AWS credential or signature.

aiobotocore pins an exact botocore range (3.10.0: botocore < 1.43.118); this
venv keeps botocore 1.44.8 for boto3 and Strands, so aiobotocore is not a
declared dependency and the test is skipped when it is not importable. It was
run with aiobotocore 3.10.0 put on PYTHONPATH beside botocore 1.44.8
(``pip install --target DIR --no-deps aiobotocore==3.10.0 aioitertools``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from _adapter_support import ERROR_KEY, OFFSET, add, afinish_episode, check_attribution, lookup, specs, tasks
from mtrl_adapters import UncapturedBedrockCall, aupdate_reward, record_tool_call, rollout, rollout_scope
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.types import RolloutStatus
from test_protocol_bedrock import (  # noqa: F401  (fixtures)
    MODEL_ID, TOOL_CONFIG, aws, bedrock_served, check_no_aws_credentials, check_one_sequence, converse_paths,
)
from test_selective_capture import USAGE, upstream  # noqa: F401  (a loopback Bedrock upstream for the judge)

aio_session = pytest.importorskip(
    "aiobotocore.session",
    reason="aiobotocore is not installed: every release pins botocore below the 1.44.8 this venv keeps",
)
TOOLS = {"lookup": lookup, "add": add}


async def _converse(client: Any, streaming: bool, messages: list) -> dict[str, Any]:
    """One Converse call; a stream is folded into the message converse would have returned."""
    if not streaming:
        reply = await client.converse(modelId=MODEL_ID, messages=messages, toolConfig=TOOL_CONFIG)
        return reply["output"]["message"]
    reply = await client.converse_stream(modelId=MODEL_ID, messages=messages, toolConfig=TOOL_CONFIG)
    blocks: dict[int, dict[str, Any]] = {}
    async for event in reply["stream"]:
        if "contentBlockStart" in event:
            start = event["contentBlockStart"]
            blocks[start["contentBlockIndex"]] = {"toolUse": {**start["start"]["toolUse"], "input": ""}}
        elif "contentBlockDelta" in event:
            delta = event["contentBlockDelta"]
            block = blocks.setdefault(delta["contentBlockIndex"], {"text": ""})
            if "text" in delta["delta"]:
                block["text"] = block.get("text", "") + delta["delta"]["text"]
            elif "toolUse" in delta["delta"]:
                block["toolUse"]["input"] += delta["delta"]["toolUse"]["input"]
    import json

    for block in blocks.values():
        if "toolUse" in block:
            block["toolUse"]["input"] = json.loads(block["toolUse"]["input"] or "{}")
    return {"role": "assistant", "content": [blocks[i] for i in sorted(blocks)]}


def _agent(client: Any, streaming: bool) -> Any:
    @rollout
    async def run(task):
        messages = [{"role": "user", "content": [{"text": task.prompt}]}]
        for _ in range(4):
            message = await _converse(client, streaming, messages)
            messages.append(message)
            uses = [b["toolUse"] for b in message["content"] if "toolUse" in b]
            if not uses:
                break
            results = []
            for use in uses:
                started = time.perf_counter()
                try:
                    result, error = TOOLS[use["name"]](**use["input"]), None
                except Exception as exc:  # noqa: BLE001  (the model sees the tool's error)
                    result, error = None, f"{type(exc).__name__}: {exc}"
                record_tool_call(use["name"], use["input"], result=result, error=error, call_id=use["toolUseId"],
                                 latency_s=time.perf_counter() - started)
                content = [{"text": error}] if error else [{"json": result} if not isinstance(result, (int, str))
                                                           else {"text": str(result)}]
                results.append({"toolResult": {"toolUseId": use["toolUseId"], "content": content,
                                               "status": "error" if error else "success"}})
            messages.append({"role": "user", "content": results})
        await afinish_episode(task, sum(1 for m in messages if m["role"] == "assistant"))
        return messages[-1]["content"][0].get("text", "")

    return run


@pytest.mark.parametrize("streaming", [False, True], ids=["converse", "converse-stream"])
async def test_aiobotocore_client_shared_by_concurrent_rollouts_is_captured(bedrock_served, aws, streaming):
    handle = bedrock_served()
    session = aio_session.get_session()
    async with session.create_client("bedrock-runtime", region_name="us-east-1") as client:
        run = _agent(client, streaming)

        async def one(spec):
            with rollout_scope(spec):
                return await run(spec.task)

        runs = specs(handle, tasks(5)[1:])  # K01..K04: K03's lookup fails and the model is told
        answers = await asyncio.gather(*(one(s) for s in runs))
    for spec, answer in zip(runs, answers):
        check_attribution(handle.store, spec)
        check_one_sequence(handle.store, spec)
        assert converse_paths(handle.requests, spec.rollout_id) == {"converse-stream" if streaming else "converse"}
        if ERROR_KEY not in spec.task.prompt:
            assert f"plus {OFFSET}" in spec.task.prompt and "DONE" in answer
    assert handle.coordinator.counters["auth_rejected"] == 0
    check_no_aws_credentials(handle.requests)


async def test_aiobotocore_invoke_model_is_refused_inside_a_rollout(bedrock_served, aws):
    handle = bedrock_served()
    [spec] = specs(handle, tasks(1))
    session = aio_session.get_session()
    async with session.create_client("bedrock-runtime", region_name="us-east-1") as client:

        @rollout
        async def run(task):
            await client.invoke_model(modelId=MODEL_ID, body=b'{"prompt": "hi"}')

        with rollout_scope(spec), pytest.raises(UncapturedBedrockCall, match="converse"):
            await run(spec.task)
    assert handle.requests == [] or all("/invoke" not in p for p, _, _ in handle.requests)


async def test_aiobotocore_judge_passes_through_signed_and_recorded(served, tiny_tok, upstream):
    """Selective capture: the policy's call lands on mtrl unsigned; the judge's goes to its endpoint, signed, recorded."""
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "Paris."))
    creds = {"region_name": "us-east-1", "aws_access_key_id": "AKIAUSERKEY", "aws_secret_access_key": "user-secret"}
    ask = [{"role": "user", "content": [{"text": "What is the capital of France?"}]}]
    session = aio_session.get_session()
    async with session.create_client("bedrock-runtime", endpoint_url="http://127.0.0.1:9", **creds) as policy_client, \
            session.create_client("bedrock-runtime", endpoint_url=upstream.url, **creds) as judge_client:

        @rollout(policy_models="policy-model")
        async def run(task: Any) -> None:
            answer = await policy_client.converse(modelId="policy-model", messages=ask)
            text = answer["output"]["message"]["content"][0]["text"]
            verdict = await judge_client.converse(modelId="judge-model",
                                                  messages=[{"role": "user", "content": [{"text": text}]}])
            await aupdate_reward(1.0 if verdict["output"]["message"]["content"][0]["text"] == "SCORE 1" else 0.0)

        [spec] = specs(handle, tasks(1))
        with rollout_scope(spec):
            await run(spec.task)
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.status is RolloutStatus.COMPLETED and stored.reward == 1.0
    assert [t.completion_text for t in stored.turns] == ["Paris."]  # the policy's call, captured
    [sent] = upstream.calls
    assert sent["path"] == "/model/judge-model/converse"
    assert sent["headers"]["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIAUSERKEY/")
    assert "x-mtrl-rollout-id" not in sent["headers"]
    [call] = stored.model_calls
    assert (call.protocol, call.model, call.input_tokens, call.output_tokens) == ("bedrock", "judge-model", *USAGE)
