"""The agent's one tool, ``query_database``, on its episode's own database, in OpenAI's function format.

Framework-free: ``tool_spec`` is the OpenAI ``tools`` entry and ``call_tool``
runs a model's tool call against one episode's ``SqliteDatabase``; an
unknown tool or bad arguments is an error result the model reads.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from mtrl_runtime.envs import SqliteDatabase

TOOL_NAME = "query_database"
TOOL_DESCRIPTION = "Run one read-only SQL query (SQLite) on the company database and get its rows."


def tool_spec(db: SqliteDatabase) -> dict[str, Any]:
    """The OpenAI ``tools`` entry for ``query_database``."""
    spec = db.query_tool(TOOL_NAME, TOOL_DESCRIPTION).spec
    return {"type": "function", "function": spec}


def parse_arguments(arguments: Any) -> dict[str, Any] | str:
    """A tool call's arguments as a dict, or the error text to show the model."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return f"arguments are not valid JSON: {arguments!r}"
    if not isinstance(arguments, Mapping):
        return f"arguments must be a JSON object, got {arguments!r}"
    return dict(arguments)


def call_tool(db: SqliteDatabase, name: str, arguments: Any) -> dict[str, Any]:
    """Run one tool call on the episode's database; errors come back as ``{"error": ...}``."""
    if name != TOOL_NAME:
        return {"error": f"unknown tool {name!r}; the only tool is {TOOL_NAME}"}
    parsed = parse_arguments(arguments)
    if isinstance(parsed, str):
        return {"error": parsed}
    return db.query_tool(TOOL_NAME, TOOL_DESCRIPTION)(**parsed)


__all__ = ["TOOL_DESCRIPTION", "TOOL_NAME", "call_tool", "parse_arguments", "tool_spec"]
