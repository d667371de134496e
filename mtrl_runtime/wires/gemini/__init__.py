"""Gemini ``generateContent`` / ``streamGenerateContent``: what google-genai, Google ADK and gemini-cli speak.

Serving: ``GenerateContentRequest`` (``_request``) and ``chat_messages``
turn a request into chat messages; ``generate_content_response``
(``_response``) writes a ``ChatResult`` as a ``GenerateContentResponse``,
``GeminiEvents`` (``_stream``) as its stream (server-sent events, or the
REST API's JSON array), ``gemini_error_body`` a refusal. Calling:
``GeminiWire`` (``_calling``). Finish reasons, tool choices and error
statuses are in ``_maps``, once for both directions.
"""

from __future__ import annotations

from .._shared import Wire
from ._calling import GeminiWire
from ._maps import API_VERSION, ERROR_STATUSES, FINISH, TOOL_CHOICE
from ._request import GenerateContentRequest, GenerationConfig, chat_messages, json_schema
from ._response import error_payload, gemini_error_body, generate_content_response, response_parts
from ._stream import GeminiEvents

WIRE = Wire("gemini", GenerateContentRequest, GeminiWire(), reference_name="gemini")

__all__ = ["API_VERSION", "ERROR_STATUSES", "FINISH", "TOOL_CHOICE", "WIRE", "GeminiEvents", "GeminiWire", "GenerateContentRequest",
           "GenerationConfig", "chat_messages", "error_payload", "gemini_error_body", "generate_content_response",
           "json_schema", "response_parts"]
