"""Chat messages for one instance: the SOP as system prompt, an optional worked example, the request.

The tool definitions are not in these messages: pass ``TOOL_SPECS`` as the
request's ``tools`` and the chat template renders them.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from .data import DEFAULT_EXAMPLE, example_instance
from .reward import FIELD_VALUES, FIELDS, check_fields
from .solver import solve

SOP_PATH = Path(__file__).resolve().parent / "sop.md"


@functools.lru_cache(maxsize=1)
def sop_text() -> str:
    """The SOP as committed in sop.md."""
    return SOP_PATH.read_text(encoding="utf-8").strip()


def _keys_line(fields: tuple[str, ...]) -> str:
    """``a, b (true/false); c ("pass"/"fail")``: the asked keys grouped by their allowed values."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for name in fields:
        groups.setdefault(FIELD_VALUES[name], []).append(name)
    return "; ".join(f"{', '.join(names)} ({'/'.join(json.dumps(v) for v in values)})"
                     for values, names in groups.items())


def system_prompt(fields: Sequence[str] = FIELDS) -> str:
    """The system message: role, SOP, and the answer's keys with their allowed values."""
    fields = check_fields(fields)
    return f"You are an aircraft inspection agent.\n{sop_text()}\nAnswer keys: {_keys_line(fields)}."


def _request(instance: Mapping[str, Any] | Any) -> str:
    """The user request of an instance row (a dict) or of a Task (its ``prompt``)."""
    prompt = instance.get("prompt") if isinstance(instance, Mapping) else getattr(instance, "prompt", None)
    if not isinstance(prompt, str) or not prompt:
        raise ValueError(f"instance has no prompt text; got {prompt!r}")
    return prompt


def example_messages(fields: Sequence[str] = FIELDS, example: str = DEFAULT_EXAMPLE) -> list[dict[str, Any]]:
    """The worked example (see ``data.EXAMPLE_STATES``) as earlier chat turns: request, tool calls and
    results, final answer."""
    example = example_instance(example)
    return [{"role": "user", "content": example["prompt"]}, *solve(example, fields).messages]


def build_messages(instance: Mapping[str, Any] | Any, with_examples: bool = True,
                   fields: Sequence[str] = FIELDS, example: str = DEFAULT_EXAMPLE) -> list[dict[str, Any]]:
    """OpenAI-format messages for one instance, ending with its user request.

    ``fields`` (see ``FIELD_SETS``) and ``example`` are the difficulty knobs.
    """
    fields = check_fields(fields)
    messages = [{"role": "system", "content": system_prompt(fields)}]
    if with_examples:
        messages += example_messages(fields, example)
    messages.append({"role": "user", "content": _request(instance)})
    return messages


__all__ = ["SOP_PATH", "build_messages", "example_messages", "sop_text", "system_prompt"]
