"""OpenAI Responses (``POST /v1/responses``): the request schema, the serving translations, the event stream.

Serving: ``ResponsesRequest`` (``_request``) and ``input_messages`` turn the
input items into chat messages; ``response_object`` (``_response``) writes a
``ChatResult`` as a ``response``, ``ResponsesEvents`` (``_stream``) as its
server-sent events. Refusals are OpenAI's error shape (``openai_chat``).
mtrl does not call Responses endpoints (a reference model speaks chat
completions, Messages or Converse): no calling side.
"""

from __future__ import annotations

from .._shared import Wire
from ._request import FunctionTool, ResponsesRequest, input_messages
from ._response import output_items, response_events, response_object
from ._stream import ResponsesEvents

WIRE = Wire("openai_responses", ResponsesRequest)

__all__ = ["WIRE", "FunctionTool", "ResponsesEvents", "ResponsesRequest", "input_messages", "output_items",
           "response_events", "response_object"]
