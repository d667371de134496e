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
  rollout or to call ``mtrl_adapters.instrument()`` first.

Importing this module imports nothing of ``mcp``: the session class is
handed in by the caller, who found it loaded.
"""

from __future__ import annotations

import functools
import threading
import warnings
from typing import Any

MCP = "mcp"
_INSTALL_LOCK = threading.Lock()
_MARK = "__mtrl_mcp_handshake__"  # on the installed ClientSession.initialize wrapper
_DECLARED = "__mtrl_mcp_server__"  # on an initialized ClientSession: the name its server declared


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


def instrument_mcp(session_class: type) -> bool:
    """Wrap ``session_class.initialize`` (the ``mcp`` SDK's ``ClientSession``) to note the server's declared name
    on each session it initializes; True if installed now. The original is kept as ``__mtrl_original__``."""
    with _INSTALL_LOCK:
        original = session_class.initialize
        if getattr(original, _MARK, False):
            return False

        @functools.wraps(original)
        async def initialize(self: Any, *args: Any, **kwargs: Any) -> Any:
            result = await original(self, *args, **kwargs)
            if result.serverInfo.name:  # InitializeResult.serverInfo: the server's Implementation
                setattr(self, _DECLARED, result.serverInfo.name)
            return result

        setattr(initialize, _MARK, True)
        initialize.__mtrl_original__ = original  # type: ignore[attr-defined]
        session_class.initialize = initialize
        return True


def uninstall_mcp(session_class: type) -> bool:
    """Put the SDK's own ``initialize`` back (for tests); True if the wrapper was installed."""
    with _INSTALL_LOCK:
        wrapper = session_class.initialize
        if not getattr(wrapper, _MARK, False):
            return False
        session_class.initialize = wrapper.__mtrl_original__
        return True


__all__ = ["MCP", "declared_server_name", "instrument_mcp", "mcp_source", "uninstall_mcp", "warn_unnamed"]
