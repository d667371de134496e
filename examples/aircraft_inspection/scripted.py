"""A script for the ``scripted`` engine: the reference episodes of a few aircraft, a guess for the rest.

``scripted.yaml`` (the config) points the engine at ``script.yaml``, which
this module writes, so that every ``mtrl`` command runs on this agent with
no model generating: the docs' commands run this way in seconds.

- The first ``EPISODES_PER_SPLIT`` aircraft of each split get the reference
  solver's episode (``solve``): the six SOP calls, each reply opening with
  its step line, then the answer. Reward 1, strict score 1.
- Every other aircraft gets one reply, an answer without a single tool
  call that guesses the commonest value of each field: the reward gives it
  partial credit (what it guessed right), the strict score mostly 0.

A rollout's entry is picked by its request (``Inspect aircraft N631UP (``),
which only that aircraft's prompt holds. Every sample of a task gets the
same replies (no model samples), so rewards differ across tasks, never
within a group.

    python -m examples.aircraft_inspection.scripted [--check]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from .._datafiles import data_main, stale_paths, write_files

from .data import PACKAGE_DIR, SPLIT_SIZES, load_instances
from .reward import format_answer
from .solver import solve, step_line

EPISODES_PER_SPLIT = 4
GUESS = {"aircraft_valid": True, "maintenance_due": False, "mechanical_status": "pass",
         "electrical_status": "pass", "incident_flag": False, "decision": "release"}


def _reply(message: dict[str, Any]) -> dict[str, Any]:
    """One assistant message of an episode as a script reply: its text, and its tool call if any."""
    reply: dict[str, Any] = {"text": message["content"]}
    for call in message.get("tool_calls") or []:
        fn = call["function"]
        reply["tool_call"] = {"name": fn["name"], "arguments": json.loads(fn["arguments"])}
    return reply


def script(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The script: one entry per row with its reference episode, then the guess for every other task."""
    entries = [{"match": f"Inspect aircraft {row['data']['tail_number']} (",
                "replies": [_reply(m) for m in solve(row).messages if m["role"] == "assistant"]} for row in rows]
    entries.append({"replies": [f"{step_line(1, 'answer')}\n{format_answer(GUESS)}"]})
    return {"tasks": entries}


def generate() -> dict[str, str]:
    """``script.yaml`` as text (JSON is YAML: one entry a line, stable across PyYAML versions)."""
    rows = [row for split in SPLIT_SIZES for row in load_instances(split)[:EPISODES_PER_SPLIT]]
    entries = script(rows)["tasks"]
    header = "# written by python -m examples.aircraft_inspection.scripted; see that module\n"
    body = ",\n".join("  " + json.dumps(entry) for entry in entries)
    return {"script.yaml": f'{header}{{"tasks": [\n{body}\n]}}\n'}


def write(root: Path = PACKAGE_DIR) -> list[Path]:
    return write_files(generate(), root)


def main(argv: Sequence[str] | None = None) -> int:
    """Write ``script.yaml``, or with ``--check`` report whether the committed one is up to date."""
    return data_main(argv, "examples.aircraft_inspection.scripted", write, lambda: stale_paths(generate(), PACKAGE_DIR))


if __name__ == "__main__":
    raise SystemExit(main())
