"""Bedrock Converse (``converse``, ``converse-stream``): the request schema, both translations, the maps, the framing.

Serving: ``ConverseRequest`` (``_request``); ``chat_messages`` and
``chat_tools`` (``_translate``) turn a request into chat; ``converse_json``
writes a ``ChatResult`` as the response body, ``ConverseEvents`` (``_stream``)
as its events in AWS event-stream framing (``eventstream``), ``error_body`` a
refusal in the shape botocore reads. Calling: ``BedrockConverseWire``
(``_calling``). Stop reasons, tool choices and error names are in ``_maps``,
once for both directions.
"""

from __future__ import annotations

from .._shared import Wire
from . import eventstream
from ._calling import BedrockConverseWire
from ._maps import ERROR_TYPES, FINISH, STREAM_EXCEPTIONS, TOOL_CHOICE, error_type
from ._request import ContentBlock, ConverseRequest, Message, ToolChoice, ToolConfig
from ._stream import ConverseEvents
from ._translate import chat_messages, chat_tools, content_blocks, converse_json, error_body, stop_reason, usage

WIRE = Wire("bedrock_converse", ConverseRequest, BedrockConverseWire(), reference_name="bedrock")

__all__ = ["ERROR_TYPES", "FINISH", "STREAM_EXCEPTIONS", "TOOL_CHOICE", "WIRE", "BedrockConverseWire", "ContentBlock", "ConverseEvents",
           "ConverseRequest", "Message", "ToolChoice", "ToolConfig", "chat_messages", "chat_tools", "content_blocks",
           "converse_json", "error_body", "error_type", "eventstream", "stop_reason", "usage"]
