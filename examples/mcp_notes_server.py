"""A small MCP server, written the way the ``mcp`` SDK's docs write one (FastMCP), for docs/tool-calls.md.

Its tools: ``lookup(key)`` reads a note (a key it does not hold raises, which
the server answers with an ``isError`` result), ``add(a, b)`` adds two
numbers, and ``fail(reason)`` returns the protocol's error result itself.

    python examples/mcp_notes_server.py            # stdio, as an MCP client starts it
    python examples/mcp_notes_server.py --http     # streamable HTTP on 127.0.0.1, a free port

Over HTTP it listens on a port the system picks and prints one line,
``listening on http://127.0.0.1:PORT/mcp``, once it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import socket

from mcp.server.fastmcp import FastMCP
from mcp.types import CallToolResult, TextContent

NOTES = {"A1": "42", "B2": "the hangar door sticks", "C3": "7"}

mcp = FastMCP("notes")


@mcp.tool()
def lookup(key: str) -> str:
    """Read the note stored under a key."""
    return NOTES[key]  # a missing key raises KeyError: FastMCP answers with isError


@mcp.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@mcp.tool()
def fail(reason: str) -> CallToolResult:
    """Report a failure the protocol's way (an isError result, nothing raised)."""
    return CallToolResult(content=[TextContent(type="text", text=f"refused: {reason}")], isError=True)


def serve_http(host: str = "127.0.0.1") -> None:
    """Serve streamable HTTP on ``host`` and a free port; print the URL once it listens."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(mcp.streamable_http_app(), log_level="warning"))

    async def announce() -> None:
        while not server.started:  # uvicorn sets it once the socket accepts
            await asyncio.sleep(0.02)
        print(f"listening on http://{host}:{port}/mcp", flush=True)

    async def main() -> None:
        await asyncio.gather(server.serve(sockets=[sock]), announce())

    asyncio.run(main())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", action="store_true", help="serve streamable HTTP on 127.0.0.1 (default: stdio)")
    if parser.parse_args().http:
        serve_http()
    else:
        mcp.run()  # stdio
