"""The SQL agent: a plain ``openai`` client and a hand-written tool loop, trainable with mtrl.

Each episode opens its own in-memory copy of the company database
(``SqliteEnv.open()``), so concurrent episodes never see each other's
connections, and the copy is closed when the episode ends. The model asks
``query_database`` for rows until it replies with its final query in
``<final_output>`` tags; the reward runs that query on a fresh copy and
compares result sets with the gold query's.

Train it::

    mtrl train examples/sql_agent/config.yaml --agent examples.sql_agent.agent:run

While training, ``@rollout`` points the ``AsyncOpenAI`` client at the
policy being trained (the client's own ``base_url`` and key are not used);
because this agent runs its own tool loop, it reports each tool call with
``record_tool_call``. Outside training the same ``run`` talks to
``base_url`` (by default a local ``mtrl serve``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import openai

from mtrl_adapters import current_rollout, record_tool_call, rollout, update_reward
from mtrl_runtime.envs import SqliteDatabase, to_json

from .database import company_env
from .prompts import build_messages
from .reward import reward
from .tools import call_tool, parse_arguments, tool_spec

DEFAULT_BASE_URL = "http://127.0.0.1:8731/v1"  # `mtrl serve` (used only outside training)
DEFAULT_MAX_TURNS = 6
MODEL = "policy"


def make_client() -> openai.AsyncOpenAI:
    """The agent's model client (one per episode: an async client belongs to the loop it first ran on).

    Inside a rollout a call may take as long as the rollout has (``advanced.rollout_timeout_s``, the rollout's
    ``timeout_s``): a slow CPU serving many rollouts can take minutes a turn, and a client that gave up sooner
    would fail an episode the run still had time for. Outside one, openai's own default.
    """
    ctx = current_rollout()
    timeout = ctx.timeout_s if ctx is not None and ctx.timeout_s else openai.DEFAULT_TIMEOUT
    return openai.AsyncOpenAI(base_url=DEFAULT_BASE_URL, api_key="unused-while-training", max_retries=0,
                              timeout=timeout)


def _max_turns() -> int:
    ctx = current_rollout()
    return ctx.max_turns if ctx is not None and ctx.max_turns else DEFAULT_MAX_TURNS


def _assistant_message(message: Any) -> dict[str, Any]:
    """The reply as the next request must send it back (so the endpoint extends the same sequence)."""
    out: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
    if message.tool_calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.function.name, "arguments": c.function.arguments}}
                             for c in message.tool_calls]
    return out


async def _run_tool(db: SqliteDatabase, call: Any) -> str:
    """Run one tool call (off the event loop: a query may take up to its timeout) and record it."""
    result = await asyncio.to_thread(call_tool, db, call.function.name, call.function.arguments)
    parsed = parse_arguments(call.function.arguments)
    record_tool_call(call.function.name, call.function.arguments if isinstance(parsed, str) else parsed,
                     result=result, error=result.get("error"), call_id=call.id)
    return to_json(result)


async def answer_question(client: openai.AsyncOpenAI, db: SqliteDatabase, task: Any, max_turns: int,
                          with_examples: bool = True) -> str:
    """The tool loop: the final reply's text, or "" when ``max_turns`` model calls end without one."""
    messages = build_messages(task, with_examples)
    tools = [tool_spec(db)]
    for _ in range(max_turns):
        response = await client.chat.completions.create(model=MODEL, messages=messages, tools=tools)
        message = response.choices[0].message
        messages.append(_assistant_message(message))
        if not message.tool_calls:
            return message.content or ""
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": await _run_tool(db, call)})
    return ""


def make_agent(client_factory: Callable[[], openai.AsyncOpenAI] = make_client, *,
               with_examples: bool = True) -> Callable[..., Any]:
    """A ``@rollout`` entrypoint using ``client_factory()`` for its model calls."""

    @rollout
    async def run(task: Any) -> str:
        with company_env().open() as db:  # this episode's own database, closed however the episode ends
            async with client_factory() as client:
                text = await answer_question(client, db, task, _max_turns(), with_examples)
        if task.ground_truth is not None:  # training and evaluation; production questions have none
            score, metrics = reward(text, task.ground_truth)
            update_reward(score, metrics)
        return text

    return run


run = make_agent()
"""The entrypoint ``mtrl train --agent examples.sql_agent.agent:run`` trains."""

__all__ = ["DEFAULT_BASE_URL", "MODEL", "answer_question", "make_agent", "make_client", "run"]
