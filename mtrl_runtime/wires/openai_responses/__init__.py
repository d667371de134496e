"""OpenAI Responses (``POST /v1/responses``): the request schema, the serving translations, the event stream.

Serving: ``ResponsesRequest`` (``_request``) and ``input_messages`` turn the
input items into chat messages; ``response_object`` (``_response``) writes a
``ChatResult`` as a ``response``, ``ResponsesEvents`` (``_stream``) as its
server-sent events. Refusals are OpenAI's error shape (``openai_chat``).
Calling: ``OpenAIResponsesWire`` (``_calling``). How a response ended
(``incomplete_details.reason``) and the tool choices are in ``_maps``, once
for both directions.
"""

from __future__ import annotations

from .._shared import Wire
from ._calling import OpenAIResponsesWire
from ._maps import INCOMPLETE, TOOL_CHOICE
from ._request import (
    HOSTED_TOOLS, NAMESPACE_SEPARATOR, FunctionTool, HostedTool, NamespaceTool, ResponsesRequest, input_messages,
    parse_tool,
)
from ._response import output_items, response_events, response_object
from ._stream import ResponsesEvents

WIRE = Wire("openai_responses", ResponsesRequest, OpenAIResponsesWire(), reference_name="responses")

__all__ = ["HOSTED_TOOLS", "INCOMPLETE", "NAMESPACE_SEPARATOR", "TOOL_CHOICE", "WIRE", "FunctionTool", "HostedTool", "NamespaceTool",
           "OpenAIResponsesWire", "ResponsesEvents", "ResponsesRequest", "input_messages", "output_items", "parse_tool",
           "response_events", "response_object"]
