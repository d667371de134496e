"""A frontier teacher's successful rollouts as ``mtrl sft`` data: conversations, not the teacher's token ids.

``mtrl collect --teacher-url URL --teacher-model NAME`` drives the same
decorated agent with a model behind its own endpoint (the coordinator's
reference side, ``coordinator._reference``: any protocol of
``REFERENCE_WIRES``). Its turns carry no token ids (a closed endpoint gives
none, and its tokenizer is not the student's), so the store's rollouts cannot
be trained on as ``--from-run`` trains on a policy's. What carries over is the
conversation: the messages the teacher saw, its replies and tool calls. Each
rollout the filters keep (``_store.select_rollouts``: completed, a reported
reward, ``min_reward`` and/or the strict scorer) becomes one OpenAI-format
JSONL line per conversation it holds, and ``mtrl sft --conversations FILE``
renders it in the student's own chat format (``_render``), the loss on the
teacher's replies.

A rollout is one conversation when each turn's request extends the one
before (its messages start with the previous request and reply); where the
agent rewrote its history (a compaction, a sub-agent), the turn before the
rewrite closes a conversation of its own, so no reply is lost. Every line is
read back by the ``openai`` importer before the file is written: what
``mtrl sft`` would refuse is refused here, naming the rollout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..evaluation import StrictScorer
from ..types import JSON, Rollout, Task, Turn
from ._conversation import Conversation
from ._openai_jsonl import parse_record
from ._store import StoreSelection, select_rollouts


def teacher_conversations(
    rollouts: Sequence[Rollout],
    tasks: Mapping[str, Task],
    *,
    min_reward: float | None = None,
    strict: StrictScorer | None = None,
    success_threshold: float = 1.0,
) -> tuple[list[Conversation], StoreSelection]:
    """The conversations of the rollouts that pass the filters (at least one of ``min_reward`` and ``strict``)."""
    selection = select_rollouts(list(rollouts), dict(tasks), min_reward=min_reward, strict=strict,
                                success_threshold=success_threshold)
    conversations = []
    for rollout in selection.kept:
        for number, messages in enumerate(rollout_conversations(rollout)):
            record = {"messages": messages, "tools": _tools(rollout)}
            conversations.append(parse_record(record, f"rollout {rollout.id} conversation {number}"))
    return conversations, selection


def rollout_conversations(rollout: Rollout) -> list[list[dict[str, Any]]]:
    """The rollout's conversations in order: each the messages of a request that no later request extends, and
    the reply to it (see the module docstring)."""
    turns = sorted(rollout.turns, key=lambda t: t.index)
    out = []
    for position, turn in enumerate(turns):
        messages = [*(dict(m) for m in turn.messages), _reply(turn)]
        following = turns[position + 1] if position + 1 < len(turns) else None
        if following is None or not _extends(following.messages, messages):
            out.append(messages)
    return out


def write_conversations(path: str | Path, conversations: Sequence[Conversation]) -> Path:
    """``conversations`` as OpenAI fine-tuning JSONL at ``path`` (what ``mtrl sft --conversations`` reads)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for conversation in conversations:
        record: dict[str, Any] = {"messages": [_openai_message(m) for m in conversation.messages]}
        if conversation.tools:
            record["tools"] = [dict(t) for t in conversation.tools]
        lines.append(json.dumps(record, ensure_ascii=False))
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    tmp.replace(path)
    return path


def _openai_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """``message`` as OpenAI's fine-tuning format writes it: a tool call's ``arguments`` as a JSON string."""
    out = dict(message)
    if out.get("tool_calls"):
        calls = []
        for call in out["tool_calls"]:
            call, function = dict(call), dict(call.get("function") or {})
            if not isinstance(function.get("arguments"), str):
                function["arguments"] = json.dumps(function.get("arguments") or {}, ensure_ascii=False)
            calls.append({**call, "function": function})
        out["tool_calls"] = calls
    return out


def _reply(turn: Turn) -> dict[str, Any]:
    reply: dict[str, Any] = {"role": "assistant", "content": turn.completion_text}
    if turn.tool_calls:
        reply["tool_calls"] = [dict(c) for c in turn.tool_calls]
    return reply


def _extends(later: Sequence[Mapping[str, JSON]], earlier: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the request ``later`` starts with ``earlier`` (request + reply): role, text and tool calls alike."""
    if len(later) <= len(earlier):
        return False
    return all(_same(a, b) for a, b in zip(later, earlier))


def _same(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    calls = [[(c.get("function") or {}).get("name") for c in m.get("tool_calls") or ()] for m in (a, b)]
    return a.get("role") == b.get("role") and (a.get("content") or "") == (b.get("content") or "") \
        and calls[0] == calls[1]


def _tools(rollout: Rollout) -> list[dict[str, Any]]:
    """The tools offered to the rollout's last turn (the agent's toolset; the importer checks their shape)."""
    turns = sorted(rollout.turns, key=lambda t: t.index)
    return [dict(t) for t in turns[-1].tools] if turns else []


__all__ = ["rollout_conversations", "teacher_conversations", "write_conversations"]
