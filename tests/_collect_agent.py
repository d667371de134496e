"""The agent ``mtrl collect`` and the MLflow-view tests run: an OpenAI-client tool loop that records its tool calls.

Tools ``lookup(key)`` and ``add(a, b)``; each call is reported with
``record_tool_call`` (what the Strands hooks and LangGraph callbacks do for
those frameworks). Reward 1 for a final reply ``ANSWER 42``.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from _eval_agents import FUNCTIONS, tool_specs

_CLIENTS: dict[int, Any] = {}


def _client() -> Any:
    import openai

    loop = asyncio.get_running_loop()
    if id(loop) not in _CLIENTS:
        _CLIENTS[id(loop)] = openai.AsyncOpenAI(base_url="http://agent.invalid/v1", api_key="unused", max_retries=0)
    return _CLIENTS[id(loop)]


def _make() -> Any:
    from mtrl_adapters import aupdate_reward, record_tool_call, rollout

    specs = tool_specs(["lookup", "add"])

    @rollout
    async def agent(task: Any) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
        while True:
            reply = await _client().chat.completions.create(model="policy", messages=messages, tools=specs)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                arguments = json.loads(call.function.arguments or "{}")
                result = str(FUNCTIONS[call.function.name](**arguments))
                record_tool_call(call.function.name, arguments, result=result, call_id=call.id)
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
        await aupdate_reward(float("ANSWER 42" in (message.content or "")))

    return agent


agent = _make()
