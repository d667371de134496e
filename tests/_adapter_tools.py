"""The agent side of the adapter tests: two tools, plain OpenAI tool loops, the episode's end.

Light on purpose (no torch, no coordinator): agent processes started by the
remote tests import only this and ``mtrl_adapters``. Every task asks for
one key (``K00`` .. ``K15``); ``K03`` makes ``lookup`` raise (a tool error the
model must see); ``K05`` makes the agent itself raise at the end.
"""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

ERROR_KEY = "K03"  # lookup raises for this key
CRASH_KEY = "K05"  # the agent raises for this key
OFFSET = 5

_KEY = re.compile(r"key (K\d+)")


def key_of(text: str) -> str:
    return _KEY.search(text).group(1)


def value_of(key: str) -> int:
    return int(key[1:]) * 10


def per_turn_rewards(turns: int) -> list[float]:
    return [0.0] * (turns - 1) + [1.0]


def lookup(key: str) -> int:
    """Look a key up in the table."""
    if key == ERROR_KEY:
        raise KeyError(f"unknown key {key}")
    return value_of(key)


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a key up in the table.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    },
]
FUNCTIONS = {"lookup": lookup, "add": add}


def run_tool(call: Any, functions: dict[str, Any] = FUNCTIONS) -> tuple[dict[str, Any], str, str | None]:
    """Run one OpenAI tool call; returns (arguments, content for the model, error or None)."""
    args = json.loads(call.function.arguments)
    try:
        return args, str(functions[call.function.name](**args)), None
    except Exception as exc:
        return args, f"Error: {type(exc).__name__}: {exc}", f"{type(exc).__name__}: {exc}"


def openai_tool_loop(client: Any, task: Any) -> int:
    """A plain OpenAI-client agent with its own tool loop; records tool calls; returns its turn count."""
    from mtrl_adapters import record_tool_call

    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    turns = 0
    while True:
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)
        turns += 1
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return turns
        for call in message.tool_calls:
            args, content, error = run_tool(call)
            record_tool_call(call.function.name, args, result=None if error else content, error=error, call_id=call.id)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})


async def aopenai_tool_loop(client: Any, task: Any, tools: list[dict[str, Any]] = TOOLS,
                            functions: dict[str, Any] = FUNCTIONS) -> int:
    """:func:`openai_tool_loop` with an async client, each tool run on a worker thread (the loop stays free);
    ``tools``/``functions``: the declared tools and what runs each."""
    from mtrl_adapters import record_tool_call

    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    turns = 0
    while True:
        reply = await client.chat.completions.create(model="policy", messages=messages, tools=tools)
        turns += 1
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return turns
        for call in message.tool_calls:
            args, content, error = await asyncio.to_thread(run_tool, call, functions)
            record_tool_call(call.function.name, args, result=None if error else content, error=error, call_id=call.id)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": content})


def finish_episode(task: Any, turns: int) -> None:
    """The end of every test agent: crash on CRASH_KEY, else per-turn rewards."""
    from mtrl_adapters import update_reward

    if key_of(task.prompt) == CRASH_KEY:
        raise RuntimeError("agent crashed on purpose")
    update_reward(per_turn_rewards(turns), {"turns": float(turns)})


async def afinish_episode(task: Any, turns: int) -> None:
    from mtrl_adapters import aupdate_reward

    if key_of(task.prompt) == CRASH_KEY:
        raise RuntimeError("agent crashed on purpose")
    await aupdate_reward(per_turn_rewards(turns), {"turns": float(turns)})
