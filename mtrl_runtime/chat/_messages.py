"""Normalization of OpenAI chat messages and tools into one canonical form.

Agent frameworks send the same conversation in different shapes: Strands
sends content as a list of ``{"type": "text"}`` parts and omits ``content``
on assistant messages that only call tools; LangChain sends ``content: None``
there and adds ``name`` to assistant messages of named agents; both send
tool-call arguments as JSON strings, serialized their own way. The canonical
form makes those equal, so requests can be compared turn to turn and
rendered by any chat template:

- ``{"role": "system" | "user", "content": str}`` ("developer" becomes "system");
- ``{"role": "assistant", "content": str, "tool_calls": [...], "reasoning_content": str}``
  (``tool_calls`` and ``reasoning_content`` only when there are some; each ``{"id"?, "type": "function", "function":
  {"name": str, "arguments": dict | str}}``, arguments parsed from JSON when
  they hold an object, else kept as the string sent);
- ``{"role": "tool", "content": str, "tool_call_id"?: str, "name"?: str, "status"?: "error"}``
  (``status`` only for a result flagged failed: the Anthropic translator sets it for ``is_error``, the
  Bedrock one for ``status: error``, and a tool message sent with it keeps it; kept so the stored turn shows
  it, hidden from the chat template (``ChatRenderer.render``), not part of ``message_key``).

Normalizing a canonical list returns an equal list.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

_ROLE_ALIASES = {"developer": "system"}
_ROLES = ("assistant", "developer", "system", "tool", "user")
_TEXT_PART_TYPES = ("text", "input_text", "output_text")


def normalize_messages(messages: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Canonical copies of OpenAI chat messages; bad input raises ``ValueError`` naming the message index."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
        raise ValueError(f"messages must be a list of message objects, got {type(messages).__name__}")
    return [_normalize_message(i, m) for i, m in enumerate(messages)]


def normalize_tools(tools: Iterable[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Canonical copies of OpenAI tool definitions (``{"type": "function", "function": {...}}``)."""
    out = []
    for i, tool in enumerate(tools or ()):
        if not isinstance(tool, Mapping):
            raise ValueError(f"tools[{i}] must be an object, got {type(tool).__name__}")
        kind = tool.get("type", "function")
        fn = tool.get("function")
        if kind != "function" or not isinstance(fn, Mapping):
            raise ValueError(f"tools[{i}]: only function tools are supported, got type {kind!r}")
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise ValueError(f"tools[{i}].function.name must be a non-empty string, got {fn.get('name')!r}")
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if v is not None}})
    return out


# an assistant message's fields with content the policy's format has no place for: dropped, the history
# would render as something the agent never said
_UNREAD_ASSISTANT_FIELDS = {
    "refusal": "send the refusal's text as content",
    "function_call": "send it as tool_calls (the legacy functions API is not read)",
    "audio": "send its transcript as content",
}


def message_key(message: Mapping[str, Any]) -> tuple:
    """What must be equal for two canonical messages to count as the same turn.

    Ignores what clients change on echo without changing the conversation:
    tool-call ids, ``name`` fields, and (since arguments are parsed) the
    spacing and key order of JSON arguments; normalization has already made
    ``None``, missing and ``""`` content equal. Text is compared exactly.
    """
    # parsed arguments compare as dicts: key order and spacing do not matter
    calls = tuple((tc["function"]["name"], tc["function"]["arguments"]) for tc in message.get("tool_calls") or ())
    return (message["role"], message["content"], calls)


def _normalize_message(index: int, message: Any) -> dict[str, Any]:
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise ValueError(f"{where} must be an object, got {type(message).__name__}")
    role = message.get("role")
    if role not in _ROLES:
        raise ValueError(f"{where}.role: unknown role {role!r}; expected one of {', '.join(_ROLES)}")
    role = _ROLE_ALIASES.get(role, role)
    out: dict[str, Any] = {"role": role, "content": _content_text(where, message.get("content"))}
    if role == "assistant":
        for key, hint in _UNREAD_ASSISTANT_FIELDS.items():
            if message.get(key):  # None, [] and "" are what clients echo when the model did not use them
                raise ValueError(f"{where}.{key}: {message[key]!r} is not read (the policy speaks text and "
                                 f"tool calls); {hint}")
        calls = [_normalize_tool_call(f"{where}.tool_calls[{j}]", tc) for j, tc in enumerate(message.get("tool_calls") or ())]
        if calls:
            out["tool_calls"] = calls
        reasoning = message.get("reasoning_content")
        if isinstance(reasoning, str) and reasoning:  # rendered by templates that keep it; not part of message_key
            out["reasoning_content"] = reasoning
    elif role == "tool":
        for key in ("tool_call_id", "name"):
            if isinstance(message.get(key), str):
                out[key] = message[key]
        if message.get("status") == "error":
            out["status"] = "error"
    return out


def _content_text(where: str, content: Any) -> str:
    """Content as one string: parts of a list are joined with newlines; only text parts are allowed."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):  # a single part sent without its list
        content = [content]
    if not isinstance(content, (list, tuple)):
        raise ValueError(f"{where}.content must be a string, null or a list of parts, got {type(content).__name__}")
    texts = []
    for j, part in enumerate(content):
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type", "text") if isinstance(part, Mapping) else type(part).__name__
        if kind not in _TEXT_PART_TYPES:
            raise ValueError(
                f"{where}.content[{j}]: content part of type {kind!r} is not supported; "
                "the policy endpoint is text-only (send text parts)"
            )
        if not isinstance(part.get("text"), str):
            raise ValueError(f"{where}.content[{j}]: a text part needs a string 'text', got {part.get('text')!r}")
        texts.append(part["text"])
    return "\n".join(texts)


def _normalize_tool_call(where: str, call: Any) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise ValueError(f"{where} must be {{'type': 'function', 'function': {{'name': str, 'arguments': ...}}}}, got {call!r}")
    out: dict[str, Any] = {"type": "function", "function": {"name": fn["name"], "arguments": _parse_arguments(fn.get("arguments"))}}
    if call.get("id") is not None:
        out["id"] = call["id"]
    return out


def _parse_arguments(arguments: Any) -> Any:
    """A dict when ``arguments`` is (or holds as JSON) an object; otherwise the value as sent."""
    if arguments is None or arguments == "":
        return {}
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return dict(arguments) if isinstance(arguments, Mapping) else arguments


__all__ = ["message_key", "normalize_messages", "normalize_tools"]
