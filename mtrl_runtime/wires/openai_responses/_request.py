"""OpenAI Responses requests: the strict body schema, and input items as OpenAI chat messages.

Known fields are validated (a wrong JSON type is refused, never coerced; the
error names the field and the value); fields clients send that change
nothing here are accepted and ignored. What mtrl cannot honour is refused
with a 400 naming the field: custom (freeform) tools, images, files and audio,
``background``, ``conversation``, stored ``prompt`` templates, item
references.

Tools: ``function`` tools as they are; a ``namespace`` tool's functions as
``<namespace>.<name>`` (OpenAI function names cannot hold a dot, so the name
splits back without ambiguity: a ``function_call`` carries ``namespace``
and ``name`` again, and an input ``function_call`` with a ``namespace`` is
read back the same way). Hosted tools (``web_search``, ``file_search``,
``code_interpreter``, ...: run by OpenAI's servers, which mtrl is not) are
accepted and not offered to the policy: Codex CLI declares ``web_search`` on
every call. The coordinator counts them on the rollout
(``hosted_tools_unserved``) so a run says what its policy was not offered.

Input items become chat messages: ``message`` items (roles user, system,
developer, assistant) keep their text; ``reasoning``, an assistant
``message`` and the ``function_call`` items that follow one reply become one
assistant message (``reasoning_content``, ``content``, ``tool_calls``);
``function_call_output`` becomes a ``tool`` message.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ...errors import BadRequest
from ...types import ChatOptions
from ...validation import describe_error, error_field
from .._shared import string_field
from ._maps import TOOL_CHOICE


NAMESPACE_SEPARATOR = "."  # a namespace's function as the policy sees it: "<namespace>.<name>"
# tools OpenAI's servers run themselves: accepted, not offered to the policy (see the module docstring)
HOSTED_TOOLS = ("web_search", "web_search_preview", "web_search_preview_2025_03_11", "file_search", "code_interpreter",
                "computer_use_preview", "computer_use", "image_generation", "mcp", "local_shell", "shell", "apply_patch",
                "tool_search")


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def chat_tools(self) -> list[dict[str, Any]]:
        return [self.chat_tool()]

    def chat_tool(self, namespace: str | None = None) -> dict[str, Any]:
        name = self.name if namespace is None else f"{namespace}{NAMESPACE_SEPARATOR}{self.name}"
        fn: dict[str, Any] = {"name": name}
        if self.description is not None:
            fn["description"] = self.description
        fn["parameters"] = self.parameters if self.parameters is not None else {"type": "object", "properties": {}}
        return {"type": "function", "function": fn}


class NamespaceTool(BaseModel):
    """Function tools grouped under a name (Codex CLI's sub-agent tools): offered as ``<namespace>.<name>``."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["namespace"]
    name: str = Field(min_length=1, max_length=256, pattern=r"^[^.]+$")
    description: str | None = None
    tools: list[FunctionTool]

    def chat_tools(self) -> list[dict[str, Any]]:
        return [tool.chat_tool(self.name) for tool in self.tools]


class HostedTool(BaseModel):
    """A tool OpenAI's servers run (``HOSTED_TOOLS``): accepted, never offered to the policy."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: str

    def chat_tools(self) -> list[dict[str, Any]]:
        return []


TOOL_KINDS: dict[str, type[FunctionTool] | type[NamespaceTool] | type[HostedTool]] = {
    "function": FunctionTool, "namespace": NamespaceTool, **{kind: HostedTool for kind in HOSTED_TOOLS},
}


def parse_tool(raw: dict[str, Any], where: str) -> FunctionTool | NamespaceTool | HostedTool:
    """One ``tools`` entry by its type (``TOOL_KINDS``); a 400 naming ``<where>.<field>`` and the value."""
    kind = raw.get("type")
    model = TOOL_KINDS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise BadRequest(
            f"{where}.type: {kind!r} tools are not supported; mtrl takes function and namespace tools, and accepts "
            f"(without offering them to the policy) the hosted {', '.join(HOSTED_TOOLS)}", param=f"{where}.type",
        )
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise BadRequest(describe_error(first, under=where), param=error_field(first, under=where)) from None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # no "yes" read as true, no true as 1

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None  # each parsed by its type (``parse_tool``)
    tool_choice: str | dict[str, Any] | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = Field(default=None, min_length=1)
    parallel_tool_calls: bool | None = None
    metadata: dict[str, Any] | None = None
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    seed: int | None = None  # mtrl extension, as on chat completions (the rollout's sampling seed)
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM / SGLang extension, as on chat completions

    @model_validator(mode="after")
    def _refused(self) -> "ResponsesRequest":
        if self.background:
            raise ValueError("background: true is not supported (responses are answered in the request); send background false")
        if self.conversation is not None:
            raise ValueError(
                f"conversation: conversations are not supported (got {self.conversation!r:.80}); "
                "continue with previous_response_id or send the whole input"
            )
        if self.prompt is not None:
            raise ValueError(f"prompt: stored prompt templates are not supported (got {self.prompt!r:.80}); send instructions and input")
        if isinstance(self.tool_choice, str) and self.tool_choice not in ("auto", "none", "required"):
            raise ValueError(f"tool_choice must be 'auto', 'none', 'required' or a function object, got {self.tool_choice!r}")
        return self

    def options(self) -> ChatOptions:
        """The call's options: the tool choice as the coordinator takes it (``TOOL_CHOICE``; ``"none"`` is applied by
        dropping the tools), the hosted tools it is not offered, the model it named
        (``advanced.server.background_models``) and its family."""
        return TOOL_CHOICE.options(self.tool_choice, template_kwargs=self.chat_template_kwargs or {},
                                   unserved_tools=self.hosted_tools, model=self.model, protocol="openai")

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """The tools offered to the policy: functions, and namespaces' functions as ``<namespace>.<name>``."""
        if not self.tools:
            return None
        return [chat for i, raw in enumerate(self.tools) for chat in parse_tool(raw, f"tools.{i}").chat_tools()]

    @property
    def hosted_tools(self) -> tuple[str, ...]:
        """The hosted tools this call declared, which the policy is not offered."""
        kinds = (raw.get("type") for raw in self.tools or ())
        return tuple(kind for kind in kinds if isinstance(kind, str) and TOOL_KINDS.get(kind) is HostedTool)


_TEXT_PARTS = ("input_text", "output_text", "text")
_MESSAGE_ROLES = ("user", "system", "developer", "assistant")


def input_messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request's input as OpenAI chat messages (see the module docstring); bad items are 400s naming them."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    out: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant message being assembled from one reply's items

    def close() -> None:
        nonlocal turn
        if turn is not None:
            out.append(turn)
            turn = None

    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in _MESSAGE_ROLES:
                raise BadRequest(f"{where}.role: expected one of {', '.join(_MESSAGE_ROLES)}, got {role!r}", param=f"{where}.role")
            text = _text(item.get("content"), f"{where}.content")
            if role != "assistant":
                close()
                out.append({"role": role, "content": text})
                continue
            if turn is not None and (turn["content"] is not None or "tool_calls" in turn):
                close()
            turn = turn or {"role": "assistant", "content": None}
            turn["content"] = text
        elif kind == "reasoning":
            close()
            turn = {"role": "assistant", "content": None}
            reasoning = _reasoning_text(item, where)
            if reasoning:
                turn["reasoning_content"] = reasoning
        elif kind == "function_call":
            call_id, name, arguments = (string_field(item, key, where) for key in ("call_id", "name", "arguments"))
            if item.get("namespace") is not None:
                name = f"{string_field(item, 'namespace', where)}{NAMESPACE_SEPARATOR}{name}"
            turn = turn or {"role": "assistant", "content": None}
            turn.setdefault("tool_calls", []).append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            )
        elif kind == "function_call_output":
            close()
            call_id = string_field(item, "call_id", where)
            output = item.get("output")
            text = output if isinstance(output, str) else _text(output, f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": text})
        elif kind == "item_reference":
            raise BadRequest(
                f"{where}: item_reference ({item.get('id')!r}) is not supported; send the item itself, "
                "or continue from a response with previous_response_id",
                param=f"{where}.type",
            )
        else:
            raise BadRequest(
                f"{where}.type: {kind!r} items are not supported; mtrl takes message, reasoning, function_call "
                "and function_call_output items (function tools only)",
                param=f"{where}.type",
            )
    close()
    return out


def _text(content: Any, where: str) -> str:
    """Message content (a string or text parts) as one string; images, files and audio are refused."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"{where}: expected a string or a list of content parts, got {content!r:.80}", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise BadRequest(
                f"{where}[{j}]: {kind} parts are not supported: the policy mtrl serves reads text only; "
                "send the content as input_text",
                param=f"{where}[{j}].type",
            )
        else:
            raise BadRequest(f"{where}[{j}]: expected a text part ({', '.join(_TEXT_PARTS)}), got {part!r:.80}", param=f"{where}[{j}]")
    return "\n".join(texts)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    """A reasoning item's text: its ``content`` (reasoning_text parts) or else its ``summary`` texts."""
    for key, part_type in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts is None:
            continue
        if not isinstance(parts, list):
            raise BadRequest(f"{where}.{key}: expected a list of {part_type} parts, got {parts!r:.80}", param=f"{where}.{key}")
        texts = []
        for j, part in enumerate(parts):
            if not isinstance(part, dict) or not isinstance(part.get("text"), str):
                raise BadRequest(f"{where}.{key}[{j}]: expected a {part_type} part with text, got {part!r:.80}",
                                 param=f"{where}.{key}[{j}]")
            texts.append(part["text"])
        if texts:
            return "\n".join(texts)
    if item.get("encrypted_content"):
        raise BadRequest(
            f"{where}.encrypted_content: encrypted reasoning cannot be read back into the policy's prompt; "
            "send the reasoning as content or summary text",
            param=f"{where}.encrypted_content",
        )
    return ""


__all__ = ["FunctionTool", "HOSTED_TOOLS", "HostedTool", "NAMESPACE_SEPARATOR", "NamespaceTool", "ResponsesRequest",
           "TOOL_KINDS", "input_messages", "parse_tool"]
