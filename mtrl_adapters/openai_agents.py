"""OpenAI Agents SDK (``openai-agents``): record every tool call of a rollout.

The agent's model needs no change: the SDK's default ``OpenAIResponsesModel``
(and ``OpenAIChatCompletionsModel``) talk through an ``openai.AsyncOpenAI``
client, which the ``rollout`` decorator redirects to the coordinator's
``/rollouts/{id}/v1/responses`` (any placeholder ``api_key`` will do; it never
leaves the process). Tool calls are recorded by passing :class:`MtrlRunHooks`
to the run::

    result = await Runner.run(agent, task.prompt, hooks=MtrlRunHooks())

Each function tool call is recorded with its arguments, the text the model
got back (``result``), its latency, its call id, and for a tool of an MCP
server (``Agent(mcp_servers=[...])``) its ``source``, ``"mcp:<server name>"``.
A tool that raises is, by
the SDK's default ``failure_error_function``, turned into an error text the
model sees: that text is the recorded result (the SDK hands hooks no error
flag; an MCP server's ``isError`` result is recorded ``success`` too, with a
warning). The SDK's tracing exports to OpenAI with the user's key unless it is
disabled (``RunConfig(tracing_disabled=True)``); that is the SDK's own
traffic, not a model call, and mtrl does not redirect it.

Importing this module imports ``agents``.
"""

from __future__ import annotations

import json
import time
import warnings
from typing import Any

from agents import FunctionTool, RunHooks
from agents.tool import ToolOriginType, get_function_tool_origin

from ._reward import record_tool_call
from .mcp import mcp_source


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
        source = _source(tool)
        if source is not None:
            warnings.warn("OpenAI Agents SDK: the SDK gives run hooks no MCP isError flag, so mtrl records every MCP "
                          "tool call 'success', its result the text the model read; a call that must count as "
                          "failed has to be recorded by your own code (mtrl_adapters.record_tool_call)",
                          RuntimeWarning, stacklevel=2)
        record_tool_call(getattr(tool, "name", str(tool)), arguments, result=_text(result), latency_s=latency,
                         call_id=getattr(context, "tool_call_id", None), source=source)


def _source(tool: Any) -> str | None:
    """``"mcp:<server>"`` for a tool of an MCP server (``Agent(mcp_servers=[...])``: the SDK marks each such
    FunctionTool with its origin and the server's ``name``); None for the agent's own."""
    origin = get_function_tool_origin(tool) if isinstance(tool, FunctionTool) else None
    if origin is None or origin.type is not ToolOriginType.MCP:
        return None
    return mcp_source(origin.mcp_server_name)


def _text(result: Any) -> Any:
    """An MCP tool's output as the text the model reads: the SDK hands hooks its content as text blocks
    (``{"type": "text", "text": "42"}``, or a list of them); any other output as it is."""
    blocks = result if isinstance(result, list) and result else [result]
    if all(isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in blocks):
        return "\n".join(b["text"] for b in blocks)
    return result


def _call_id(context: Any, tool: Any) -> str:
    return str(getattr(context, "tool_call_id", None) or id(tool))


__all__ = ["MtrlRunHooks"]
