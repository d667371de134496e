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

from pathlib import Path
from typing import Any, Mapping, Sequence

from .._demos import demos_main, interleaved, prompt_context
from .._demos import write_demos as write_conversations
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
    return interleaved(rows, lambda row: row["ground_truth"]["resolution"], count, RESOLUTIONS)


def conversation(row: Mapping[str, Any]) -> dict[str, Any]:
    """One ticket as an OpenAI fine-tuning line: the agent's prompt (example replies at weight 0), the solver's turns."""
    return {"messages": [*prompt_context(build_messages(row)), *solve(row).messages], "tools": tool_definitions()}


def write_demos(path: str | Path, count: int) -> Path:
    """``count`` demonstrations (see ``demo_rows``) as JSONL at ``path``; returns the path."""
    return write_conversations(path, demo_rows(count), conversation)


def main(argv: Sequence[str] | None = None) -> int:
    """``demos --out PATH --count N``: write N train tickets' reference episodes for ``mtrl sft --conversations``."""
    return demos_main(argv, prog="python -m examples.customer_service demos", split=DEMO_SPLIT, pick=demo_rows,
                      conversation=conversation)


__all__ = ["DEMO_SPLIT", "conversation", "demo_rows", "main", "tool_definitions", "write_demos"]
