"""Bedrock Converse's stop reasons, tool choices and error names, once for both directions (serving and calling)."""

from __future__ import annotations

from typing import Any

from .._shared import FinishReasons, ToolChoices

# Read from a reply: each stop reason's chat finish reason. Written in an answer: a chat reason's first native
# one (``stop_sequence`` only when one of the request's stop sequences is in the text, see ``_translate``).
FINISH = FinishReasons((("end_turn", "stop"), ("stop_sequence", "stop"), ("max_tokens", "length"),
                        ("tool_use", "tool_calls"), ("content_filtered", "content_filter"),
                        ("guardrail_intervened", "content_filter")), default="end_turn")

# Bedrock's error type for each status mtrl answers with (botocore names the exception after it)
ERROR_TYPES = {
    400: "ValidationException",
    401: "AccessDeniedException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    409: "ConflictException",
    413: "ValidationException",
    429: "ThrottlingException",
    502: "ModelErrorException",
    503: "ServiceUnavailableException",
}

# the stream union's exception members, by the HTTP status of mtrl's error (others: internalServerException)
STREAM_EXCEPTIONS = {
    400: "validationException",
    413: "validationException",
    429: "throttlingException",
    502: "modelStreamErrorException",
    503: "serviceUnavailableException",
}


def error_type(status: int) -> str:
    """The Bedrock exception name botocore raises for an mtrl error of HTTP ``status``."""
    return ERROR_TYPES.get(status, "InternalServerException" if status >= 500 else "ValidationException")


def _read_choice(value: Any) -> tuple[str, str | None]:
    (kind, member), = value.items()  # a union: exactly one member (the request schema checks it)
    return kind, member.get("name")


# toolConfig.toolChoice: a union of one member, {<kind>: {}}, with the tool's "name" for "tool"; Converse has no
# "none" (a request that wants no call sends no toolConfig)
TOOL_CHOICE = ToolChoices((("auto", "auto"), ("any", "required"), ("tool", "function")),
                          write=lambda kind, name: {kind: {} if name is None else {"name": name}}, read=_read_choice)


__all__ = ["ERROR_TYPES", "FINISH", "STREAM_EXCEPTIONS", "TOOL_CHOICE", "error_type"]
