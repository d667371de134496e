"""Wire protocols, one folder each: what a protocol is, served and called, in one place.

A protocol's folder holds its request schema, both translations (serving:
native request -> chat messages, ``ChatResult`` -> native response and
stream events; calling: chat messages -> native request, native reply ->
``ReferenceReply``), its finish-reason and error maps once, and its stream
framing. ``_shared`` holds what every protocol uses (tool results, the
finish-reason table, the calling seam, server-sent events).

The server's route for a protocol (``server.protocols``) and the
coordinator's reference client (``coordinator._reference``) import from
here; this package imports neither. A new protocol is a folder here, one
line in ``WIRES``, and a route module in ``server.protocols``.
"""

from __future__ import annotations

from ..registry import Registry
from . import anthropic_messages, bedrock_converse, gemini, openai_chat, openai_responses
from ._shared import (
    EVENTS, CallingWire, FinishReasons, ReferenceReply, Wire, arguments_object, arguments_text, sse, tool_message,
)

WIRES: Registry[Wire] = Registry("wire protocol")
WIRES.register("openai_chat")(openai_chat.WIRE)
WIRES.register("openai_responses")(openai_responses.WIRE)
WIRES.register("anthropic_messages")(anthropic_messages.WIRE)
WIRES.register("bedrock_converse")(bedrock_converse.WIRE)
WIRES.register("gemini")(gemini.WIRE)

__all__ = ["EVENTS", "WIRES", "CallingWire", "FinishReasons", "ReferenceReply", "Wire", "arguments_object",
           "arguments_text", "sse", "tool_message"]
