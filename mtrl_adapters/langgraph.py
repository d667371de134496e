"""LangGraph / LangChain: record every tool call of a rollout, with no change to the graph.

:class:`MtrlCallbackHandler` records tool calls (name, arguments, result,
error, latency) from LangChain's ``on_tool_start`` / ``on_tool_end`` /
``on_tool_error`` callbacks. :func:`instrument_langchain` (the ``rollout``
decorator calls it when LangChain is loaded) registers it through
LangChain's configure hook, so every run of every graph gets it; the
handler looks up the current rollout at each event and does nothing
outside one. It can also be passed explicitly:
``graph.invoke(inputs, config={"callbacks": [MtrlCallbackHandler()]})`` (a call
seen by both is recorded once).

Each call is sent to the coordinator as it ends (``RolloutContext.send_tool_calls``),
not held to the rollout's end: a rollout cancelled, timed out or interrupted
mid-way keeps every call it completed, and the run's progress line counts
them as they happen. A call whose tool raised waits for the ``ToolMessage``
text the model read in its place (tool errors, below), so it is sent with
it and in the order the calls ended; at the latest it goes when the next
model call starts.

Model calls need no handler: ``ChatOpenAI`` talks through an ``openai``
client, which the ``rollout`` decorator redirects to the coordinator with
the rollout's id and token, so one compiled graph and one model object
serve any number of concurrent rollouts.

Tool errors: by default a tool's exception ends the graph run and the
rollout fails. For the model to see it as a ``ToolMessage``, as Strands
does, give ``langchain.agents.create_agent`` an async ``wrap_tool_call``
middleware that returns one (docs/quickstart.md, 3b), or give the deprecated
``create_react_agent`` a ``ToolNode(tools, handle_tool_errors=True)``.
Either way the call is recorded with its error (the exception), and its
result is the ``ToolMessage`` text the model read: ``on_tool_error`` records
the call with no result, and the first chain to end with a ``ToolMessage``
for that call id (the tools node) gives it one. A tool that catches its own
error and returns a string (``"Error: ..."``) succeeded as far as LangChain
knows, and is recorded so; one that raises ``ToolException`` under
``handle_tool_error`` returns a ``ToolMessage`` with ``status="error"``, and
is recorded failed (docs/tool-calls.md has the table).

Importing this module imports ``langchain_core``.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any, Callable
from uuid import UUID

from langchain_core.callbacks import BaseCallbackHandler, BaseCallbackManager
from langchain_core.messages import ToolMessage
from langchain_core.runnables.config import var_child_runnable_config
from langchain_core.tracers import context as _tracer_context

from ._context import current_rollout
from ._patches import PATCHES, Patch
from .mcp import mcp_source, warn_unnamed

# guards LangChain's configure-hook list: a registration through LangChain's own API, not a replaced method, so not
# a _patches layer (langchain-mcp-adapters' interceptor chain is one: MCP_SERVER_NAMES)
_INSTALL_LOCK = threading.Lock()
_ADAPTERS_UNNAMED = "unknown"  # the server name langchain-mcp-adapters gives a tool loaded without one


class MtrlCallbackHandler(BaseCallbackHandler):
    """Records tool calls on the current rollout; stateless (per-call state lives on the rollout)."""

    run_inline = True  # cheap and non-blocking: run in the caller's task, not on an executor thread
    raise_error = False

    def on_tool_start(
        self,
        serialized: dict[str, Any] | None,
        input_str: str,
        *,
        run_id: UUID,
        inputs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        ctx = current_rollout()
        if ctx is None:
            return
        name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
        arguments = inputs if inputs is not None else input_str
        ctx.tool_started(("langchain", run_id), name, arguments, kwargs.get("tool_call_id"))

    def on_tool_end(self, output: Any, *, run_id: UUID, **kwargs: Any) -> None:
        ctx = current_rollout()
        if ctx is None:
            return
        result, error = _output(output)
        if ctx.tool_finished(("langchain", run_id), result=result, error=error):
            ctx.send_tool_calls()

    def on_tool_error(self, error: BaseException, *, run_id: UUID, **kwargs: Any) -> None:
        ctx = current_rollout()
        if ctx is None:
            return
        ctx.tool_finished(("langchain", run_id), error=f"{type(error).__name__}: {error}")  # result: on_chain_end

    def on_chain_end(self, outputs: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """A failed call's result: the ToolMessage a node made of its exception, which the model reads."""
        ctx = current_rollout()
        if ctx is None:
            return
        waiting = ctx.failed_calls_without_result
        if not waiting:
            return
        filled = False
        for message in _tool_messages(outputs):
            if message.tool_call_id in waiting:
                filled = ctx.fill_tool_result(message.tool_call_id, _text(message.content)) or filled
        if filled:
            ctx.send_tool_calls()

    def on_chat_model_start(self, serialized: dict[str, Any], messages: Any, *, run_id: UUID, **kwargs: Any) -> None:
        """A model call: send any failed call still waiting for its result without one (none will come now)."""
        ctx = current_rollout()
        if ctx is not None:
            ctx.send_tool_calls(waiting_too=True)

    def on_llm_start(self, serialized: dict[str, Any], prompts: list[str], *, run_id: UUID, **kwargs: Any) -> None:
        """A completion model's call: as :meth:`on_chat_model_start`."""
        self.on_chat_model_start(serialized, prompts, run_id=run_id, **kwargs)


_HANDLER: ContextVar[MtrlCallbackHandler | None] = ContextVar(
    "mtrl_langchain_handler", default=MtrlCallbackHandler()  # stateless: safe to share
)


def instrument_langchain() -> bool:
    """Attach :class:`MtrlCallbackHandler` to every LangChain run; True if installed now."""
    with _INSTALL_LOCK:
        if any(entry[0] is _HANDLER for entry in _tracer_context._configure_hooks):
            return False
        _tracer_context.register_configure_hook(_HANDLER, inheritable=True)
        return True


def instrument_langchain_mcp() -> bool:
    """Name the MCP server of each tool call ``langchain-mcp-adapters`` makes; True if installed now.

    The adapters' tools (``MultiServerMCPClient.get_tools()``, ``load_mcp_tools``) carry their server's name only
    inside the call, where they build the interceptor chain that runs it (``MCPToolCallRequest.server_name``).
    The wrapper of that builder (``langchain_mcp_adapters.tools._build_interceptor_chain``, looked up at each
    call, so tools loaded before the rollout are covered) notes the name on the call :class:`MtrlCallbackHandler`
    opened: the tool's run, the parent of the run config current inside it: the ``observe`` layer
    (``_patches``) on that module function, the original kept as ``__mtrl_original__``. Called by the ``rollout``
    decorator when the adapters are loaded.
    """
    return PATCHES.install(MCP_SERVER_NAMES)


def uninstall_langchain_mcp() -> bool:
    """Put the adapters' own interceptor-chain builder back (for tests); True if the wrapper was installed."""
    if "langchain_mcp_adapters.tools" not in sys.modules:
        return False
    return PATCHES.uninstall(MCP_SERVER_NAMES)


def _naming(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _build_interceptor_chain(base_handler: Any, tool_interceptors: Any) -> Any:
        handler = original(base_handler, tool_interceptors)

        async def noted(request: Any) -> Any:
            _note_mcp_server(request.server_name)
            return await handler(request)

        return noted

    return _build_interceptor_chain


MCP_SERVER_NAMES = Patch("langchain_mcp_adapters.tools", "_build_interceptor_chain", "observe", _naming)


def _note_mcp_server(server: str) -> None:
    """Mark the tool call running here (its LangChain run: the parent of the current child config) as served
    by MCP server ``server``."""
    ctx = current_rollout()
    if ctx is None:
        return
    config = var_child_runnable_config.get() or {}
    callbacks = config.get("callbacks")
    if not isinstance(callbacks, BaseCallbackManager) or callbacks.parent_run_id is None:
        return  # not inside a LangChain tool run: no call of ours to mark
    if server == _ADAPTERS_UNNAMED:
        warn_unnamed("langchain-mcp-adapters", "load the tools with load_mcp_tools(session, server_name=...) or "
                     "through MultiServerMCPClient({name: ...}) to record the server's name")
        server = None
    ctx.tool_source(("langchain", callbacks.parent_run_id), mcp_source(server))


def _tool_messages(value: Any, depth: int = 3) -> Iterator[ToolMessage]:
    """The ToolMessages in a chain's output: a node's ``{"messages": [...]}``, a list of them, or one."""
    if isinstance(value, ToolMessage):
        yield value
    elif depth > 0 and isinstance(value, Mapping):
        for item in value.values():
            yield from _tool_messages(item, depth - 1)
    elif depth > 0 and isinstance(value, (list, tuple)):
        for item in value:
            yield from _tool_messages(item, depth - 1)


def _output(output: Any) -> tuple[Any, str | None]:
    """A tool's output (often a ToolMessage) as JSON-able content, and its error text if it failed."""
    content = _text(getattr(output, "content", output))
    if getattr(output, "status", None) == "error":
        return content, content if isinstance(content, str) else str(content)
    return content, None


def _text(content: Any) -> Any:
    """Content made of text blocks as the text the model reads (one block: its text; several: joined by
    newlines, as the policy endpoint joins a message's text parts); any other content as it is. MCP tools answer with blocks
    (``[{"type": "text", "text": "42", "id": "lc_..."}]``), local tools mostly with a string."""
    if not isinstance(content, list) or not content:
        return content
    texts = [b if isinstance(b, str) else b.get("text") if isinstance(b, dict) and b.get("type") == "text" else None
             for b in content]
    if any(t is None for t in texts):
        return content
    return "\n".join(texts)


__all__ = ["MtrlCallbackHandler", "instrument_langchain", "instrument_langchain_mcp", "uninstall_langchain_mcp"]
