"""Anthropic Messages' stop reasons, tool choices and error types, once for both directions (serving and calling)."""

from __future__ import annotations

from typing import Any

from .._shared import FinishReasons, ToolChoices

# Read from a reply: each stop reason's chat finish reason. Written in an answer: a chat reason's first native
# one (``stop_sequence`` is written only when the request's stop sequence ended the turn, see ``_response``).
FINISH = FinishReasons((("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"),
                        ("tool_use", "tool_calls"), ("refusal", "content_filter")), default="end_turn")

# Anthropic's error types by HTTP status (what the SDK's exception classes are chosen by is the status itself)
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}

API_VERSION = "2023-06-01"

# tool_choice: {"type": <kind>}, with the tool's "name" for "tool"
TOOL_CHOICE = ToolChoices((("auto", "auto"), ("none", "none"), ("any", "required"), ("tool", "function")),
                          write=lambda kind, name: {"type": kind} if name is None else {"type": kind, "name": name},
                          read=lambda value: (value.get("type"), value.get("name")))

__all__ = ["API_VERSION", "ERROR_TYPES", "FINISH", "TOOL_CHOICE"]
