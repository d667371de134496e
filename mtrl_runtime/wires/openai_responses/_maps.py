"""OpenAI Responses' end states and tool choices, once for both directions.

A reply cut short is ``status: "incomplete"`` with
``incomplete_details.reason``; a finished one is ``completed`` (its chat
finish reason ``tool_calls`` when it holds calls, else ``stop``).
``tool_choice`` is ``"auto"``, ``"none"``, ``"required"`` or a function
object, ``{"type": "function", "name": ...}`` (the name at the top, not
under ``function`` as chat completions has it).
"""

from __future__ import annotations

from typing import Any

from ...errors import BadRequest
from .._shared import FinishReasons, ToolChoices

# (incomplete_details.reason, chat finish reason); a chat reason with none here (stop, tool_calls) is completed
INCOMPLETE = FinishReasons((("max_output_tokens", "length"), ("content_filter", "content_filter")), default="")


def _write_choice(kind: str, name: str | None) -> Any:
    return {"type": "function", "name": name} if kind == "function" else kind


def _read_choice(value: Any) -> tuple[str, str | None]:
    """The kind and the function's name; a BadRequest naming ``tool_choice`` for an object that is no function."""
    if isinstance(value, str):
        return value, None
    name = value.get("name") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(name, str) or not name:
        raise BadRequest(f"tool_choice must be {{'type': 'function', 'name': ...}}, got {value!r:.120}; "
                         "only function tools are supported", param="tool_choice")
    return "function", name


TOOL_CHOICE = ToolChoices((("auto", "auto"), ("none", "none"), ("required", "required"), ("function", "function")),
                          _write_choice, _read_choice)

__all__ = ["INCOMPLETE", "TOOL_CHOICE"]
