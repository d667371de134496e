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
flag). An MCP server's ``isError`` result, which the SDK also hands hooks as
text alone, is recorded ``error``: :func:`instrument_openai_agents_mcp` reads
the flag where the SDK calls the server. Each call is sent to the coordinator as
it ends (``RolloutContext.send_tool_calls``, in the background, never blocking
the run's loop), so a rollout cancelled, timed out or interrupted mid-way
keeps every call it completed. The SDK's tracing exports to OpenAI with the user's key unless it is
disabled (``RunConfig(tracing_disabled=True)``); that is the SDK's own
traffic, not a model call, and mtrl does not redirect it.

Importing this module imports ``agents``.
"""

from __future__ import annotations

import functools
import functools
import json
import time
from typing import Any, Callable

from agents import FunctionTool, RunHooks
from agents.mcp.util import MCPUtil
from agents.tool import ToolOriginType, get_function_tool_origin
from agents.tool_context import ToolContext

from ._context import current_rollout
from ._patches import PATCHES, Patch
from ._reward import record_tool_call
from .mcp import mcp_source, observed_results

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
        text = _text(result)
        ctx = current_rollout()
        failed = ctx is not None and ctx.take_tool_failed(getattr(context, "tool_call_id", None))
        record_tool_call(getattr(tool, "name", str(tool)), arguments, result=text, latency_s=latency,
                         call_id=getattr(context, "tool_call_id", None), source=_source(tool),
                         error=(text if isinstance(text, str) else json.dumps(text, default=str)) if failed else None)


def instrument_openai_agents_mcp() -> bool:
    """Tell :class:`MtrlRunHooks` which MCP tool calls failed; True if installed now.

    The SDK turns an MCP server's ``isError`` result into the text the model reads and hands its hooks that
    text alone. ``MCPUtil.invoke_mcp_tool`` (which the SDK binds into each MCP FunctionTool when it lists the
    agent's tools, at every run) is wrapped to watch the ``CallToolResult`` of its call
    (:func:`mtrl_adapters.mcp.observed_results`) and note an ``isError`` one on the rollout by the model's call
    id: the ``observe`` layer (``_patches``) on that classmethod. Called by the ``rollout`` decorator when the
    SDK's MCP support is loaded; the original is kept as ``__mtrl_original__``.
    """
    return PATCHES.install(MCP_ERRORS)


def uninstall_openai_agents_mcp() -> bool:
    """Put the SDK's own ``invoke_mcp_tool`` back (for tests); True if the wrapper was installed."""
    return PATCHES.uninstall(MCP_ERRORS)


def _watching(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def invoke_mcp_tool(cls: Any, server: Any, tool: Any, context: Any, *args: Any, **kwargs: Any) -> Any:
        with observed_results() as seen:
            output = await original(cls, server, tool, context, *args, **kwargs)
        ctx = current_rollout()
        if ctx is not None and isinstance(context, ToolContext) and any(result.isError for result in seen):
            ctx.note_tool_failed(context.tool_call_id)
        return output

    return invoke_mcp_tool


MCP_ERRORS = Patch(MCPUtil, "invoke_mcp_tool", "observe", _watching)  # a classmethod: put back as one


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


__all__ = ["MtrlRunHooks", "instrument_openai_agents_mcp", "uninstall_openai_agents_mcp"]
