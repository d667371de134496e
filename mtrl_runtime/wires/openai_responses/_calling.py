"""Calling an OpenAI Responses endpoint (a reference model, a judge): ``POST <url>/responses``.

``url`` is the ``.../v1`` base OpenAI clients take. Chat messages become
input items: the leading system messages the ``instructions``; user,
system and developer messages ``message`` items; an assistant message its
text as a ``message`` item and a ``function_call`` item per call; each tool
result a ``function_call_output`` item (Responses has no failure flag: the
result is its text). A function named ``<namespace>.<name>`` (how the
serving side offers a ``namespace`` tool's functions, ``_request``) goes back
as that namespace: its tool grouped under a ``namespace`` tool, its calls
with ``namespace`` and ``name`` apart. Sampling: ``max_output_tokens``, ``temperature``,
``top_p``; the API takes no stop sequences and no seed, so a reference behind
it samples without them. ``store: false``: the provider keeps nothing, each
call sends the whole conversation. Reasoning is not sent back (OpenAI's
reasoning items carry ids and encrypted content chat messages do not keep).
The reply's ``reasoning`` items become ``reasoning_content``; an incomplete
response's reason its finish reason (``_maps``). The key goes as
``Authorization: Bearer``.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...types import ChatOptions, SamplingParams
from .._shared import (
    ReferenceReply, AssistantBlocks, arguments_object, arguments_text, call_name, reply_list, system_field, tool_call,
    tool_fields,
)
from ..openai_chat import OpenAIChatWire
from ._maps import INCOMPLETE, TOOL_CHOICE
from ._request import NAMESPACE_SEPARATOR


class OpenAIResponsesWire(OpenAIChatWire):
    """``POST <url>/responses``; the model list and the key as chat completions has them (the same ``.../v1``)."""

    chat_path = "/responses"

    def request_body(self, model: str, messages: list[dict[str, Any]], tools: list[Mapping[str, Any]],
                     sampling: SamplingParams, options: ChatOptions) -> dict[str, Any]:
        # an assistant turn with neither text nor calls is no item, so it does not end the leading system messages
        written = [m for m in messages if m["role"] != "assistant" or m.get("content") or m.get("tool_calls")]
        instructions, conversation = system_field("instructions", written, leading=True)
        items: list[dict[str, Any]] = []
        for message in conversation:
            role = message["role"]
            if role == "assistant":
                if message.get("content"):
                    items.append({"type": "message", "role": "assistant", "content": message["content"]})
                items += [{"type": "function_call", "call_id": call.get("id"), **_named(call["function"]["name"]),
                           "arguments": arguments_text(call["function"]["arguments"])}
                          for call in message.get("tool_calls") or ()]
            elif role == "tool":
                items.append({"type": "function_call_output", "call_id": message.get("tool_call_id"),
                              "output": message.get("content") or ""})
            else:
                items.append({"type": "message", "role": role, "content": message.get("content") or ""})
        return {"model": model, "input": items, "max_output_tokens": sampling.max_tokens,
                "temperature": sampling.temperature, "top_p": sampling.top_p, "store": False, **instructions,
                **tool_fields(_tools(tools), TOOL_CHOICE, options)}

    def parse_reply(self, payload: Any) -> ReferenceReply:
        """A ``response`` object: its message, reasoning and function_call items, and how it ended."""
        read = AssistantBlocks()
        for i, item in enumerate(reply_list(payload, "output")):
            kind = item.get("type") if isinstance(item, Mapping) else None
            if kind == "message":
                read.texts += [str(p.get("text", "")) for p in item.get("content") or ()
                               if isinstance(p, Mapping) and p.get("type") == "output_text"]
            elif kind == "reasoning":
                parts = item.get("content") or item.get("summary") or ()
                read.thoughts += [str(p.get("text", "")) for p in parts if isinstance(p, Mapping)]
            elif kind == "function_call":
                name = call_name(item, f"output[{i}] (function_call)")
                if item.get("namespace") is not None:
                    name = f"{item['namespace']}{NAMESPACE_SEPARATOR}{name}"
                read.calls.append(tool_call(str(item.get("call_id") or f"call_{i}"), name,
                                            arguments_object(item.get("arguments") or "{}")))
        details = payload.get("incomplete_details")
        reason = details.get("reason") if payload.get("status") == "incomplete" and isinstance(details, Mapping) \
            else payload.get("status") or "completed"  # not in the table: tool_calls or stop
        return read.reply(reason, INCOMPLETE)


def _named(name: str) -> dict[str, str]:
    """A function's name as Responses carries it: ``name``, or ``namespace`` and ``name`` for ``<namespace>.<name>``."""
    namespace, dot, rest = name.partition(NAMESPACE_SEPARATOR)
    return {"namespace": namespace, "name": rest} if dot else {"name": name}


def _tools(tools: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Function tools, those named ``<namespace>.<name>`` grouped under their ``namespace`` tool (in first-seen order)."""
    out: list[dict[str, Any]] = []
    namespaces: dict[str, dict[str, Any]] = {}
    for tool in tools:
        fn = tool.get("function") or {}
        named = _named(str(fn.get("name")))
        function: dict[str, Any] = {"type": "function", "name": named["name"]}
        if fn.get("description"):
            function["description"] = fn["description"]
        function["parameters"] = fn.get("parameters") or {"type": "object", "properties": {}}
        if "namespace" not in named:
            out.append(function)
        elif named["namespace"] in namespaces:
            namespaces[named["namespace"]]["tools"].append(function)
        else:
            namespaces[named["namespace"]] = {"type": "namespace", "name": named["namespace"], "tools": [function]}
            out.append(namespaces[named["namespace"]])
    return out


__all__ = ["OpenAIResponsesWire"]
