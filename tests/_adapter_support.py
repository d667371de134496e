"""Coordinator side of the adapter tests: the scripted policy, the task set, the checks.

Every task asks for one key (``K00`` .. ``K15``). The scripted policy reads
the key from the rollout's own prompt, calls ``lookup(key)``, then
``add(value, 5)`` with the value the tool returned (read back from the
prompt), then answers. So each recorded turn and tool call carries its
rollout's key: a call attributed to the wrong rollout shows up as a key
that does not match. ``K03`` makes ``lookup`` raise (a tool error the model
must see); ``K05`` makes the agent itself raise at the end of its episode.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _adapter_tools import (  # noqa: F401  (re-exported for the tests)
    CRASH_KEY,
    ERROR_KEY,
    OFFSET,
    TOOLS,
    add,
    afinish_episode,
    aopenai_tool_loop,
    finish_episode,
    key_of,
    lookup,
    openai_tool_loop,
    per_turn_rewards,
    value_of,
)
from _server_process import ServerProcess, server_process
from mtrl_runtime.engines import ScriptedReply
from mtrl_runtime.types import RolloutSpec, RolloutStatus, SamplingParams, Task

_RESPONSE = re.compile(r"<tool_response>\s*(.*?)\s*</tool_response>", re.S)


def policy(request: Any, prompt: str) -> ScriptedReply | str:
    """The scripted policy (see the module docstring); ``prompt`` is the rendered prompt text."""
    key = key_of(prompt)
    if request.turn_index == 0:
        return ScriptedReply.tool_call("lookup", {"key": key})
    responses = _RESPONSE.findall(prompt)
    last = _number(responses[-1]) if responses else None
    if request.turn_index == 1:
        if last is None:
            return f"The lookup of {key} failed. DONE"
        return ScriptedReply.tool_call("add", {"a": last, "b": OFFSET})
    return f"The answer for {key} is {last}. DONE"


def calling_first(name: str) -> Any:
    """A scripted policy that calls tool ``name`` (one the agent does not have, or may not run), then ``lookup``
    with the rollout's key, then answers: three turns."""

    def reply(request: Any, prompt: str) -> ScriptedReply | str:
        key = key_of(prompt)
        if request.turn_index == 0:
            return ScriptedReply.tool_call(name, {"key": key})
        if request.turn_index == 1:
            return ScriptedReply.tool_call("lookup", {"key": key})
        return f"The value of {key} is known. DONE"

    return reply


def _number(text: str) -> int | None:
    try:
        value = json.loads(text)
    except ValueError:
        return int(text) if text.strip().isdigit() else None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, list) and value and isinstance(value[0], dict):  # OpenAI content parts
        return _number(str(value[0].get("text", "")))
    return None


def tasks(n: int = 16) -> list[Task]:
    return [Task(id=f"t{i:02d}", prompt=f"What is the value of key K{i:02d} plus {OFFSET}?") for i in range(n)]


def specs(handle: Any, tasks_: list[Task], *, max_tokens: int = 256, timeout_s: float = 120.0) -> list[RolloutSpec]:
    """One rollout per task on the served coordinator, as a dispatcher would make them."""
    out = []
    for task in tasks_:
        created = handle.coordinator.create_rollout(task)
        out.append(
            RolloutSpec(
                rollout_id=created.rollout_id,
                group_id=created.group_id,
                task=task,
                token=created.token,
                endpoint=handle.url,
                model_name="policy",
                sampling=SamplingParams(max_tokens=max_tokens),
                max_turns=8,
                timeout_s=timeout_s,
            )
        )
    return out


def check_attribution(store: Any, spec: RolloutSpec, *, crash_ok: bool = True) -> Any:
    """Assert every turn and tool call of ``spec``'s rollout belongs to its own task; returns the rollout."""
    rollout = store.get_rollout(spec.rollout_id)
    key = key_of(spec.task.prompt)
    assert rollout.task_id == spec.task.id
    assert rollout.turns, f"{key}: no turns recorded"
    for turn in rollout.turns:
        user = [m for m in turn.messages if m.get("role") == "user"]
        assert user and key in str(user[0].get("content")), f"{key}: turn {turn.index} carries {user}"
        for call in turn.tool_calls:
            args = call["function"]["arguments"]
            args = json.loads(args) if isinstance(args, str) else args
            if call["function"]["name"] == "lookup":
                assert args == {"key": key}
            else:
                assert args == {"a": value_of(key), "b": OFFSET}
    if key == CRASH_KEY and crash_ok:
        assert rollout.status is RolloutStatus.FAILED
        assert "agent crashed on purpose" in rollout.error
        return rollout
    assert rollout.status is RolloutStatus.COMPLETED, (key, rollout.status, rollout.error)
    calls = {c.name: c for c in rollout.tool_calls}
    assert calls["lookup"].arguments == {"key": key} and calls["lookup"].turn_index == 0
    assert calls["lookup"].call_id == rollout.turns[0].tool_calls[0]["id"]
    if key == ERROR_KEY:
        assert len(rollout.tool_calls) == 1
        assert calls["lookup"].status == "error" and "unknown key K03" in calls["lookup"].error
        last_prompt = " ".join(str(m.get("content")) for m in rollout.turns[-1].messages)
        assert "unknown key K03" in last_prompt  # the model saw the tool's error
    else:
        assert len(rollout.tool_calls) == 2
        assert str(calls["lookup"].result) == str(value_of(key)) and calls["lookup"].status == "success"
        assert calls["add"].arguments == {"a": value_of(key), "b": OFFSET} and calls["add"].turn_index == 1
        assert str(calls["add"].result) == str(value_of(key) + OFFSET)
        assert f"is {value_of(key) + OFFSET}" in rollout.turns[-1].completion_text
    assert rollout.turn_rewards == tuple(per_turn_rewards(len(rollout.turns)))
    assert all(c.latency_s >= 0 for c in rollout.tool_calls)
    assert "tool_calls_unrecorded" not in rollout.metrics, rollout.metrics  # every call the agent ran was reported
    return rollout


def refuse_network(monkeypatch: Any) -> list[str]:
    """Refuse (and list) every name lookup but loopback, so a call slipping past mtrl fails instead of passing."""
    contacted: list[str] = []
    real = socket.getaddrinfo

    def guarded(host: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name not in ("127.0.0.1", "localhost", "::1"):
            contacted.append(name)
            raise OSError(f"test guard: no network, refused a lookup of {name}")
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", guarded)
    return contacted


AGENTS = Path(__file__).resolve().parent / "_adapter_agents.py"
# mtrl's agent server prints "URL <url> LIGHT <bool>" itself; an app.run(port=0) has uvicorn log its address
AGENT_URL = re.compile(r"(?:^URL |Uvicorn running on )(?P<url>http://\S+)(?: LIGHT (?P<light>True|False)$)?")


@contextmanager
def agent_process(*args: str, health: str, env: dict[str, str] | None = None,
                  timeout: float = 90.0) -> Iterator[tuple[ServerProcess, str, re.Match[str]]]:
    """``tests/_adapter_agents.py ARGS`` on a port of its own; yields it, its URL and the line that named it.

    The process is stopped on the way out."""
    command = [sys.executable, str(AGENTS), *args]
    with server_process(command, url_line=AGENT_URL, health=health, timeout=timeout,
                        env={**os.environ, **(env or {})}) as (server, url):
        yield server, url, server.wait_for(AGENT_URL, 0)


async def run_all(executor: Any, runs: list[RolloutSpec]) -> list:
    """Run every spec on ``executor`` at once; close the executor."""
    try:
        return await asyncio.gather(*(executor.run(spec) for spec in runs))
    finally:
        await executor.close()
