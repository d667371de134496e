"""OpenAI Agents SDK (``openai-agents``): record every tool call of a rollout.

The agent's model needs no change: the SDK's default ``OpenAIResponsesModel``
(and ``OpenAIChatCompletionsModel``) talk through an ``openai.AsyncOpenAI``
client, which the ``rollout`` decorator redirects to the coordinator's
``/rollouts/{id}/v1/responses`` (any placeholder ``api_key`` will do; it never
leaves the process). Tool calls are recorded by passing :class:`MtrlRunHooks`
to the run::

    result = await Runner.run(agent, task.prompt, hooks=MtrlRunHooks())

Each function tool call is recorded with its arguments, the text the model
got back (``result``), its latency and its call id. A tool that raises is, by
the SDK's default ``failure_error_function``, turned into an error text the
model sees: that text is the recorded result (the SDK hands hooks no error
flag). The SDK's tracing exports to OpenAI with the user's key unless it is
disabled (``RunConfig(tracing_disabled=True)``); that is the SDK's own
traffic, not a model call, and mtrl does not redirect it.

Importing this module imports ``agents``.
"""

from __future__ import annotations

import json
import time
from typing import Any

from agents import RunHooks

from ._reward import record_tool_call


class MtrlRunHooks(RunHooks):
    """Records each tool call (name, arguments, result, latency, call id) on the current rollout."""

    def __init__(self) -> None:
        self._started: dict[str, float] = {}

    async def on_tool_start(self, context: Any, agent: Any, tool: Any) -> None:
        self._started[_call_id(context, tool)] = time.monotonic()

    async def on_tool_end(self, context: Any, agent: Any, tool: Any, result: Any) -> None:
        call_id = _call_id(context, tool)
        started = self._started.pop(call_id, None)
        latency = time.monotonic() - started if started is not None else 0.0
        raw = getattr(context, "tool_arguments", None)
        try:
            arguments = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            arguments = raw
        record_tool_call(getattr(tool, "name", str(tool)), arguments, result=result, latency_s=latency,
                         call_id=getattr(context, "tool_call_id", None))


def _call_id(context: Any, tool: Any) -> str:
    return str(getattr(context, "tool_call_id", None) or id(tool))


__all__ = ["MtrlRunHooks"]
