"""Anthropic Messages requests: the strict body schema, and content blocks as OpenAI chat messages.

Known fields are validated (a wrong JSON type is refused, never coerced; the
error names the field and the value); fields the SDKs send that change
nothing here (``metadata``, ``service_tier``, ``cache_control`` on blocks,
``disable_parallel_tool_use``) are accepted and ignored. Refused with a 400
naming the field: image, document and other non-text blocks, server tools
(only custom tools with an ``input_schema``), ``redacted_thinking`` blocks,
``top_k``, and an assistant message last (a prefill: the policy answers
whole turns).

Blocks become chat messages: ``system`` the system message; a user
message's text blocks a user message and each ``tool_result`` a ``tool``
message (in block order); an assistant message's ``thinking`` blocks its
``reasoning_content``, its text blocks its content, each ``tool_use`` a tool
call (``input`` as JSON arguments, ``id`` as the call id). A
``tool_result`` with ``is_error: true`` reaches the model as its text,
unchanged, and the flag is recorded (``wires._shared`` says why: the rule
every protocol follows); an ``is_error`` that is not a boolean is refused.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ...errors import BadRequest
from ...types import ChatOptions
from .._shared import AssistantBlocks, prefill_refused, string_field, tool_message
from ._maps import TOOL_CHOICE


class CustomTool(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None

    def chat_tool(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = self.input_schema
        return {"type": "function", "function": fn}


class MessageParam(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["user", "assistant", "system"]  # system: Claude Code sends reminders inside messages
    content: str | list[dict[str, Any]]


class ThinkingConfig(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)


class ToolChoice(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # no "yes" read as true, no true as 1

    model: str | None = None
    max_tokens: int = Field(ge=1)
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[CustomTool] | None = None
    tool_choice: ToolChoice | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    stop_sequences: list[str] | None = Field(default=None, max_length=16)
    stream: bool = False
    metadata: dict[str, Any] | None = None
    thinking: ThinkingConfig | None = None
    seed: int | None = None  # mtrl extension, as on chat completions (the rollout's sampling seed)
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM / SGLang extension, as on chat completions

    @model_validator(mode="after")
    def _refused(self) -> "MessagesRequest":
        if self.top_k is not None:
            raise ValueError(f"top_k: not supported (got {self.top_k}); the policy samples with temperature and top_p only")
        if self.tool_choice is not None and self.tool_choice.type == "tool" and not self.tool_choice.name:
            raise ValueError("tool_choice: type 'tool' needs the tool's name")
        if any(not s for s in self.stop_sequences or ()):
            raise ValueError("stop_sequences must not hold empty strings")
        return self

    def options(self) -> ChatOptions:
        """The call's options: template variables (``thinking`` enabled or disabled sets ``enable_thinking``), the
        tool choice (``TOOL_CHOICE``), the model it named (``advanced.server.background_models``) and its family."""
        kwargs = dict(self.chat_template_kwargs or {})
        if self.thinking is not None and self.thinking.type != "adaptive":
            kwargs.setdefault("enable_thinking", self.thinking.type == "enabled")
        return TOOL_CHOICE.options(self.tool_choice, template_kwargs=kwargs, model=self.model, protocol="anthropic")


def chat_messages(body: MessagesRequest) -> list[dict[str, Any]]:
    """The request's system prompt and messages as OpenAI chat messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if body.system is not None:
        system = body.system if isinstance(body.system, str) else _texts(body.system, "system")
        if system:
            out.append({"role": "system", "content": system})
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        if message.role == "user":
            out.extend(_user(message.content, where))
        elif message.role == "system":  # kept where it was sent, as the chat format renders a system message there
            text = message.content if isinstance(message.content, str) else _texts(message.content, f"{where}.content")
            out.append({"role": "system", "content": text})
        else:
            out.append(_assistant(message.content, where))
    if body.messages[-1].role == "assistant":
        raise prefill_refused(f"messages[{len(body.messages) - 1}]", "the last message is the assistant's",
                              "a user message")
    return out


def _user(content: str | list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type")
        if kind == "text":
            texts.append(string_field(block, "text", at))
        elif kind == "tool_result":
            if texts:
                out.append({"role": "user", "content": "\n".join(texts)})
                texts = []
            result = block.get("content", "")
            text = result if isinstance(result, str) else _texts(result, f"{at}.content")
            failed = block.get("is_error") or False  # absent or null: not flagged
            if not isinstance(failed, bool):
                raise BadRequest(f"{at}.is_error: expected true or false, got {failed!r:.80}", param=f"{at}.is_error")
            out.append(tool_message(string_field(block, "tool_use_id", at), text, failed))
        else:
            raise _unsupported(kind, at)
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _assistant(content: str | list[dict[str, Any]], where: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    turn = AssistantBlocks()
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type")
        if kind == "text":
            turn.texts.append(string_field(block, "text", at))
        elif kind == "thinking":
            turn.thoughts.append(string_field(block, "thinking", at))
        elif kind == "tool_use":
            arguments = block.get("input")
            if not isinstance(arguments, dict):
                raise BadRequest(f"{at}.input: expected an object, got {arguments!r:.80}", param=f"{at}.input")
            name = string_field(block, "name", at)
            turn.calls.append({"id": string_field(block, "id", at), "type": "function",
                               "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}})
        elif kind == "redacted_thinking":
            raise BadRequest(
                f"{at}: redacted_thinking blocks cannot be read back into the policy's prompt (they are encrypted); "
                "drop them or send the thinking as text",
                param=f"{at}.type",
            )
        else:
            raise _unsupported(kind, at)
    return turn.message()


def _texts(blocks: Any, where: str) -> str:
    """Text blocks as one string; anything else is refused naming the block."""
    if not isinstance(blocks, list):
        raise BadRequest(f"{where}: expected a string or a list of text blocks, got {blocks!r:.80}", param=where)
    texts = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise _unsupported(kind, f"{where}[{j}]")
        texts.append(string_field(block, "text", f"{where}[{j}]"))
    return "\n".join(texts)


def _unsupported(kind: Any, where: str) -> BadRequest:
    if kind in ("image", "document"):
        return BadRequest(
            f"{where}: {kind} blocks are not supported: the policy mtrl serves reads text only; send the content as text",
            param=f"{where}.type",
        )
    return BadRequest(
        f"{where}.type: {kind!r} blocks are not supported here; mtrl takes text, tool_use, tool_result and thinking blocks",
        param=f"{where}.type",
    )


__all__ = ["CustomTool", "MessagesRequest", "chat_messages"]
