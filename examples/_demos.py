"""Warm-start demonstrations of an example: train rows picked evenly across their kinds, written as the JSONL that
``mtrl sft --conversations`` reads (OpenAI fine-tuning lines), and the ``demos`` command that writes them.

Each example's ``demos.py`` says what one row's conversation is (its agent's
prompt, then the reference answer); these helpers are what every example
does around that.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

Conversation = Callable[[Mapping[str, Any]], dict[str, Any]]  # one row -> {"messages": [...], "tools": [...]}


def interleaved(rows: Sequence[Mapping[str, Any]], kind: Callable[[Mapping[str, Any]], Any],
                count: int, order: Sequence[Any] = ()) -> list[Mapping[str, Any]]:
    """The first ``count`` rows taken in turn from each kind (``order`` first, then the others in the order they
    first appear), so that any count covers the kinds as evenly as it can."""
    if not 1 <= count <= len(rows):
        raise ValueError(f"count must be between 1 and {len(rows)} (the rows there are), got {count!r}")
    queues: dict[Any, list[Mapping[str, Any]]] = {name: [] for name in order}
    for row in rows:
        queues.setdefault(kind(row), []).append(row)
    picked: list[Mapping[str, Any]] = []
    while len(picked) < count:
        picked += [queue.pop(0) for queue in queues.values() if queue][: count - len(picked)]
    return picked


def prompt_context(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The agent's prompt with its worked example's replies at weight 0: context in training, not the model's turns."""
    for message in messages:
        if message["role"] == "assistant":
            message["weight"] = 0
    return messages


def write_demos(path: str | Path, rows: Sequence[Mapping[str, Any]], conversation: Conversation) -> Path:
    """One conversation a row, as JSONL at ``path``; returns the path."""
    path = Path(path)
    lines = [json.dumps(conversation(row), ensure_ascii=False) + "\n" for row in rows]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines), encoding="utf-8")
    return path


def demos_main(argv: Sequence[str] | None, *, prog: str, split: str,
               pick: Callable[[int], Sequence[Mapping[str, Any]]], conversation: Conversation) -> int:
    """``demos --out PATH --count N``: N rows of ``split`` (``pick``) written as conversations for ``mtrl sft``."""
    parser = argparse.ArgumentParser(prog=prog, description=f"Write reference episodes on {split} rows as "
                                                            "OpenAI-format conversations (mtrl sft --conversations FILE).")
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    parser.add_argument("--count", type=int, required=True, help=f"how many {split} rows")
    args = parser.parse_args(argv)
    try:
        rows = pick(args.count)
    except ValueError as exc:
        parser.error(f"--count: {exc}")
    path = write_demos(args.out, rows, conversation)
    print(f"{path}: {args.count} demonstrations from the {split} split")
    return 0


__all__ = ["Conversation", "demos_main", "interleaved", "prompt_context", "write_demos"]
