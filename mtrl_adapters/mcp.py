"""MCP tools: which server served a recorded tool call.

A tool an MCP server serves reaches the agent through its framework's MCP
client (Strands' ``MCPClient``, ``langchain-mcp-adapters``, the OpenAI
Agents SDK's ``MCPServerStdio`` / ``MCPServerStreamableHttp``) and runs
through that framework's tool loop, so the framework's adapter records it
like any tool (:mod:`mtrl_adapters.strands`, :mod:`mtrl_adapters.langgraph`,
:mod:`mtrl_adapters.openai_agents`). What this module adds is the record's
``source``: ``"mcp:<server>"``, the server's name as the framework knows it,
or ``"mcp"`` when no name can be found (with a warning naming the fix).

The name each framework gives:

- ``langchain-mcp-adapters``: the key of the server in
  ``MultiServerMCPClient({...})``, or ``load_mcp_tools(session, server_name=...)``.
- OpenAI Agents SDK: the server's ``name`` (``MCPServerStdio(name=...)``).
- Strands: ``MCPClient`` has no name of its own, so the name the server
  declares in the MCP handshake (``FastMCP("notes")``: ``notes``). The
  handshake's answer is not kept by the ``mcp`` SDK, so
  :func:`instrument_mcp` (the ``rollout`` decorator calls it when ``mcp`` is
  loaded) wraps ``ClientSession.initialize`` to note it on the session. A
  client connected before the first rollout opened was not seen: its calls
  are recorded ``"mcp"``, and a warning says to connect it inside the
  rollout or to call ``mtrl_adapters.instrument()`` first. Checked on the
  ``mcp`` 1.x line (1.30; langchain-mcp-adapters caps ``mcp<2``); a 2.x
  client that negotiates without ``initialize`` is not seen either, and
  says so the same way.

A second wrapper, of ``call_tool``, keeps each ``CallToolResult`` for
code that asks for them (:func:`observed_results`): the OpenAI Agents SDK
hands its hooks the text of an MCP result but not its ``isError`` flag, and
:mod:`mtrl_adapters.openai_agents` reads the flag there.

Importing this module imports nothing of ``mcp``: the session class is
handed in by the caller, who found it loaded.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Callable

from ._patches import PATCHES, Patch

MCP = "mcp"
_DECLARED = "__mtrl_mcp_server__"  # on an initialized ClientSession: the name its server declared
# the CallToolResults of the calls made below an ``observed_results()`` block (None: nobody asks). Set per block to
# a list of its own, which tasks started inside it share (a task copies the context, not the list)
_RESULTS: ContextVar[list[Any] | None] = ContextVar("mtrl_mcp_call_results", default=None)


def mcp_source(server: str | None) -> str:
    """A tool call's ``source`` for a tool served by MCP server ``server`` (None: a server with no known name)."""
    return f"{MCP}:{server}" if server else MCP


def declared_server_name(session: Any) -> str | None:
    """The name an initialized ``ClientSession``'s server declared in its handshake; None if not seen."""
    return getattr(session, _DECLARED, None) if session is not None else None


def warn_unnamed(framework: str, fix: str) -> None:
    """Say once per call site that an MCP tool's server has no known name (its calls are recorded ``"mcp"``)."""
    warnings.warn(f"{framework}: a tool call served by an MCP server whose name mtrl cannot tell is recorded "
                  f"with source 'mcp'; {fix}", RuntimeWarning, stacklevel=3)


@contextlib.contextmanager
def observed_results() -> Iterator[list[Any]]:
    """Collect the ``CallToolResult`` of every MCP ``call_tool`` made inside the block (and in tasks it starts),
    once :func:`instrument_mcp` is installed."""
    seen: list[Any] = []
    token = _RESULTS.set(seen)
    try:
        yield seen
    finally:
        _RESULTS.reset(token)


async def _noting_initialize(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    result = await original(self, *args, **kwargs)
    if result.serverInfo.name:  # InitializeResult.serverInfo: the server's Implementation
        setattr(self, _DECLARED, result.serverInfo.name)
    return result


async def _observed_call_tool(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
    result = await original(self, *args, **kwargs)
    seen = _RESULTS.get()
    if seen is not None:
        seen.append(result)
    return result


_WRAPPERS = {"initialize": _noting_initialize, "call_tool": _observed_call_tool}  # ClientSession method -> wrapper


def instrument_mcp(session_class: type) -> bool:
    """Wrap ``session_class``'s ``initialize`` (to note the server's declared name on each session) and
    ``call_tool`` (for :func:`observed_results`): the ``mcp`` SDK's ``ClientSession``, each the ``observe``
    layer (``_patches``). True if installed now; each original is kept as ``__mtrl_original__``."""
    return PATCHES.install_all(_patches(session_class))


def uninstall_mcp(session_class: type) -> bool:
    """Put the SDK's own methods back (for tests); True if the wrappers were installed."""
    return any([PATCHES.uninstall(patch) for patch in _patches(session_class)])


def _patches(session_class: type) -> tuple[Patch, ...]:
    return tuple(Patch(session_class, name, "observe", _LAYERS[name]) for name in _WRAPPERS)


def _layer(wrapper: Callable[..., Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        async def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return await wrapper(original, self, *args, **kwargs)

        return method

    return wrap


_LAYERS = {name: _layer(wrapper) for name, wrapper in _WRAPPERS.items()}  # one factory per method: equal patches


__all__ = ["MCP", "declared_server_name", "instrument_mcp", "mcp_source", "observed_results", "uninstall_mcp",
           "warn_unnamed"]
