"""A script for the ``scripted`` engine: the reference fix for a few tasks, a give-up for the rest.

``scripted.yaml`` points the engine at ``script.yaml``, which this module
writes, so that every ``mtrl`` command runs the coding agent, its sandbox
and its scorer with no model generating:

- the first ``EPISODES_PER_SPLIT`` tasks of each split get the reference
  episode: read the file, write the fixed file, run the tests, answer.
  Reward 1, strict score 1;
- every other task gets a look at the files and a give-up: reward 0.

An entry is picked by the prompt's "Fix `FUNCTION` in `FILE`" line, which
only that task's prompt holds.

    python -m examples.coding.scripted [--check]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from .._datafiles import data_main, stale_paths, write_files

from .data import PACKAGE_DIR, Repo, generate_repos

EPISODES_PER_SPLIT = 4


def match(repo: Repo) -> str:
    return f"Fix `{repo.theme.function}` in `{repo.target}`"


def episode(repo: Repo) -> list[dict[str, Any]]:
    """The reference episode: read, fix, test, answer."""
    return [
        {"text": f"Reading {repo.target}.", "tool_call": {"name": "read_file", "arguments": {"path": repo.target}}},
        {"text": "Writing the fix.", "tool_call": {"name": "write_file",
                                                   "arguments": {"path": repo.target, "content": repo.fixed}}},
        {"text": "Running the tests.", "tool_call": {"name": "run_command",
                                                     "arguments": {"command": "python3 -m unittest"}}},
        f"Fixed `{repo.theme.function}` in {repo.target}; the tests pass.",
    ]


GIVE_UP = [{"text": "Looking around.", "tool_call": {"name": "list_files", "arguments": {}}},
           "I could not find the bug."]


def script() -> dict[str, Any]:
    chosen = [repo for repos in generate_repos().values() for repo in repos[:EPISODES_PER_SPLIT]]
    entries = [{"match": match(repo), "replies": episode(repo)} for repo in chosen]
    return {"tasks": [*entries, {"replies": GIVE_UP}]}


def generate() -> dict[str, str]:
    """``script.yaml`` as text (JSON is YAML: one entry a line)."""
    entries = script()["tasks"]
    header = "# written by python -m examples.coding.scripted; see that module\n"
    body = ",\n".join("  " + json.dumps(entry) for entry in entries)
    return {"script.yaml": header + '{"tasks": [\n' + body + "\n]}\n"}


def write(root: Path = PACKAGE_DIR) -> list[Path]:
    return write_files(generate(), root)


def stale_files(root: Path = PACKAGE_DIR) -> list[str]:
    return stale_paths(generate(), root)


def main(argv: Sequence[str] | None = None) -> int:
    return data_main(argv, "examples.coding.scripted", write, stale_files)


if __name__ == "__main__":
    raise SystemExit(main())
