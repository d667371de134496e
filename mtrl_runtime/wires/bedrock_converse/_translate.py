"""Bedrock Converse to and from the capture path's OpenAI shapes.

In: ``system`` becomes a system message; an assistant message's text,
``toolUse`` and ``reasoningContent`` blocks become one assistant message
(content, ``tool_calls``, ``reasoning_content``); a user message's
``toolResult`` blocks become ``tool`` messages (named after the call they
answer) and its text blocks a user message, in block order. A tool result
with ``status: error`` reaches the model as its text, unchanged, and the
flag is recorded (``wires._shared`` says why: the rule every protocol
follows). ``toolConfig`` becomes OpenAI function tools; ``toolChoice``
``auto`` / ``any`` / ``tool`` become ``auto`` / ``required`` / a named
function (``_maps.TOOL_CHOICE``, which the calling side writes with).

Out: the reply's reasoning, text and tool calls as content blocks (in that
order), the stop reason (``tool_use``, ``max_tokens``, ``stop_sequence``,
``end_turn``), token usage and latency, as one JSON body (``converse``;
``converse-stream``'s events are written as the tokens are decoded, by
``_stream``).
"""

from __future__ import annotations

from typing import Any

import orjson

from ...errors import BadRequest, MtrlError
from ...types import ChatOptions, ChatResult
from .._shared import tool_message
from ._maps import FINISH, TOOL_CHOICE, error_type
from ._request import ConverseRequest, ToolResultBlock


def chat_messages(body: ConverseRequest) -> list[dict[str, Any]]:
    """The OpenAI-shaped messages of a Converse request (bad block placement is a 400 naming the block)."""
    out: list[dict[str, Any]] = []
    system = [b.text for b in body.system or () if b.text is not None]
    if system:
        out.append({"role": "system", "content": [{"type": "text", "text": t} for t in system]})
    names: dict[str, str] = {}  # toolUseId -> tool name, for the tool messages that answer them
    for i, message in enumerate(body.messages):
        if message.role == "assistant":
            out.append(_assistant(i, message.content, names))
        else:
            out.extend(_user(i, message.content, names))
    return out


def _assistant(i: int, blocks: list, names: dict[str, str]) -> dict[str, Any]:
    texts, calls, reasoning = [], [], []
    for j, block in enumerate(blocks):
        if block.text is not None:
            texts.append({"type": "text", "text": block.text})
        elif block.toolUse is not None:
            use = block.toolUse
            names[use.toolUseId] = use.name
            arguments = orjson.dumps(use.input).decode()
            function = {"name": use.name, "arguments": arguments}
            calls.append({"id": use.toolUseId, "type": "function", "function": function})
        elif block.reasoningContent is not None:
            reasoning.append(block.reasoningContent.reasoningText.text)
        elif block.toolResult is not None:
            raise BadRequest(f"messages[{i}].content[{j}].toolResult: tool results belong in a user message",
                             param=f"messages.{i}.content.{j}")
    message: dict[str, Any] = {"role": "assistant", "content": texts or None}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    return message


def _user(i: int, blocks: list, names: dict[str, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[dict[str, str]] = []
    for j, block in enumerate(blocks):
        where = f"messages[{i}].content[{j}]"
        if block.text is not None:
            texts.append({"type": "text", "text": block.text})
        elif block.toolResult is not None:
            if texts:
                out.append({"role": "user", "content": texts})
                texts = []
            out.append(_tool_message(block.toolResult, names))
        elif block.toolUse is not None or block.reasoningContent is not None:
            kind = "toolUse" if block.toolUse is not None else "reasoningContent"
            raise BadRequest(f"{where}.{kind}: only assistant messages carry {kind} blocks",
                             param=f"messages.{i}.content.{j}")
    if texts:
        out.append({"role": "user", "content": texts})
    return out


def _tool_message(result: ToolResultBlock, names: dict[str, str]) -> dict[str, Any]:
    parts = [c.text if c.text is not None else orjson.dumps(c.json_value).decode() for c in result.content]
    return tool_message(result.toolUseId, "\n".join(parts), result.status == "error", names.get(result.toolUseId))


def chat_tools(body: ConverseRequest) -> tuple[list[dict[str, Any]] | None, ChatOptions]:
    """OpenAI function tools and the tool choice (``cachePoint`` entries are hints, left out)."""
    config = body.toolConfig
    fields = body.additionalModelRequestFields
    template_kwargs = (fields.chat_template_kwargs if fields else None) or {}
    if config is None:
        return None, ChatOptions(template_kwargs=template_kwargs)
    tools = []
    for tool in config.tools:
        spec = tool.toolSpec
        if spec is None:
            continue
        function: dict[str, Any] = {"name": spec.name}  # keys in OpenAI's order, which templates render as is
        if spec.description is not None:
            function["description"] = spec.description
        function["parameters"] = spec.inputSchema.json_schema
        tools.append({"type": "function", "function": function})
    return tools, TOOL_CHOICE.options(config.toolChoice, template_kwargs=template_kwargs)


def stop_reason(result: ChatResult, body: ConverseRequest, tokenizer: Any) -> str:
    """Bedrock's stop reason for the finished reply."""
    native = FINISH.to_native(result.finish_reason)
    if native != "end_turn":
        return native
    stops = body.inferenceConfig.stopSequences if body.inferenceConfig is not None else None
    if stops:  # only then is the completion decoded again
        text = tokenizer.decode(list(result.generation.completion_ids))
        if any(stop in text for stop in stops):
            return "stop_sequence"
    return "end_turn"


def content_blocks(result: ChatResult) -> list[dict[str, Any]]:
    """The reply as Converse content blocks: reasoning, text, then each tool call (at least one block)."""
    message = result.message
    blocks: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content")
    if reasoning:
        blocks.append({"reasoningContent": {"reasoningText": {"text": reasoning}}})
    if message.get("content"):
        blocks.append({"text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call["function"]
        blocks.append({"toolUse": {"toolUseId": call["id"], "name": function["name"],
                                   "input": orjson.loads(function["arguments"] or "{}")}})
    return blocks or [{"text": ""}]


def usage(result: ChatResult) -> dict[str, int]:
    prompt, completion = len(result.prompt_ids), len(result.generation.completion_ids)
    return {"inputTokens": prompt, "outputTokens": completion, "totalTokens": prompt + completion}


def converse_json(result: ChatResult, stop: str, latency_ms: int) -> bytes:
    """The ``converse`` response body."""
    return orjson.dumps({
        "output": {"message": {"role": "assistant", "content": content_blocks(result)}},
        "stopReason": stop,
        "usage": usage(result),
        "metrics": {"latencyMs": latency_ms},
    })


def error_body(exc: MtrlError) -> tuple[bytes, dict[str, str]]:
    """Bedrock's error shape: the type in ``x-amzn-ErrorType``, the sentence in ``message``.

    A 4xx is final and says so with ``x-should-retry: false``, as every protocol's refusal does; a 5xx may pass.
    """
    headers = {"x-amzn-errortype": error_type(exc.status)}
    if exc.status < 500:
        headers["x-should-retry"] = "false"
    return orjson.dumps({"message": exc.message}), headers


__all__ = ["chat_messages", "error_body", "chat_tools", "content_blocks", "converse_json", "stop_reason", "usage"]
