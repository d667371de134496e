"""``TurnJudge``: scores each assistant turn of one trajectory (process rewards for ``group_based_per_turn``).

A judge spec with ``per_turn: true`` is asked about one rollout at a time:
the task, then its assistant turns (each turn's reply text and the tool
calls it made), labelled ``s1`` .. ``sN`` by the position they are shown
in, in the order given (the audit shows them reordered to measure position
bias). The reply is the group judge's JSON, one score in [0, 1] per label;
anything else is a ``JudgeReplyError`` naming the turn: never a default.
``turns_of`` gives the shown turns of a rollout, in its own order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from ..types import Rollout, Task
from ._judge import GroupJudge, JudgeVerdict, _reply_text
from ._judge_prompt import _call_text, _cut, _task_text, parse_scores
from ._judge_spec import JudgeSpec
from ._trajectory import trajectory_of

DEFAULT_TURN_TEMPLATE = """\
You are judging each step of one attempt by an agent at a task, on its own merits.

Rubric:
{rubric}

Task:
{task}

The agent's turns (shown in the order given, labelled by position; the label is not the turn's place in the attempt):
{turns}

Give every turn a score between 0 and 1 (1 = a step the task needs, done right).
Answer with JSON only, exactly in this shape, one entry per turn id ({ids}):
{"scores": [{"id": "<turn id>", "explanation": "<one sentence>", "score": <number from 0 to 1>}]}"""


@dataclass(frozen=True)
class TurnView:
    """One assistant turn as the judge reads it: its index in the rollout and its text (reply and tool calls)."""

    rollout_id: str  # "<rollout id> turn <index>": what a reply error names (parse_scores reads this field)
    index: int
    text: str
    tokens: int


def turns_of(rollout: Rollout, limit: int = 4000) -> tuple[TurnView, ...]:
    """The rollout's assistant turns in order, each with the text the judge is shown."""
    out = []
    for turn in sorted(rollout.turns, key=lambda t: t.index):
        lines = [_cut(turn.completion_text.strip(), limit)] if turn.completion_text.strip() else []
        lines += [f"[calls] {_call_text(call, limit)}" for call in turn.tool_calls]
        out.append(TurnView(f"{rollout.id} turn {turn.index}", turn.index, "\n".join(lines) or "(empty reply)",
                            len(turn.completion_ids)))
    return tuple(out)


def turn_judge_messages(spec: JudgeSpec, rollout: Rollout, task: Task, shown: Sequence[TurnView]) -> list[dict[str, str]]:
    """The chat messages of one per-turn judge request over ``shown`` (the rollout's turns, in this order)."""
    if not shown:
        raise ValueError(f"rollout {rollout.id!r}: a per-turn judge needs at least one assistant turn, got none")
    ids = [f"s{i + 1}" for i in range(len(shown))]
    text = "\n\n".join(f'<turn id="{label}">\n{view.text}\n</turn>' for label, view in zip(ids, shown))
    template = spec.prompt_template if "{turns}" in spec.prompt_template else DEFAULT_TURN_TEMPLATE
    values = {"{rubric}": spec.rubric, "{task}": _task_text(trajectory_of(rollout, task)), "{turns}": text,
              "{ids}": ", ".join(ids), "{n}": str(len(ids))}
    return [{"role": "user", "content": re.sub("|".join(re.escape(k) for k in values),
                                                lambda m: values[m.group(0)], template)}]


class TurnJudge(GroupJudge):
    """A per-turn judge over one endpoint and model: ``aturns`` scores the turns shown, in the order shown."""

    async def aturns(self, rollout: Rollout, task: Task, shown: Sequence[TurnView]) -> JudgeVerdict:
        body = {"model": self.spec.model, "messages": turn_judge_messages(self.spec, rollout, task, shown),
                "temperature": self.spec.temperature, "max_tokens": self.spec.max_tokens, "stream": False}
        data, call = await self._post(body, shown)  # type: ignore[arg-type]  # errors name each TurnView.rollout_id
        reply = _reply_text(data, self.url, shown)  # type: ignore[arg-type]
        scores, explanations = _parse(reply, shown)
        return JudgeVerdict(scores, explanations, call, reply)


def _parse(reply: str, shown: Sequence[TurnView]) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """``parse_scores`` with the turn labels ``s1`` .. ``sN`` in place of ``t1`` .. ``tN``."""
    swapped = re.sub(r'"id"\s*:\s*"s(\d+)"', r'"id": "t\1"', reply)
    return parse_scores(swapped, shown)  # type: ignore[arg-type]  # TurnView has the rollout_id errors name


__all__ = ["DEFAULT_TURN_TEMPLATE", "TurnJudge", "TurnView", "turn_judge_messages", "turns_of"]
