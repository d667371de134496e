"""The policy endpoint against the official openai client on loopback."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import httpx
import openai
import pytest
import torch

from _server_process import MTRL_SERVING, server_process
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.engines.hf import HFEngine
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.types import Task

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a key up.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    }
]


def _client(handle, rollout) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{handle.url}/rollouts/{rollout.rollout_id}/v1", api_key=rollout.token, max_retries=0)


def test_sync_async_and_streaming_clients_are_served_and_recorded(served, tiny_tok):
    engine = ScriptedEngine(tiny_tok, lambda req, text: "The answer is 42.")
    handle = served(engine)
    rollout = handle.coordinator.create_rollout(Task(id="t1", prompt="q"))
    client = _client(handle, rollout)

    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "What is it?"}])
    assert reply.choices[0].message.content == "The answer is 42."
    assert reply.choices[0].finish_reason == "stop"
    assert reply.usage.completion_tokens > 0

    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "again"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The answer is 42."
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens > 0

    async def go() -> str:
        aclient = openai.AsyncOpenAI(base_url=f"{handle.url}/rollouts/{rollout.rollout_id}/v1", api_key=rollout.token)
        r = await aclient.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
        await aclient.close()
        return r.choices[0].message.content

    import asyncio

    assert asyncio.run(go()) == "The answer is 42."
    stored = handle.store.get_rollout(rollout.rollout_id)
    assert [t.index for t in stored.turns] == [0, 1, 2]
    assert all(t.completion_text == "The answer is 42." for t in stored.turns)


def test_header_attribution_and_models_and_health(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, lambda req, text: "ok"))
    rollout = handle.coordinator.create_rollout(Task(id="t1", prompt="q"))
    client = openai.OpenAI(
        base_url=f"{handle.url}/v1",
        api_key=rollout.token,
        default_headers={"x-mtrl-rollout-id": rollout.rollout_id},
        max_retries=0,
    )
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert handle.store.count_turns(rollout.rollout_id) == 1
    assert [m.id for m in client.models.list()] == ["smollm2-135m"]
    health = httpx.get(f"{handle.url}/health").json()
    assert health["status"] == "ok" and health["engine"] == "scripted"


def test_tool_calls_round_trip_through_the_client(served, tiny_tok):
    def script(req, text):
        if req.turn_index == 0:
            return ScriptedReply.tool_call("lookup", {"key": "A1"})
        return "The value is 42."

    handle = served(ScriptedEngine(tiny_tok, script))
    rollout = handle.coordinator.create_rollout(Task(id="t1", prompt="q"))
    client = _client(handle, rollout)
    messages = [{"role": "user", "content": "Find A1."}]
    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "lookup" and json.loads(call.function.arguments) == {"key": "A1"}
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"value": 42}'},
    ]
    second = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == "The value is 42."
    turns = handle.store.get_rollout(rollout.rollout_id).turns
    assert turns[0].tool_calls[0]["function"]["name"] == "lookup"
    assert turns[1].break_reason is None and turns[1].segment == 0
    assert turns[1].prompt_ids[: len(turns[0].prompt_ids) + len(turns[0].completion_ids)] == (
        turns[0].prompt_ids + turns[0].completion_ids
    )


def test_token_ids_and_logprobs_match_a_direct_forward_pass(served, tiny_tok):
    from mtrl_runtime.testing import tiny_model

    model = tiny_model(tiny_tok)
    engine = HFEngine.from_objects(model, tiny_tok)
    handle = served(engine)
    rollout = handle.coordinator.create_rollout(Task(id="t1", prompt="q"))
    client = _client(handle, rollout)
    reply = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "Say something."}],
        max_tokens=12,
        logprobs=True,
        extra_body={"return_token_ids": True},
    )
    body = reply.model_dump()
    prompt_ids = body["prompt_token_ids"]
    completion_ids = body["choices"][0]["token_ids"]
    response_lps = [c["logprob"] for c in body["choices"][0]["logprobs"]["content"]]
    turn = handle.store.get_rollout(rollout.rollout_id).turns[0]
    assert list(turn.prompt_ids) == prompt_ids and list(turn.completion_ids) == completion_ids
    assert len(completion_ids) == len(turn.logprobs) > 0

    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    start = len(prompt_ids)
    expected = [logprobs[start - 1 + i, tok].item() for i, tok in enumerate(completion_ids)]
    assert turn.logprobs == pytest.approx(expected, abs=1e-4)
    assert response_lps == pytest.approx(expected, abs=1e-4)


def test_six_turn_conversation_is_one_extending_sequence(served, tiny_tok):
    def script(req, text):
        if req.turn_index < 5:
            return ScriptedReply.tool_call("lookup", {"key": f"K{req.turn_index}"})
        return "Done."

    handle = served(ScriptedEngine(tiny_tok, script))
    rollout = handle.coordinator.create_rollout(Task(id="t1", prompt="q"))
    client = _client(handle, rollout)
    messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Go."}]
    for turn in range(6):
        reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or []:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": f"value {turn}"})
    turns = handle.store.get_rollout(rollout.rollout_id).turns
    assert len(turns) == 6
    assert {t.segment for t in turns} == {0} and all(t.break_reason is None for t in turns)
    for prev, cur in zip(turns, turns[1:]):
        context = prev.prompt_ids + prev.completion_ids
        assert cur.prompt_ids[: len(context)] == context
    assert handle.coordinator.counters["turns"] == 6


@pytest.mark.parametrize(
    "content, headers, expected_status, needle",
    [
        (b"{not json", {}, 400, "not valid JSON"),
        (json.dumps({"messages": [{"role": "wizard", "content": "hi"}]}).encode(), {}, 400, "wizard"),
        (json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}).encode(), {}, 400, "max_tokens"),
        (json.dumps({"messages": []}).encode(), {}, 400, "messages"),
    ],
)
def test_bad_requests_get_a_4xx_naming_the_problem(served, tiny_tok, content, headers, expected_status, needle):
    handle = served(ScriptedEngine(tiny_tok, lambda req, text: "ok"))
    rollout = handle.coordinator.create_rollout(Task(id="t1", prompt="q"))
    response = httpx.post(
        f"{handle.url}/rollouts/{rollout.rollout_id}/v1/chat/completions",
        content=content,
        headers={"authorization": f"Bearer {rollout.token}", "content-type": "application/json", **headers},
    )
    assert response.status_code == expected_status
    assert needle in response.json()["error"]["message"]
    assert handle.store.count_turns(rollout.rollout_id) == 0


def test_unknown_rollout_wrong_token_oversized_body_and_unattributed(served, tiny_tok):
    config = MtrlConfig.from_dict({"advanced": {"server": {"max_body_bytes": 2048}}})
    handle = served(ScriptedEngine(tiny_tok, lambda req, text: "ok"), config)
    rollout = handle.coordinator.create_rollout(Task(id="t1", prompt="q"))
    body = {"messages": [{"role": "user", "content": "hi"}]}

    r = httpx.post(f"{handle.url}/rollouts/r-nope/v1/chat/completions", json=body, headers={"authorization": "Bearer x"})
    assert r.status_code == 404 and "r-nope" in r.json()["error"]["message"]

    r = httpx.post(
        f"{handle.url}/rollouts/{rollout.rollout_id}/v1/chat/completions", json=body, headers={"authorization": "Bearer wrong"}
    )
    assert r.status_code == 403 and rollout.rollout_id in r.json()["error"]["message"]

    big = {"messages": [{"role": "user", "content": "x" * 5000}]}
    r = httpx.post(
        f"{handle.url}/rollouts/{rollout.rollout_id}/v1/chat/completions",
        json=big,
        headers={"authorization": f"Bearer {rollout.token}"},
    )
    assert r.status_code == 413 and "2048" in r.json()["error"]["message"]

    r = httpx.post(f"{handle.url}/v1/chat/completions", json=body)
    assert r.status_code == 400 and "inference mode" in r.json()["error"]["message"]
    assert handle.store.count_turns(rollout.rollout_id) == 0


def test_inference_mode_serves_unattributed_calls(served, tiny_tok):
    config = MtrlConfig.from_dict({"advanced": {"server": {"inference_mode": True}}})
    handle = served(ScriptedEngine(tiny_tok, lambda req, text: "free"), config)
    client = openai.OpenAI(base_url=f"{handle.url}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert reply.choices[0].message.content == "free"


_SERVE_SCRIPT = """
import sys
from mtrl_runtime.cli import main
sys.exit(main(["serve", "--engine", "hf", "--model", sys.argv[1], "--run-dir", sys.argv[2], "--port", sys.argv[3]]))
"""


def test_sigkill_of_a_serving_process_loses_no_answered_turn(tmp_path: Path, tiny_model_dir: Path):
    run_dir = tmp_path / "run"
    command = [sys.executable, "-c", _SERVE_SCRIPT, str(tiny_model_dir), str(run_dir), "0"]  # --port 0: a free one
    with server_process(command, url_line=MTRL_SERVING, health="/health",
                        env={**os.environ, "PYTHONUNBUFFERED": "1"}) as (server, url):
        created = httpx.post(f"{url}/v1/rollouts", json={"task_id": "t1", "prompt": "q"}).json()
        client = openai.OpenAI(base_url=created["base_url"], api_key=created["token"], max_retries=0)
        answered = []
        for i in range(5):
            reply = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"turn {i}"}], max_tokens=4
            )
            answered.append(reply.choices[0].message.content)
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
    store = SQLiteStore(run_dir / "trajectories.db")
    try:
        turns = store.get_rollout(created["rollout_id"]).turns
        assert [t.completion_text for t in turns] == answered
    finally:
        store.close()


def test_rollout_routes_record_tool_calls_reward_and_end(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, lambda req, text: "ok"))
    rollout = handle.coordinator.create_rollout(Task(id="t1", prompt="q"))
    auth = {"authorization": f"Bearer {rollout.token}"}
    client = _client(handle, rollout)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    base = f"{handle.url}/rollouts/{rollout.rollout_id}"
    r = httpx.post(f"{base}/tool_calls", json={"name": "lookup", "arguments": {"key": "A1"}, "result": "42"}, headers=auth)
    assert r.status_code == 200, r.text
    assert httpx.post(f"{base}/reward", json={"reward": 0.5, "metrics": {"acc": 1.0}}, headers=auth).status_code == 200
    state = httpx.post(f"{base}/complete", json={"status": "completed"}, headers=auth).json()
    assert (state["status"], state["turns"], state["tool_calls"], state["reward"]) == ("completed", 1, 1, 0.5)
    assert httpx.get(base, headers=auth).json()["tool_calls"] == 1
    other = handle.coordinator.create_rollout(Task(id="t2", prompt="q"))
    r = httpx.post(f"{base}/reward", json={"reward": 0.9}, headers={"authorization": f"Bearer {other.token}"})
    assert r.status_code == 403
    r = httpx.post(f"{base}/reward", json={"reward": 0.9}, headers=auth)
    assert r.status_code == 409 and "0.9" in r.json()["error"]["message"]
    assert handle.store.get_rollout(rollout.rollout_id).reward == 0.5
