"""Gemini's finish reasons and error statuses, once for both directions (serving and calling).

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

from .._shared import FinishReasons

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

__all__ = ["API_VERSION", "ERROR_STATUSES", "FINISH"]
