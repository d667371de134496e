"""The OpenAPI path items of every registered protocol: their real request schemas and error shapes.

The protocol routes are plain ASGI routes (``_endpoint``), which FastAPI does
not document; ``openapi_paths`` publishes each path of each ``PROTOCOLS``
module with the pydantic model its route validates the body against (so a
schema-driven fuzzer reaches the translation and the engine), the path
parameters, what a 200 carries and the protocol's own error shape on a 4xx
(the shape its SDK reads). A registered protocol with no entry in ``DOCS``
is an error naming it, so a new protocol cannot go unpublished.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from ...wires import WIRES
from ...wires.bedrock_converse.eventstream import CONTENT_TYPE as EVENT_STREAM
from .._http import openapi_body
from . import PROTOCOLS, protocol_module

_MESSAGE = {"type": "string", "description": "what is wrong, naming the field and the value"}
_ANTHROPIC_ERROR = {
    "type": "object",
    "properties": {"type": {"const": "error"},
                   "error": {"type": "object", "properties": {"type": {"type": "string"}, "message": _MESSAGE},
                             "required": ["type", "message"]}},
    "required": ["type", "error"],
}
_BEDROCK_ERROR = {"type": "object", "properties": {"message": _MESSAGE}, "required": ["message"],
                  "description": "the exception's name is in the x-amzn-ErrorType header, as botocore reads it"}
_GOOGLE_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["code", "message", "status"],
    "properties": {"code": {"type": "integer"}, "message": _MESSAGE, "status": {"type": "string"}}}}}


@dataclass(frozen=True)
class ProtocolDoc:
    """How one protocol's paths are published: the request model, a summary, the 200's media types, the 4xx shape."""

    request: type[BaseModel]
    summary: str
    answers: tuple[str, ...]  # media types of a 200: the JSON answer, then the streamed one
    error: dict[str, Any] | None = None  # None: OpenAI's error shape (the document's ``Error``)


DOCS: dict[str, ProtocolDoc] = {
    "openai_chat": ProtocolDoc(WIRES.get("openai_chat").request, "OpenAI chat completion",
                               ("application/json", "text/event-stream")),
    "openai_responses": ProtocolDoc(WIRES.get("openai_responses").request, "OpenAI Responses",
                                    ("application/json", "text/event-stream")),
    "anthropic_messages": ProtocolDoc(WIRES.get("anthropic_messages").request, "Anthropic Messages",
                                      ("application/json", "text/event-stream"), _ANTHROPIC_ERROR),
    "bedrock_converse": ProtocolDoc(WIRES.get("bedrock_converse").request, "Bedrock Converse",
                                    ("application/json", EVENT_STREAM.decode()), _BEDROCK_ERROR),
    "gemini": ProtocolDoc(WIRES.get("gemini").request, "Gemini generateContent",
                          ("application/json", "text/event-stream"), _GOOGLE_ERROR),
}
_PARAMETER = re.compile(r"{(\w+)}")


def check_documented() -> None:
    """Refuse a registered protocol that has no entry in ``DOCS`` (the app checks this when it is made)."""
    missing = sorted(set(PROTOCOLS) - set(DOCS))
    if missing:
        raise ValueError(f"protocols {missing} have no OpenAPI entry in server/protocols/_openapi.DOCS; add one")


def openapi_paths() -> dict[str, dict[str, Any]]:
    """The path items of every registered protocol's paths (their request models' JSON schemas: about 60 ms of
    CPU, so the app builds them when its OpenAPI document is first asked for, not when it is made)."""
    check_documented()
    paths: dict[str, dict[str, Any]] = {}
    for name in PROTOCOLS:
        doc = DOCS[name]
        for path in protocol_module(name).PATHS:
            paths[path] = {"post": _operation(name, doc, path)}
    return paths


def _operation(name: str, doc: ProtocolDoc, path: str) -> dict[str, Any]:
    streamed = path.endswith("-stream")
    answers = doc.answers[1:] if streamed else doc.answers
    slug = re.sub(r"[^a-z0-9]+", "_", path.lower()).strip("_")
    by = "attributed by its path" if "{rollout_id}" in path else "attributed by header, or inference mode"
    operation: dict[str, Any] = {
        "summary": f"{doc.summary} ({by})",
        "operationId": f"{name}_{slug}",
        "parameters": [{"name": p, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
                       for p in _PARAMETER.findall(path)],
        **openapi_body(doc.request),
        "responses": {"200": {"description": "The answer; streamed events when asked to stream",
                              "content": {media: {"schema": {}} for media in answers}}},
    }
    error = {"content": {"application/json": {"schema": doc.error or {"$ref": "#/components/schemas/Error"}}}}
    operation["responses"]["4XX"] = {"description": "The request is refused; the message says why", **error}
    operation["responses"]["502"] = {"description": "The policy engine failed on this call", **error}
    if doc.error is not None:  # a path no route matches (an empty id, one holding '/') is every path's 404
        operation["responses"]["404"] = {
            "description": "An unknown rollout (the protocol's shape), or a path no route matches (OpenAI's shape)",
            "content": {"application/json": {"schema": {"anyOf": [doc.error, {"$ref": "#/components/schemas/Error"}]}}},
        }
    return operation


__all__ = ["DOCS", "ProtocolDoc", "check_documented", "openapi_paths"]
