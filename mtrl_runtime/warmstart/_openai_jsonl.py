"""OpenAI-format conversation JSONL, as OpenAI's chat fine-tuning takes it: one conversation per line.

Each line is ``{"messages": [...], "tools": [...], "parallel_tool_calls": bool}``
(``tools`` and ``parallel_tool_calls`` optional): ``system`` / ``developer`` /
``user`` / ``assistant`` / ``tool`` messages, assistant ``tool_calls`` with
JSON-string ``arguments``, ``tool`` results answering them by
``tool_call_id``. An assistant message's ``"weight": 0`` leaves it out of the
loss (it is still rendered as context), as in OpenAI's format. Blank lines
are skipped. Anything else (a legacy ``functions`` line, a preference-format
line, an unknown key, a malformed message) is a ValueError naming the file,
the line number and the field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from ..chat import normalize_messages, normalize_tools
from ._conversation import Conversation

_KEYS = ("messages", "tools", "parallel_tool_calls")
_HINTS = {
    "functions": "the legacy 'functions' field is not read; write the functions as 'tools' "
    "([{\"type\": \"function\", \"function\": {...}}]) and calls as assistant 'tool_calls'",
    "input": "this is a preference (DPO) line; mtrl sft reads chat lines: {\"messages\": [...]}",
    "prompt": "this is a legacy completion line; mtrl sft reads chat lines: {\"messages\": [...]}",
}


def load(path: Path | str) -> list[Conversation]:
    """Every conversation in the JSONL file ``path``; a ValueError naming the line and field of the first bad one."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--conversations: no such file {str(path)!r}")
    conversations = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc})") from None
            conversations.append(parse_record(record, where))
    if not conversations:
        raise ValueError(f"{path}: holds no conversation (expected one JSON object per line)")
    return conversations


def parse_record(record: Any, where: str) -> Conversation:
    """One line's object as a ``Conversation`` (``source`` = ``where``); a ValueError naming ``where`` and the field."""
    if not isinstance(record, Mapping):
        raise ValueError(f"{where}: expected a JSON object {{\"messages\": [...]}}, got {type(record).__name__}")
    for key in record:
        if key not in _KEYS:
            hint = _HINTS.get(key, f"known keys: {', '.join(_KEYS)}")
            raise ValueError(f"{where}: unknown key {key!r}; {hint}")
    messages = record.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError(f"{where}: messages must be a non-empty list of message objects, got {messages!r}")
    tools = record.get("tools") or []
    if not isinstance(tools, list):
        raise ValueError(f"{where}: tools must be a list of tool objects, got {type(tools).__name__}")
    try:
        normalize_tools(tools)
        canonical = normalize_messages(messages)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None
    _check_weights(messages, where)
    _check_tool_results(canonical, where)
    if not any(m["role"] == "assistant" for m in canonical):
        raise ValueError(f"{where}: messages has no assistant message; there is nothing to learn from")
    return Conversation(messages=tuple(messages), tools=tuple(tools), source=where)


def _check_weights(messages: list[Any], where: str) -> None:
    for i, message in enumerate(messages):
        if "weight" not in message:
            continue
        if message.get("role") != "assistant":
            raise ValueError(f"{where}: messages[{i}].weight: only assistant messages take a weight")
        if message["weight"] not in (0, 1) or isinstance(message["weight"], bool):
            raise ValueError(f"{where}: messages[{i}].weight must be 0 or 1, got {message['weight']!r}")


def _check_tool_results(messages: list[dict[str, Any]], where: str) -> None:
    """Each tool message answers a call of an assistant message before it (by ``tool_call_id`` when both have ids)."""
    open_ids: set[str] = set()
    calls_seen = False
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            calls = message.get("tool_calls") or ()
            for j, call in enumerate(calls):
                args = call["function"]["arguments"]
                if not isinstance(args, dict):
                    raise ValueError(f"{where}: messages[{i}].tool_calls[{j}].function.arguments must be a JSON "
                                     f"object (as a string), got {args!r}")
            calls_seen = calls_seen or bool(calls)
            open_ids |= {str(c["id"]) for c in calls if "id" in c}
        elif message["role"] == "tool":
            if not calls_seen:
                raise ValueError(f"{where}: messages[{i}] is a tool result, but no assistant message before it "
                                 "called a tool")
            call_id = message.get("tool_call_id")
            if call_id is not None and open_ids and call_id not in open_ids:
                raise ValueError(f"{where}: messages[{i}].tool_call_id {call_id!r} answers no tool call before it "
                                 f"(calls: {', '.join(sorted(open_ids))})")


__all__ = ["load", "parse_record"]
