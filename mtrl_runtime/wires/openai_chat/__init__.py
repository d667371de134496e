"""OpenAI chat completions (``POST /v1/chat/completions``): the request schema, both translations, the error shape.

Chat completions is the chat shape itself, so serving translates nothing
in: ``ChatCompletionRequest`` (``_request``) validates the body and its
messages go to the coordinator as they are. Out: ``completion_json``
(``_response``) writes a ``ChatResult`` as a ``chat.completion``,
``ChunkEvents`` (``_stream``) as its ``chat.completion.chunk`` events,
``error_body`` (``_errors``) a refusal in OpenAI's shape (Responses shares
it). Calling: ``OpenAIChatWire`` (``_calling``). The tool choices are in
``_maps``, once for both directions.
"""

from __future__ import annotations

from .._shared import Wire
from ._calling import OpenAIChatWire
from ._errors import error_body
from ._maps import TOOL_CHOICE
from ._request import ChatCompletionRequest, ChatMessage, ToolSpec
from ._response import completion_json, logprobs, usage
from ._stream import ChunkEvents

WIRE = Wire("openai_chat", ChatCompletionRequest, OpenAIChatWire(), reference_name="openai")

__all__ = ["TOOL_CHOICE", "WIRE", "ChatCompletionRequest", "ChatMessage", "ChunkEvents", "OpenAIChatWire", "ToolSpec",
           "completion_json", "error_body", "logprobs", "usage"]
