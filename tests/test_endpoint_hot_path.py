"""The endpoint's hot path: the plain ASGI chat route, group commit on the event loop, the frozen startup heap."""

from __future__ import annotations

import asyncio
import gc
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.server import create_app, start_server
from mtrl_runtime.server.protocols.openai_chat import ChatProtocol, chat_path_rollout
from mtrl_runtime.store import SQLiteStore, hash_token
from mtrl_runtime.types import Rollout, Task, Turn
from mtrl_runtime.wires.openai_chat import ChatCompletionRequest

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def _turn(rollout_id: str, index: int) -> Turn:
    return Turn(
        rollout_id=rollout_id, index=index, messages=({"role": "user", "content": "hi"},), prompt_ids=(1, 2, 3),
        completion_ids=(4, 5), logprobs=(-0.5, -0.25), finish_reason="stop", completion_text="ok",
    )


def _wal_frames(store: SQLiteStore) -> int:
    """Frames written to the WAL so far: each commit writes at least one (a page and its 24-byte header)."""
    page = store._reader().execute("PRAGMA page_size").fetchone()[0]
    size = Path(f"{store.path}-wal").stat().st_size
    return max(0, size - 32) // (page + 24)


def _open_rollouts(store: SQLiteStore, n: int) -> list[str]:
    store.put_task(Task(id="t", prompt="p"))
    ids = [f"r{i}" for i in range(n)]
    for rid in ids:
        store.create_rollout(Rollout(id=rid, task_id="t", group_id="g"), hash_token("token"))
    return ids


def test_writes_awaited_in_one_loop_iteration_commit_as_one_transaction(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "trajectories.db")
    ids = _open_rollouts(store, 40)

    async def one_by_one() -> None:
        for rid in ids[:8]:
            await store.aadd_turn(_turn(rid, 0))

    async def together() -> None:
        await asyncio.gather(*(store.aadd_turn(_turn(rid, 0)) for rid in ids[8:]))

    before = _wal_frames(store)
    asyncio.run(one_by_one())
    apart = _wal_frames(store) - before
    asyncio.run(together())
    batched = _wal_frames(store) - before - apart
    assert apart >= 8  # one commit each
    assert batched < 8, (apart, batched)  # 32 turns, one commit
    assert all(store.count_turns(rid) == 1 for rid in ids)
    store.close()


def test_an_async_write_after_close_is_refused(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "trajectories.db")
    (rid,) = _open_rollouts(store, 1)
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        asyncio.run(store.aadd_turn(_turn(rid, 0)))


def test_chat_paths_are_recognized_exactly() -> None:
    assert chat_path_rollout("/v1/chat/completions") == ""
    assert chat_path_rollout("/rollouts/r-1a/v1/chat/completions") == "r-1a"
    assert chat_path_rollout("/rollouts//v1/chat/completions") is None
    assert chat_path_rollout("/rollouts/a/b/v1/chat/completions") is None
    assert chat_path_rollout("/rollouts/r-1a/v1/models") is None


def test_the_routes_remembered_options_equal_each_requests_own(tmp_path: Path, tiny_tok: Any) -> None:
    """The chat route keeps one ChatOptions per (model, token ids) for calls without a tool choice or template
    variables; every request still gets exactly the options its own body gives, asked twice (the second remembered)."""
    coordinator = Coordinator(ScriptedEngine(tiny_tok, ["ok"]), SQLiteStore(tmp_path / "trajectories.db"))
    protocol = ChatProtocol(coordinator)
    user = [{"role": "user", "content": "hi"}]
    variants: list[dict[str, Any]] = [
        {}, {"model": "policy"}, {"model": "judge"}, {"tool_choice": "auto"}, {"tool_choice": "none"},
        {"tool_choice": "required"}, {"tool_choice": {"type": "function", "function": {"name": "lookup"}}},
        {"logprobs": True}, {"return_token_ids": True}, {"model": "judge", "logprobs": True},
        {"chat_template_kwargs": {"enable_thinking": False}}, {"model": "policy", "tool_choice": "required"},
    ]
    seen = set()
    for _ in range(2):
        for extra in variants:
            body = ChatCompletionRequest.model_validate({"messages": user, "tools": TOOLS, **extra})
            options = protocol.options(body)
            assert options == body.options(), extra
            seen.add((options.model, options.token_ids, options.tool_choice, options.tool_name))
    assert ("judge", True, "auto", None) in seen and ("policy", False, "required", None) in seen
    assert (None, False, "function", "lookup") in seen and ("policy", False, "auto", None) in seen
    for i in range(100):  # many model names: the remembered ones stay bounded, the answers right
        body = ChatCompletionRequest.model_validate({"messages": user, "model": f"m{i}"})
        assert protocol.options(body).model == f"m{i}"
    assert len(protocol._plain_options) <= 64


def test_every_concurrent_answer_is_durable_when_it_arrives(served: Any, tiny_tok: Any) -> None:
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: f"answer {request.rollout_id}"))
    rollouts = [handle.coordinator.create_rollout(Task(id="t", prompt="q")) for _ in range(32)]

    async def call(client: httpx.AsyncClient, rollout: Any) -> tuple[str, int]:
        r = await client.post(
            f"{handle.url}/rollouts/{rollout.rollout_id}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "go"}], "tools": TOOLS},
            headers={"authorization": f"Bearer {rollout.token}"},
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"], handle.store.count_turns(rollout.rollout_id)

    async def main() -> list[tuple[str, int]]:
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(call(client, r) for r in rollouts))

    answers = asyncio.run(main())
    assert [a for a, _ in answers] == [f"answer {r.rollout_id}" for r in rollouts]
    assert all(stored == 1 for _, stored in answers)  # the turn was committed before its answer was sent
    assert [t.completion_text for r in rollouts for t in handle.store.get_rollout(r.rollout_id).turns] == [a for a, _ in answers]


def test_a_streamed_completion_carries_every_event_in_order(served: Any, tiny_tok: Any) -> None:
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: ScriptedReply.tool_call("lookup", {"k": 1}, text="On it. ")))
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    r = httpx.post(
        f"{handle.url}/rollouts/{rollout.rollout_id}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "go"}], "tools": TOOLS, "stream": True,
              "stream_options": {"include_usage": True}, "return_token_ids": True},
        headers={"authorization": f"Bearer {rollout.token}"},
    )
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[1]["choices"][0]["delta"]["content"] == "On it."  # the text before the call, stripped
    call = chunks[2]["choices"][0]["delta"]["tool_calls"][0]
    assert call["function"]["name"] == "lookup" and json.loads(call["function"]["arguments"]) == {"k": 1}
    turn = handle.store.get_rollout(rollout.rollout_id).turns[0]
    assert chunks[3]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[3]["choices"][0]["token_ids"] == list(turn.completion_ids)
    assert chunks[4]["usage"]["completion_tokens"] == len(turn.completion_ids)
    assert chunks[4]["prompt_token_ids"] == list(turn.prompt_ids)
    assert len({c["id"] for c in chunks}) == 1


def test_the_chat_route_answers_other_methods_in_openai_shape(served: Any, tiny_tok: Any) -> None:
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "ok"))
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    r = httpx.get(f"{handle.url}/rollouts/{rollout.rollout_id}/v1/chat/completions")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert "POST" in r.json()["error"]["message"]
    assert handle.store.count_turns(rollout.rollout_id) == 0


def test_the_published_schema_documents_both_chat_paths(served: Any, tiny_tok: Any) -> None:
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "ok"))
    paths = httpx.get(f"{handle.url}/openapi.json").json()["paths"]
    for path in ("/v1/chat/completions", "/rollouts/{rollout_id}/v1/chat/completions"):
        operation = paths[path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert "messages" in body["properties"] and "messages" in body["required"]
        assert {"200", "4XX", "502"} <= set(operation["responses"])
    assert paths["/rollouts/{rollout_id}/v1/chat/completions"]["post"]["parameters"][0]["name"] == "rollout_id"


def test_the_startup_heap_is_frozen_while_serving_and_released_after(tmp_path: Path, tiny_tok: Any) -> None:
    store = SQLiteStore(tmp_path / "trajectories.db")
    handle = start_server(create_app(Coordinator(ScriptedEngine(tiny_tok, ["ok"]), store)))
    try:
        assert gc.get_freeze_count() > 10_000  # the modules and objects loaded before the server started
    finally:
        handle.stop()
        store.close()
    assert gc.get_freeze_count() == 0
