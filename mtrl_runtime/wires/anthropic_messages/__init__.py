"""Anthropic Messages (``POST /v1/messages``): the request schema, both translations, the maps, the event stream.

Serving: ``MessagesRequest`` (``_request``) and ``chat_messages`` turn a
request into chat messages; ``message_object`` (``_response``) writes a
``ChatResult`` as a ``message``, ``MessagesEvents`` (``_stream``) as its
server-sent events, ``anthropic_error_body`` a refusal. Calling:
``AnthropicMessagesWire`` (``_calling``). Stop reasons, tool choices and
error types are in ``_maps``, once for both directions.
"""

from __future__ import annotations

from .._shared import Wire
from ._calling import AnthropicMessagesWire
from ._maps import API_VERSION, ERROR_TYPES, FINISH, TOOL_CHOICE
from ._request import CustomTool, MessagesRequest, chat_messages
from ._response import SIGNATURE, anthropic_error_body, content_blocks, message_object
from ._stream import MessagesEvents

WIRE = Wire("anthropic_messages", MessagesRequest, AnthropicMessagesWire(), reference_name="anthropic")

__all__ = ["API_VERSION", "ERROR_TYPES", "FINISH", "SIGNATURE", "TOOL_CHOICE", "WIRE", "AnthropicMessagesWire", "CustomTool",
           "MessagesEvents", "MessagesRequest", "anthropic_error_body", "chat_messages", "content_blocks",
           "message_object"]
