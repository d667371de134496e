"""Gemini's finish reasons, tool choices and error statuses, once for both directions (serving and calling).

Gemini has no finish reason of its own for tool calls: a turn that ends in
``functionCall`` parts ends ``STOP`` (the caller reads the parts). The
content filters (``SAFETY``, ``RECITATION``, ``BLOCKLIST``,
``PROHIBITED_CONTENT``, ``SPII``, ``IMAGE_SAFETY``) are one chat reason,
``content_filter``. A refusal is Google's error shape (``error.code``,
``error.message``, ``error.status``), its status the canonical code name of
the HTTP status (google.rpc.Code, as the Gemini API's troubleshooting page
lists them).
"""

from __future__ import annotations

from typing import Any

from .._shared import FinishReasons, ToolChoices

# Read from a reply: each finish reason's chat reason; STOP and the rest (LANGUAGE, OTHER, MALFORMED_FUNCTION_CALL...)
# are left out, so they read as tool_calls when the reply holds calls, else stop. Written in an answer: a chat
# reason's first native one (stop, tool_calls: STOP, the default).
FINISH = FinishReasons((("MAX_TOKENS", "length"), ("SAFETY", "content_filter"),
                        ("RECITATION", "content_filter"), ("BLOCKLIST", "content_filter"),
                        ("PROHIBITED_CONTENT", "content_filter"), ("SPII", "content_filter"),
                        ("IMAGE_SAFETY", "content_filter")), default="STOP")

# google.rpc.Code names by HTTP status
ERROR_STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}

API_VERSION = "v1beta"  # what a reference is called on (google-genai 2.x and ADK call it; 3.x calls v1)


def _write_choice(mode: str, name: str | None) -> dict[str, Any]:
    return {"mode": mode} if name is None else {"mode": mode, "allowedFunctionNames": [name]}


def _read_choice(value: Any) -> tuple[str | None, str | None]:
    names = value.get("allowedFunctionNames") or ()
    return value.get("mode"), names[0] if len(names) == 1 else None


# toolConfig.functionCallingConfig: {"mode": <kind>}, with "allowedFunctionNames" [the tool] for a named one. ANY is
# a required call, of the one allowed function when it names one (several: required, the tools narrowed to them by
# ``GenerateContentRequest.chat_tools``). MODE_UNSPECIFIED is AUTO, Gemini's default; VALIDATED (the model may answer
# or call, its calls checked against their schemas) is auto to the policy, whose calls are parsed either way.
TOOL_CHOICE = ToolChoices((("AUTO", "auto"), ("ANY", "required"), ("ANY", "function"), ("NONE", "none"),
                           ("MODE_UNSPECIFIED", "auto"), ("VALIDATED", "auto")),
                          _write_choice, _read_choice)


__all__ = ["API_VERSION", "ERROR_STATUSES", "FINISH", "TOOL_CHOICE"]
