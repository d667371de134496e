"""The reference solver's episodes as warm-start data: the JSONL that ``mtrl sft --conversations`` reads.

SmolLM2-135M never makes the first tool call on its own, so RL gets no
signal; a few demonstrations first give it one (docs/warm-start.md). Each
line is one *train* ticket exactly as the agent sees it: the system prompt,
the worked example, the ticket, then the solver's tool calls, the tools'
results and the final answer block, with the tools the agent binds. The
worked example is part of the agent's prompt, not a reply of the model, so
its assistant messages carry ``"weight": 0`` (rendered as context, left out
of the loss). Tickets are taken from the train split only (val and test
stay held out), interleaved by resolution so that any count covers the four
resolutions as evenly as it can.

``python -m examples.customer_service demos --out runs/cs_demos.jsonl --count 4``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from .data import RESOLUTIONS, load_instances
from .prompts import build_messages
from .solver import solve
from .tools import tool_specs

DEMO_SPLIT = "train"


def tool_definitions() -> list[dict[str, Any]]:
    """The five tools in OpenAI's format, as LangChain's ``bind_tools`` sends them to the policy endpoint."""
    return [{"type": "function", "function": dict(spec)} for spec in tool_specs()]


def demo_rows(count: int, rows: Sequence[Mapping[str, Any]] | None = None) -> list[Mapping[str, Any]]:
    """The first ``count`` train rows taken in turn from each resolution (refund, replace, escalate, deny, ...)."""
    rows = list(load_instances(DEMO_SPLIT) if rows is None else rows)
    if not 1 <= count <= len(rows):
        raise ValueError(f"count must be between 1 and {len(rows)} (the {DEMO_SPLIT} tickets), got {count!r}")
    queues = [[r for r in rows if r["ground_truth"]["resolution"] == name] for name in RESOLUTIONS]
    picked: list[Mapping[str, Any]] = []
    while len(picked) < count:
        picked += [queue.pop(0) for queue in queues if queue][: count - len(picked)]
    return picked


def conversation(row: Mapping[str, Any]) -> dict[str, Any]:
    """One ticket as an OpenAI fine-tuning line: the agent's prompt (example replies at weight 0), the solver's turns."""
    prompt = build_messages(row)
    for message in prompt:
        if message["role"] == "assistant":
            message["weight"] = 0
    return {"messages": [*prompt, *solve(row).messages], "tools": tool_definitions()}


def write_demos(path: str | Path, count: int) -> Path:
    """``count`` demonstrations (see ``demo_rows``) as JSONL at ``path``; returns the path."""
    path = Path(path)
    lines = [json.dumps(conversation(row), ensure_ascii=False) + "\n" for row in demo_rows(count)]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines), encoding="utf-8")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``demos --out PATH --count N``: write N train tickets' reference episodes for ``mtrl sft --conversations``."""
    parser = argparse.ArgumentParser(prog="python -m examples.customer_service demos",
                                     description="Write the reference solver's episodes on train tickets as "
                                                 "OpenAI-format conversations (mtrl sft --conversations FILE).")
    parser.add_argument("--out", required=True, help="the JSONL file to write")
    parser.add_argument("--count", type=int, required=True, help="how many train tickets (1-80)")
    args = parser.parse_args(argv)
    try:
        path = write_demos(args.out, args.count)
    except ValueError as exc:
        parser.error(f"--count: {exc}")
    print(f"{path}: {args.count} demonstrations from the {DEMO_SPLIT} split")
    return 0


__all__ = ["DEMO_SPLIT", "conversation", "demo_rows", "main", "tool_definitions", "write_demos"]
