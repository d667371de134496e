"""The agent's four tools, run in the rollout's sandbox, in OpenAI's function format.

``list_files``, ``read_file``, ``write_file`` and ``run_command`` act on
the sandbox's ``/workspace`` (paths relative to it); nothing touches the
host. A command has ``COMMAND_S`` seconds and its output is cut for the
model (``SHOWN_CHARS`` per stream, saying how much was left out); a mistake
(an unknown tool, bad arguments, a missing file) is an error result the
model reads.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from mtrl_runtime.sandboxes import SandboxError
from mtrl_runtime.types import Sandbox

COMMAND_S = 30.0
SHOWN_CHARS = 4000
MAX_FILES = 200


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required, "additionalProperties": False}}}


_PATH = {"type": "string", "description": "a path relative to the repository root"}
TOOLS: list[dict[str, Any]] = [
    _function("list_files", "List the files of the repository (or of one folder in it).",
              {"path": {**_PATH, "default": "."}}, []),
    _function("read_file", "Read a file of the repository.", {"path": _PATH}, ["path"]),
    _function("write_file", "Replace a file's whole content (or create it).",
              {"path": _PATH, "content": {"type": "string", "description": "the file's new content"}},
              ["path", "content"]),
    _function("run_command", f"Run a shell command in the repository root (at most {COMMAND_S:.0f} s), e.g. "
                             "`python3 -m unittest`.", {"command": {"type": "string"}}, ["command"]),
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)


def parse_arguments(arguments: Any) -> dict[str, Any] | str:
    """A tool call's arguments as a dict, or the error text to show the model."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return f"arguments are not valid JSON: {arguments[:200]!r}"
    if not isinstance(arguments, Mapping):
        return f"arguments must be a JSON object, got {arguments!r:.200}"
    return dict(arguments)


def _cut(text: str) -> str:
    if len(text) <= SHOWN_CHARS:
        return text
    return text[:SHOWN_CHARS] + f"\n[... {len(text) - SHOWN_CHARS} more characters not shown]"


def _check(args: dict[str, Any], name: str) -> str | None:
    spec = next(t["function"]["parameters"] for t in TOOLS if t["function"]["name"] == name)
    unknown = sorted(set(args) - set(spec["properties"]))
    if unknown:
        return f"unknown argument {unknown[0]!r}; {name} takes {', '.join(spec['properties'])}"
    missing = [key for key in spec["required"] if not isinstance(args.get(key), str)]
    if missing:
        return f"{name} needs {missing[0]!r} (a string)"
    return None


async def call_tool(box: Sandbox, name: str, arguments: Any) -> dict[str, Any]:
    """Run one tool call in ``box``; mistakes come back as ``{"error": ...}``."""
    if name not in TOOL_NAMES:
        return {"error": f"unknown tool {name!r}; the tools are {', '.join(TOOL_NAMES)}"}
    args = parse_arguments(arguments)
    if isinstance(args, str):
        return {"error": args}
    problem = _check(args, name)
    if problem:
        return {"error": problem}
    try:
        if name == "list_files":
            files = await box.list_files(args.get("path", "."))
            return {"files": files[:MAX_FILES], **({"not_shown": len(files) - MAX_FILES} if len(files) > MAX_FILES
                                                  else {})}
        if name == "read_file":
            data = await box.read_file(args["path"])
            return {"content": _cut(data.decode("utf-8", "replace"))}
        if name == "write_file":
            await box.write_file(args["path"], args["content"])
            return {"written": args["path"], "bytes": len(args["content"].encode())}
        result = await box.run(args["command"], timeout_s=COMMAND_S)
    except FileNotFoundError:
        return {"error": f"no such file: {args.get('path')}"}
    except SandboxError as exc:
        return {"error": str(exc)}
    out = {"exit_code": result.exit_code, "stdout": _cut(result.stdout), "stderr": _cut(result.stderr)}
    if result.timed_out or result.truncated:
        out["note"] = result.describe()
    if result.timed_out:
        out["error"] = f"the command was killed after {COMMAND_S:.0f} s"
    return out


__all__ = ["COMMAND_S", "SHOWN_CHARS", "TOOLS", "TOOL_NAMES", "call_tool", "parse_arguments"]
