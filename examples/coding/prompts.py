"""The coding agent's system prompt and the first messages of an episode."""

from __future__ import annotations

from typing import Any

from mtrl_runtime.types import Task

SYSTEM_PROMPT = """You fix bugs in small Python repositories. The repository is in /workspace; you act on it only \
through your tools: list_files, read_file, write_file (replaces a whole file) and run_command (a shell command in \
the repository root).

Work like this:
1. read the file the bug report names;
2. write the file back with the smallest change that fixes the function;
3. run the tests with `python3 -m unittest` and read the result;
4. when they pass, answer with one line saying what you changed, and no tool call.

Change only the file the report names: never edit the tests or add files."""


def build_messages(task: Task) -> list[dict[str, Any]]:
    """The system prompt and the bug report."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.prompt or ""}]


__all__ = ["SYSTEM_PROMPT", "build_messages"]
