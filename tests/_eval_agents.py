"""Agents and environments for the evaluator and check tests: a plain OpenAI-client tool loop.

``make_agent(score, tools)`` builds a ``@rollout`` agent that chats with the
policy (the scripted engine in these tests) until a reply has no tool call,
runs the tools it asks for, and reports ``score(final_text, task)``. The
tools here cover what the checks must tell apart:

- ``lookup`` and ``add``: pure functions (deterministic, no state);
- ``ticket``: a counter shared by every episode (nondeterministic: the
  second run of an episode sees another number);
- ``note`` / ``recall`` on a module-level dict (``LEAKY``): state shared
  across concurrent episodes; ``safe_note`` / ``safe_recall``: the same,
  kept per rollout.

``agent`` (module level) is the CLI tests' agent: it answers for the
``ANSWER <n>`` protocol and rewards ``ANSWER 42``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any, Callable

LEAKY: dict[str, str] = {}
_SAFE: dict[str, dict[str, str]] = {}
_TICKETS = itertools.count(1)


def _rollout_id() -> str:
    from mtrl_adapters import current_rollout

    ctx = current_rollout()
    return ctx.rollout_id if ctx is not None else "none"


def _safe_state() -> dict[str, str]:
    return _SAFE.setdefault(_rollout_id(), {})


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "lookup": lambda key: {"A1": 42}.get(key, 0),
    "add": lambda a, b: a + b,
    "ticket": lambda: next(_TICKETS),
    "note": lambda text: LEAKY.__setitem__("note", text) or "saved",
    "recall": lambda: LEAKY.get("note", ""),
    "safe_note": lambda text: _safe_state().__setitem__("note", text) or "saved",
    "safe_recall": lambda: _safe_state().get("note", ""),
}
_PARAMS = {
    "lookup": {"key": {"type": "string"}},
    "add": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "ticket": {},
    "note": {"text": {"type": "string"}},
    "recall": {},
    "safe_note": {"text": {"type": "string"}},
    "safe_recall": {},
}


def tool_specs(names: list[str]) -> list[dict[str, Any]]:
    return [
        {"type": "function", "function": {
            "name": n, "description": f"The {n} tool.",
            "parameters": {"type": "object", "properties": _PARAMS[n], "required": sorted(_PARAMS[n])},
        }}
        for n in names
    ]


_CLIENTS: dict[int, Any] = {}  # one client per event loop


def _client() -> Any:
    import openai

    loop = asyncio.get_running_loop()
    if id(loop) not in _CLIENTS:
        _CLIENTS[id(loop)] = openai.AsyncOpenAI(base_url="http://agent.invalid/v1", api_key="unused", max_retries=0)
    return _CLIENTS[id(loop)]


async def chat_loop(task: Any, tools: list[dict[str, Any]]) -> str:
    """Chat until a reply has no tool call; the final text ("" when max_turns cut the episode)."""
    import openai

    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    try:
        while True:
            kwargs = {"tools": tools} if tools else {}
            reply = await _client().chat.completions.create(model="policy", messages=messages, **kwargs)
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                return message.content or ""
            for call in message.tool_calls:
                result = FUNCTIONS[call.function.name](**json.loads(call.function.arguments or "{}"))
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})
    except openai.ConflictError:  # the coordinator refused a turn past max_turns
        return ""


Score = Callable[[str, Any], "tuple[float, dict[str, float]] | float"]


def make_agent(score: Score, tools: list[str] = ("lookup", "add")) -> Any:  # type: ignore[assignment]
    from mtrl_adapters import aupdate_reward, rollout

    specs = tool_specs(list(tools))

    @rollout
    async def agent(task: Any) -> None:
        text = await chat_loop(task, specs)
        scored = score(text, task)
        reward, metrics = scored if isinstance(scored, tuple) else (scored, {})
        await aupdate_reward(float(reward), metrics)

    return agent


def answer_score(text: str, task: Any) -> tuple[float, dict[str, float]]:
    """1 for ``ANSWER 42``; the metric ``answered``: the reply used the answer format."""
    return float("ANSWER 42" in text), {"answered": float(text.startswith("ANSWER"))}


def strict_answer(text: str, ground_truth: Any) -> float:
    """The CLI tests' strict scorer: exactly ``ANSWER 42``."""
    return float(text.strip() == "ANSWER 42")


agent = make_agent(answer_score)
