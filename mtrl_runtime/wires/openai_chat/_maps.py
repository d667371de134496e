"""OpenAI chat completions' tool choices, once for both directions (serving and calling).

``tool_choice`` is ``"auto"``, ``"none"``, ``"required"`` or an object
naming the function, ``{"type": "function", "function": {"name": ...}}``.
"""

from __future__ import annotations

from typing import Any

from ...errors import BadRequest
from .._shared import ToolChoices


def _write(kind: str, name: str | None) -> Any:
    return {"type": "function", "function": {"name": name}} if kind == "function" else kind


def _read(value: Any) -> tuple[str, str | None]:
    """The kind and the function's name; a BadRequest naming ``tool_choice`` for an object that names none."""
    if not isinstance(value, dict):
        return value, None
    fn = value.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if value.get("type", "function") != "function" or not isinstance(name, str) or not name:
        raise BadRequest(f"tool_choice must be {{'type': 'function', 'function': {{'name': ...}}}}, got {value!r}",
                         param="tool_choice")
    return "function", name


TOOL_CHOICE = ToolChoices((("auto", "auto"), ("none", "none"), ("required", "required"), ("function", "function")),
                          _write, _read)

__all__ = ["TOOL_CHOICE"]
