"""What a group judge is sent (one prompt for the whole group) and how its reply is read (one score per id).

The group's trajectories are shown in the order given, labelled ``t1`` ..
``tN`` by position (so a judge that favours a position shows it under the
audit's shuffles). The reply must be JSON, bare or in one fenced block::

    {"scores": [{"id": "t1", "explanation": "...", "score": 0.8}, ...]}

with exactly one finite score in [0, 1] per label. Anything else (not JSON,
a label missing, repeated or unknown, a score out of range) is a
``JudgeReplyError`` naming the trajectory (label and rollout id) and quoting
the reply: never a silent 0.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping, Sequence

from ..types import JSON
from ._judge_spec import JudgeSpec
from ._trajectory import Trajectory

_QUOTED = 600  # characters of a bad reply quoted in an error
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n(.*?)\n?```$", re.DOTALL)


class JudgeReplyError(ValueError):
    """A judge reply that does not give one valid score per trajectory; names the trajectory and the reply."""


def labels(n: int) -> tuple[str, ...]:
    """The ids trajectories are shown under, by position: ``t1`` .. ``tn``."""
    return tuple(f"t{i + 1}" for i in range(n))


def judge_messages(spec: JudgeSpec, trajectories: Sequence[Trajectory]) -> list[dict[str, str]]:
    """The chat messages of one judge request over ``trajectories`` (one task's group, in this order)."""
    if not trajectories:
        raise ValueError("trajectories: a group judge needs at least one trajectory, got none")
    tasks = {t.task.id for t in trajectories}
    if len(tasks) > 1:
        raise ValueError(f"trajectories: a group judge compares trajectories of one task, got tasks {sorted(tasks)!r}")
    ids = labels(len(trajectories))
    shown = "\n\n".join(_trajectory_text(label, t, spec.max_chars_per_message) for label, t in zip(ids, trajectories))
    values = {"{rubric}": spec.rubric, "{task}": _task_text(trajectories[0]), "{trajectories}": shown,
              "{ids}": ", ".join(ids), "{n}": str(len(ids))}
    text = re.sub("|".join(re.escape(k) for k in values), lambda m: values[m.group(0)], spec.prompt_template)
    return [{"role": "user", "content": text}]


def parse_scores(reply: str, trajectories: Sequence[Trajectory]) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """The score (and explanation) of each trajectory, in order, read from the judge's ``reply``."""
    ids = labels(len(trajectories))
    owner = dict(zip(ids, trajectories))
    body = reply.strip()
    fenced = _FENCE.match(body)
    if fenced:
        body = fenced.group(1).strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise JudgeReplyError(f"judge reply for rollouts {_names(trajectories)} is not JSON ({exc.msg} at "
                              f"char {exc.pos}): {_quote(reply)}") from None
    entries = data.get("scores") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise JudgeReplyError(f"judge reply for rollouts {_names(trajectories)}: expected an object with a "
                              f"'scores' list, got {_quote(reply)}")
    scores: dict[str, float] = {}
    explanations: dict[str, str] = {}
    for i, entry in enumerate(entries):
        label = entry.get("id") if isinstance(entry, dict) else None
        if not isinstance(label, str) or label not in owner:
            raise JudgeReplyError(f"judge reply: scores[{i}] names id {label!r}, which is none of {list(ids)} "
                                  f"(rollouts {_names(trajectories)}): {_quote(reply)}")
        if label in scores:
            raise JudgeReplyError(f"judge reply scores trajectory {_name(label, owner[label])} twice: {_quote(reply)}")
        value = entry.get("score")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0.0 <= value <= 1.0:
            raise JudgeReplyError(f"judge reply gives trajectory {_name(label, owner[label])} the score {value!r}; "
                                  f"expected a number from 0 to 1: {_quote(reply)}")
        scores[label] = float(value)
        explanations[label] = str(entry.get("explanation", ""))
    missing = [label for label in ids if label not in scores]
    if missing:
        raise JudgeReplyError(
            f"judge reply has no score for trajectory {', '.join(_name(m, owner[m]) for m in missing)} "
            f"({len(scores)} of {len(ids)} scored): {_quote(reply)}")
    return tuple(scores[label] for label in ids), tuple(explanations[label] for label in ids)


def _task_text(trajectory: Trajectory) -> str:
    task = trajectory.task
    if task.prompt:
        return task.prompt
    users = [m for m in task.messages or () if m.get("role") == "user"]
    return _content(users[-1].get("content")) if users else f"(task {task.id!r} has no prompt)"


def _trajectory_text(label: str, trajectory: Trajectory, limit: int) -> str:
    lines = [f'<trajectory id="{label}">']
    for message in trajectory.messages:
        role = str(message.get("role", "?"))
        content = _cut(_content(message.get("content")), limit)
        if content:
            lines.append(f"[{role}] {content}")
        for call in message.get("tool_calls") or ():
            lines.append(f"[{role} calls] {_call_text(call, limit)}")
    if trajectory.tool_calls:
        lines.append("[tool calls recorded]")
        for call in trajectory.tool_calls:
            outcome = f"error: {call.error}" if call.error else f"result: {json.dumps(call.result, default=str)}"
            lines.append(_cut(f"- {call.name}({json.dumps(call.arguments, default=str)}) -> {outcome}", limit))
    lines.append(f"[final answer] {_cut(trajectory.final_answer, limit) or '(none)'}")
    lines.append(f"[outcome] {trajectory.status}")
    lines.append("</trajectory>")
    return "\n".join(lines)


def _call_text(call: Any, limit: int) -> str:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping):
        return _cut(json.dumps(call, default=str), limit)
    return _cut(f"{function.get('name')}({function.get('arguments', '')})", limit)


def _content(content: JSON) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return json.dumps(content, default=str)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f" [... {len(text) - limit} characters cut]"


def _name(label: str, trajectory: Trajectory) -> str:
    return f"{label} (rollout {trajectory.rollout_id!r})"


def _names(trajectories: Sequence[Trajectory]) -> str:
    return ", ".join(repr(t.rollout_id) for t in trajectories)


def _quote(reply: str) -> str:
    shown = reply if len(reply) <= _QUOTED else reply[:_QUOTED] + f"... ({len(reply)} characters)"
    return f"the reply was {shown!r}"


__all__ = ["JudgeReplyError", "judge_messages", "labels", "parse_scores"]
