"""Chat messages for one question: the schema as system prompt, optional worked examples, the question.

The worked examples answer directly, without a tool round trip, on
purpose: shown a tool call and its ``<tool_response>``, SmolLM2-135M starts
its own reply with ``<tool_response>`` (p ~ 0.55, measured at the first
token) instead of calling the tool (p ~ 0.005) or answering (p ~ 0.008).
Shown a direct answer, it starts with ``<final_output>`` (p ~ 0.09) or a
tool call (p ~ 0.1), which RL can build on. The tool stays available.

There are three (``data.EXAMPLES``: a count on one table, names over one
join, a sum over another join), none a template's question: shown only the
first, the model copied its ``SELECT COUNT(*) ... hire_year`` into nearly
every answer and no query matched (0 of 112 on 28 train questions x 4,
temperature 0.7); with the three, 2 of 112 matched and the mean reward rose
from 0.079 to 0.120 (base model, CPU).
"""

from __future__ import annotations

import copy
import functools
from typing import Any, Mapping

from .data import EXAMPLES
from .database import company_env
from .reward import format_answer
from .tools import TOOL_NAME, call_tool

INSTRUCTIONS = (
    "Call {tool}(sql) to run a SELECT and read its rows. When the rows answer the question, "
    "reply with your final query in <final_output></final_output> tags, nothing else."
)


@functools.lru_cache(maxsize=1)
def tables_text() -> str:
    """One ``table(col, col, ...)`` line per table, in schema order, then the join keys."""
    lines, joins = [], []
    with company_env().open() as db:
        for (table,) in db.fetch_all("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid"):
            columns = db.query(f'SELECT * FROM "{table}" LIMIT 0')["columns"]
            lines.append(f"{table}({', '.join(columns)})")
            for target, column, target_column in db.fetch_all(
                    'SELECT "table", "from", "to" FROM pragma_foreign_key_list(?) ORDER BY id', (table,)):
                joins.append(f"{table}.{column} = {target}.{target_column}")
    return "\n".join(lines) + "\nJoin on: " + ", ".join(joins)


def system_prompt() -> str:
    """The system message: role, tables and columns, and how to answer."""
    return ("You answer questions about a company database (SQLite) by querying it.\n"
            f"Tables:\n{tables_text()}\n{INSTRUCTIONS.format(tool=TOOL_NAME)}")


@functools.lru_cache(maxsize=1)
def _example() -> tuple[dict[str, Any], ...]:
    out = []
    with company_env().open() as db:
        for question, sql in EXAMPLES:
            result = call_tool(db, TOOL_NAME, {"sql": sql})
            if "error" in result:
                raise RuntimeError(f"the worked example's query fails: {result['error']}")
            out += [{"role": "user", "content": question}, {"role": "assistant", "content": format_answer(sql)}]
    return tuple(out)


def example_messages() -> list[dict[str, Any]]:
    """The worked example as earlier chat turns: a question and its final answer."""
    return copy.deepcopy(list(_example()))


def _question(instance: Mapping[str, Any] | Any) -> str:
    prompt = instance.get("prompt") if isinstance(instance, Mapping) else getattr(instance, "prompt", None)
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"instance has no prompt text; got {prompt!r}")
    return prompt


def build_messages(instance: Mapping[str, Any] | Any, with_examples: bool = True) -> list[dict[str, Any]]:
    """OpenAI-format messages for one question, ending with the question itself."""
    messages = [{"role": "system", "content": system_prompt()}]
    if with_examples:
        messages += example_messages()
    messages.append({"role": "user", "content": _question(instance)})
    return messages


__all__ = ["INSTRUCTIONS", "build_messages", "example_messages", "system_prompt", "tables_text"]
