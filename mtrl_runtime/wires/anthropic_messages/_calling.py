"""Calling an Anthropic Messages endpoint (a reference model, a judge): ``POST <url>/v1/messages`` (``url``: https://api.anthropic.com).

Chat messages become Messages content blocks: system messages the
``system`` prompt; an assistant message its text and a ``tool_use`` block
per call (arguments as the ``input`` object); each tool result a
``tool_result`` block (``is_error`` when the agent flagged it) in a user
message; consecutive blocks of one role share one message, as the API
requires, and empty text is left out (the API refuses empty text blocks).
Sampling: ``max_tokens``, ``temperature``, ``top_p`` (only below 1: newer
models refuse both at once), ``stop_sequences``; the API takes no seed, so
a reference behind it samples without the plan's seeds. The reply's
``thinking`` blocks become ``reasoning_content`` and are not sent back in
later calls (the API needs their signatures, which chat messages do not
carry). The key goes as ``x-api-key``, with ``anthropic-version``.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...types import ChatOptions, SamplingParams
from .._shared import (
    DeclaredEndpoint, ReferenceReply, AssistantBlocks, append_blocks, arguments_object, call_name, reply_list,
    sampling_fields, system_field, tool_call, tool_fields,
)
from ._maps import API_VERSION, FINISH, TOOL_CHOICE


class AnthropicMessagesWire(DeclaredEndpoint):
    """``POST <url>/v1/messages``; the model list at ``<url>/v1/models``."""

    chat_path = "/v1/messages"
    models_path = "/v1/models"
    key_header = "x-api-key"
    fixed_headers = (("anthropic-version", API_VERSION),)

    def request_body(self, model: str, messages: list[dict[str, Any]], tools: list[Mapping[str, Any]],
                     sampling: SamplingParams, options: ChatOptions) -> dict[str, Any]:
        system, conversation = system_field("system", messages)
        turns: list[dict[str, Any]] = []
        for message in conversation:
            role = message["role"]
            if role == "assistant":
                blocks = _text_blocks(message.get("content"))
                blocks += [{"type": "tool_use", "id": call.get("id"), "name": call["function"]["name"],
                            "input": arguments_object(call["function"]["arguments"])}
                           for call in message.get("tool_calls") or ()]
                append_blocks(turns, "assistant", blocks)
            elif role == "tool":
                block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.get("tool_call_id"),
                                         "content": message.get("content") or ""}
                if message.get("status") == "error":
                    block["is_error"] = True
                append_blocks(turns, "user", [block])
            else:
                append_blocks(turns, "user", _text_blocks(message.get("content")))
        sampled = sampling_fields(sampling, max_tokens="max_tokens", temperature="temperature", top_p="top_p",
                                  stop="stop_sequences")
        return {"model": model, "messages": turns, **sampled, **system,
                **tool_fields([_tool(t) for t in tools], TOOL_CHOICE, options)}

    def parse_reply(self, payload: Any) -> ReferenceReply:
        """A Messages ``message`` object: its text, thinking and tool_use blocks."""
        read = AssistantBlocks()
        for i, block in enumerate(reply_list(payload, "content")):
            kind = block.get("type") if isinstance(block, Mapping) else None
            if kind == "text":
                read.texts.append(str(block.get("text", "")))
            elif kind == "thinking":
                read.thoughts.append(str(block.get("thinking", "")))
            elif kind == "tool_use":
                name = call_name(block, f"content[{i}] (tool_use)")
                read.calls.append(tool_call(str(block.get("id") or f"toolu_{i}"), name, block.get("input")))
        return read.reply(payload.get("stop_reason"), FINISH)


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    return [{"type": "text", "text": content}] if isinstance(content, str) and content else []


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    fn = tool.get("function") or {}
    out: dict[str, Any] = {"name": fn.get("name"), "input_schema": fn.get("parameters") or {"type": "object"}}
    if fn.get("description"):
        out["description"] = fn["description"]
    return out


__all__ = ["AnthropicMessagesWire"]
