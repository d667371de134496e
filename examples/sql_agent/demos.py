"""Gold answers as warm-start data: the JSONL that ``mtrl sft --conversations`` reads.

SmolLM2-135M writes the answer block and runnable SQL, but in 20 steps of
RL (320 rollouts) none of its queries matched a gold result set, so the
largest part of the reward (0.7) never appears in a group. A few
demonstrations first give it that signal (docs/warm-start.md). Each line is
one *train* question exactly as the agent sees it (the system prompt, the
worked examples at weight 0: prompt, not the model's replies; the question)
and the gold query as the final answer block, with the tool the agent binds.
Questions are taken from the train split only (val and test stay held
out), in turn from each template, so that any count covers the templates
as evenly as it can.

``python -m examples.sql_agent demos --out runs/sql_demos.jsonl --count 8``
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .._demos import demos_main, interleaved, prompt_context
from .data import load_instances
from .database import company_env
from .prompts import build_messages
from .reward import format_answer
from .tools import tool_spec

DEMO_SPLIT = "train"


def demo_rows(count: int, rows: Sequence[Mapping[str, Any]] | None = None) -> list[Mapping[str, Any]]:
    """The first ``count`` train questions taken in turn from each template."""
    rows = list(load_instances(DEMO_SPLIT) if rows is None else rows)
    return interleaved(rows, lambda row: row["data"]["template"], count)


def conversation(row: Mapping[str, Any]) -> dict[str, Any]:
    """One question as an OpenAI fine-tuning line: the agent's prompt, then its gold query as the answer block."""
    with company_env().open() as db:
        tools = [tool_spec(db)]
    answer = {"role": "assistant", "content": format_answer(row["ground_truth"]["sql"])}
    return {"messages": [*prompt_context(build_messages(row)), answer], "tools": tools}


def main(argv: Sequence[str] | None = None) -> int:
    """``demos --out PATH --count N``: N train questions' gold answers for ``mtrl sft --conversations``."""
    return demos_main(argv, prog="python -m examples.sql_agent demos", split=DEMO_SPLIT, pick=demo_rows,
                      conversation=conversation)


__all__ = ["DEMO_SPLIT", "conversation", "demo_rows", "main"]
