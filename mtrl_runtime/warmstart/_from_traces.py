"""What the trace importers share: OpenAI-format messages from what a trace records, and one conversation per dialogue.

A trace records model calls, not conversations: each chat call holds the
messages it was sent and the reply it got. ``Call`` is one of them (request
+ one reply); ``assemble`` makes conversations of the calls of many traces:

- inside a trace, a call whose messages + reply are the beginning of a
  later call's (the agent's earlier turns; the same call recorded twice, by
  a framework's span and the client's under it) is part of that call's
  conversation; what remains is one conversation per dialogue (the last
  chat call carries the whole history; a history the agent rewrote, or a
  second agent, stays a conversation of its own);
- a trace whose one chat call is its root span (a client autologged
  without an enclosing span writes one trace per call) is merged the same
  way into a longer conversation of another trace that it begins; a trace
  with an enclosing span (an agent's, mtrl's rollout) is a whole episode
  and is kept as it is.

A call merged into a longer one gives it what only the call itself
recorded about its reply: that the token limit cut it (the later call's
history cannot say), and its ``reasoning_content`` where the later copy
dropped it (many clients echo a reply without its reasoning).

Each kept conversation is checked as OpenAI's fine-tuning format is
(``_openai_jsonl.parse_record``) and named by its ``source``. ``assemble``
prints one line to stderr saying how many conversations came from how many
traces, how many calls were merged, which traces held no chat call (they
are skipped: an experiment holds other traces too) or were left out (the
importer says why), how many replies were cut at the token limit, and how
many conversations offer no tools.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

from ..chat import message_key, normalize_messages, normalize_tools
from ._conversation import Conversation
from ._openai_jsonl import parse_record

_NAMED = 5  # skipped traces named in the summary line
_MESSAGE_INDEX = re.compile(r"\bmessages\[(\d+)\]")


@dataclass(frozen=True)
class Call:
    """One recorded chat call: the messages it was sent plus one reply, the tools offered, and where it is."""

    trace_id: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    source: str
    root: bool = False  # the call's span is its trace's root: the trace is this one call, not an episode
    cut: bool = False  # the model's token limit cut the reply (finish_reason "length")
    reward: float | None = None  # the reward the trace records for its episode (an mtrl rollout's)
    origins: tuple[str, ...] = ()  # per message, the trace field it was rebuilt from (errors name it)


def tool_call(call_id: Any, name: Any, arguments: Any) -> dict[str, Any]:
    """An OpenAI assistant ``tool_calls`` entry; ``arguments`` as the JSON string the format carries."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)
    call: dict[str, Any] = {"type": "function", "function": {"name": name, "arguments": arguments}}
    if call_id not in (None, ""):
        call["id"] = str(call_id)
    return call


def function_tool(name: Any, description: Any = None, parameters: Any = None) -> dict[str, Any]:
    """An OpenAI tool definition (``{"type": "function", "function": {...}}``), absent fields left out."""
    if isinstance(parameters, str):
        try:
            parameters = json.loads(parameters)
        except ValueError as exc:
            raise ValueError(f"tool {name!r}: parameters is not valid JSON ({exc}): {parameters[:80]!r}") from None
    function = {"name": name, "description": description, "parameters": parameters}
    return {"type": "function", "function": {k: v for k, v in function.items() if v is not None}}


def without_nones(message: Mapping[str, Any]) -> dict[str, Any]:
    """A message's fields that are set (SDK dumps carry ``refusal: None``, ``audio: None`` ...)."""
    return {k: v for k, v in message.items() if v is not None}


def as_openai(message: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` without unset fields, its tool calls' ``arguments`` as JSON strings (stored traces hold objects)."""
    out = without_nones(message)
    if isinstance(out.get("tool_calls"), list):
        out["tool_calls"] = [_call_as_openai(c) for c in out["tool_calls"]]
    return out


def _call_as_openai(call: Any) -> Any:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or isinstance(function.get("arguments"), str):
        return call  # already OpenAI's shape, or malformed: parse_record names it
    return tool_call(call.get("id"), function.get("name"), function.get("arguments"))


def assemble(
    calls_by_trace: Mapping[str, Sequence[Call]], skipped: Sequence[str], label: str,
    left_out: Mapping[str, int] | None = None,
) -> list[Conversation]:
    """The conversations of every trace's calls (see the module docstring); a ValueError when there are none.

    ``left_out``: traces the importer left out, by reason (reported, not imported)."""
    keys = {id(c): _key(c) for calls in calls_by_trace.values() for c in calls}
    kept: dict[str, list[Call]] = {}
    within = 0
    for trace_id, calls in calls_by_trace.items():
        kept[trace_id] = _longest(calls, keys)
        within += len(calls) - len(kept[trace_id])
    begins = _prefixes_by_trace(kept, keys)
    merged_roots = [calls[0] for trace_id, calls in kept.items()
                    if len(calls) == 1 and calls[0].root and begins.get(keys[id(calls[0])], {trace_id}) - {trace_id}]
    merged = {id(c) for c in merged_roots}
    conversations = []
    for trace_id, calls in kept.items():
        if id(calls[0]) in merged:
            continue  # a trace of one call: an earlier turn of another trace's conversation
        for call in calls:
            donors = [c for c in (*calls_by_trace[trace_id], *merged_roots)
                      if c is not call and _begins(keys[id(c)], keys[id(call)])]
            conversations.append(_conversation(call, donors))
    _report(label, conversations, len(calls_by_trace), within, len(merged_roots), skipped, left_out or {})
    if not conversations:
        raise ValueError(f"{label}: holds no chat call to import ({len(skipped)} trace(s) without a chat model's call"
                         + (f"; left out: {_reasons(left_out)})" if left_out else ")"))
    return conversations


def _conversation(call: Call, donors: Sequence[Call]) -> Conversation:
    """``call`` as a conversation, with what the calls it absorbed recorded about their replies."""
    messages = [as_openai(m) for m in call.messages]
    cut = {len(messages) - 1} if call.cut else set()
    for donor in donors:
        at = len(donor.messages) - 1  # the donor's reply is this message of the longer call
        if donor.cut:
            cut.add(at)
        reasoning = donor.messages[-1].get("reasoning_content")
        if reasoning and not messages[at].get("reasoning_content"):
            messages[at]["reasoning_content"] = reasoning
    try:
        conversation = parse_record({"messages": messages, "tools": list(call.tools)}, call.source)
    except ValueError as exc:
        raise ValueError(_located(call, str(exc))) from None
    return replace(conversation, cut=frozenset(cut), reward=call.reward)


def _located(call: Call, error: str) -> str:
    """``error`` with the message it names (``messages[i]``, an index of the rebuilt list) located in the trace."""
    found = _MESSAGE_INDEX.search(error)
    if found is None or int(found.group(1)) >= len(call.origins):
        return error
    return f"{error} ({found.group(0)} was rebuilt from {call.origins[int(found.group(1))]})"


def _key(call: Call) -> tuple:
    """What must be equal for two calls to be the same dialogue: the tools and each message (``message_key``)."""
    try:
        tools = json.dumps(normalize_tools(call.tools), sort_keys=True)
        return (tools, *(json.dumps(message_key(m), sort_keys=True) for m in normalize_messages(call.messages)))
    except ValueError as exc:
        raise ValueError(_located(call, f"{call.source}: {exc}")) from None


def _longest(calls: Sequence[Call], keys: Mapping[int, tuple]) -> list[Call]:
    """The calls of one trace that begin no other call of it (of equal ones, the first)."""
    out = []
    for i, call in enumerate(calls):
        key = keys[id(call)]
        if not any(_begins(key, keys[id(other)]) and (key != keys[id(other)] or j < i)
                   for j, other in enumerate(calls) if j != i):
            out.append(call)
    return out


def _begins(short: tuple, long: tuple) -> bool:
    return len(short) <= len(long) and long[: len(short)] == short


def _prefixes_by_trace(kept: Mapping[str, Sequence[Call]], keys: Mapping[int, tuple]) -> dict[tuple, set[str]]:
    """Every proper beginning (tools + at least one message) of every kept call -> the traces it begins a call of."""
    out: dict[tuple, set[str]] = {}
    for trace_id, calls in kept.items():
        for call in calls:
            key = keys[id(call)]
            for end in range(2, len(key)):
                out.setdefault(key[:end], set()).add(trace_id)
    return out


def _report(label: str, conversations: Sequence[Conversation], traces: int, within: int, across: int,
            skipped: Sequence[str], left_out: Mapping[str, int]) -> None:
    parts = []
    if within:
        parts.append(f"{within} call(s) were earlier turns or copies of a longer call in their trace")
    if across:
        parts.append(f"{across} one-call trace(s) began a conversation of another trace and are part of it")
    if skipped:
        named = ", ".join(skipped[:_NAMED]) + (f" (+{len(skipped) - _NAMED} more)" if len(skipped) > _NAMED else "")
        parts.append(f"{len(skipped)} trace(s) hold no chat call and were skipped: {named}")
    if left_out:
        parts.append(f"left out: {_reasons(left_out)}")
    cut = sum(len(c.cut) for c in conversations)
    if cut:
        parts.append(f"{cut} repl(ies) were cut at the token limit (finish_reason length): learned as recorded, "
                     "without an end token")
    toolless = sum(1 for c in conversations if not c.tools)
    if toolless:
        parts.append(f"{toolless} conversation(s) offer no tools (none recorded): they render without tools; if the "
                     "agent had tools, record their definitions, or the prompts are not what it was sent")
    detail = f"; {'; '.join(parts)}" if parts else ""
    read = traces + len(skipped) + sum(left_out.values())
    print(f"mtrl: {label}: {len(conversations)} conversation(s) from {read} trace(s){detail}", file=sys.stderr)


def _reasons(left_out: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {why}" for why, n in sorted(left_out.items()))


__all__ = ["Call", "as_openai", "assemble", "function_tool", "tool_call", "without_nones"]
