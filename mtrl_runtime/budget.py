"""The turn and token budget of a run: what its rollouts needed, and whether the longest episode fits the context.

Pure figures over recorded rollouts (no I/O), used by ``mtrl check budget``
(``checks``: it collects the rollouts and finds the context window) and by
the trainer, which warns at start when ``context_budget_warning`` says the
config's turns cannot fit. The rules:

- ``core.max_turns``: 1.5 x the most turns a successful rollout needed
  (rounded up), the seeds' rule: room to recover from a wrong step, not
  room to wander;
- ``core.sampling_params.max_tokens``: the smallest cap (a multiple of
  ``TOKEN_STEP``) that under 5% of the recorded replies reach. A reply cut
  at the cap (``finish_reason: length``) only says its length was at least
  the cap, so when 5% or more were cut the cap is doubled instead;
- the worst case of a trajectory, ``prompt + max_turns x cap + (max_turns -
  1) x tool output``, against the model's context window: the longest first
  prompt seen (system prompt, tools, task), each turn at the cap, each
  turn's new messages at the longest seen (tool results and the template's
  glue). Sequence extension trains a rollout as one sequence, so the whole
  of it must fit.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from .types import Rollout

TURN_FACTOR = 1.5  # max_turns = this x the most turns a successful rollout needed
CAP_FRACTION = 0.05  # at most this share of replies may reach the recommended cap (strictly under)
TOKEN_STEP = 32  # recommended caps are multiples of this


@dataclass(frozen=True)
class BudgetFigures:
    """What the rollouts measured (token counts are ids as the endpoint rendered and the engine sampled them)."""

    rollouts: int
    successful: int
    turns: int  # replies recorded, all rollouts
    max_turns_successful: int | None  # the most turns a successful rollout took (None: no success)
    max_turns_seen: int
    turn_limited: int  # rollouts ended by max_turns
    replies_at_cap: int  # replies cut at the cap (finish_reason "length")
    longest_reply: int
    prompt_tokens: int  # the longest first prompt
    tool_output_tokens: int  # the most tokens a turn's new messages added (tool results, template glue)


@dataclass(frozen=True)
class BudgetReport:
    """The figures, the config's budget, the recommendation, and both worst cases against the context."""

    figures: BudgetFigures
    max_turns: int
    max_tokens: int
    context_length: int | None
    context_source: str
    recommended_max_turns: int
    recommended_max_tokens: int
    notes: tuple[str, ...] = ()

    def worst_case(self, max_turns: int, max_tokens: int) -> int:
        """prompt + turns x cap + (turns - 1) x tool output: the longest trajectory this budget allows."""
        f = self.figures
        return f.prompt_tokens + max_turns * max_tokens + max(0, max_turns - 1) * f.tool_output_tokens

    @property
    def current_worst_case(self) -> int:
        return self.worst_case(self.max_turns, self.max_tokens)

    @property
    def recommended_worst_case(self) -> int:
        return self.worst_case(self.recommended_max_turns, self.recommended_max_tokens)

    @property
    def fits(self) -> bool:
        """Whether the current config's worst case fits the context (True when the context is not known)."""
        return self.context_length is None or self.current_worst_case <= self.context_length

    @property
    def recommended_fits(self) -> bool:
        return self.context_length is None or self.recommended_worst_case <= self.context_length

    def yaml(self) -> str:
        """The config lines to paste (under ``core:``)."""
        return (f"core:\n  max_turns: {self.recommended_max_turns}\n"
                f"  sampling_params:\n    max_tokens: {self.recommended_max_tokens}\n")

    def to_dict(self) -> dict[str, Any]:
        return {
            "figures": asdict(self.figures),
            "current": {"max_turns": self.max_turns, "max_tokens": self.max_tokens,
                        "worst_case_tokens": self.current_worst_case, "fits": self.fits},
            "recommended": {"max_turns": self.recommended_max_turns, "max_tokens": self.recommended_max_tokens,
                            "worst_case_tokens": self.recommended_worst_case, "fits": self.recommended_fits},
            "context_length": self.context_length,
            "context_source": self.context_source,
            "notes": list(self.notes),
            "yaml": self.yaml(),
        }

    def __str__(self) -> str:
        f = self.figures
        context = f"{self.context_length} tokens ({self.context_source})" if self.context_length else "not known"
        needed = ("no successful rollout" if f.max_turns_successful is None
                  else f"successful rollouts needed at most {f.max_turns_successful} (x{TURN_FACTOR:g})")
        share = f.replies_at_cap / f.turns if f.turns else 0.0
        rows = [
            ("", "now", "recommended", ""),
            ("max_turns", str(self.max_turns), str(self.recommended_max_turns),
             f"{needed}; {f.turn_limited} of {f.rollouts} rollouts ended at the turn limit"),
            ("sampling max_tokens", str(self.max_tokens), str(self.recommended_max_tokens),
             f"longest reply {f.longest_reply}; {f.replies_at_cap} of {f.turns} replies ({share:.0%}) hit the cap"),
            ("worst-case tokens", str(self.current_worst_case), str(self.recommended_worst_case),
             f"prompt {f.prompt_tokens} + turns x cap + (turns - 1) x tool output {f.tool_output_tokens}"),
            ("fits the context", _yes(self.fits, self.context_length), _yes(self.recommended_fits, self.context_length),
             f"context {context}"),
        ]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [f"mtrl check budget: {f.rollouts} rollouts ({f.successful} successful), {f.turns} replies; "
                 f"context {context}"]
        lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + ("  " + r[3] if r[3] else "")
                  for r in rows]
        lines += [f"  note: {n}" for n in self.notes]
        lines.append("paste into the config:")
        lines.append(self.yaml().rstrip("\n"))
        return "\n".join(lines)


def _yes(fits: bool, context: int | None) -> str:
    return "-" if context is None else ("yes" if fits else "NO")


def measure(rollouts: Sequence[Rollout], success_threshold: float) -> BudgetFigures:
    """The figures of ``rollouts`` (those with at least one recorded turn)."""
    used = [r for r in rollouts if r.turns]
    if not used:
        raise ValueError("rollouts: the budget needs rollouts with recorded turns, got none")
    successful = [r for r in used if r.total_reward >= success_threshold]
    replies = [t for r in used for t in r.turns]
    added = [
        len(b.prompt_ids) - len(a.prompt_ids) - len(a.completion_ids)
        for r in used
        for a, b in zip(sorted(r.turns, key=lambda t: t.index), sorted(r.turns, key=lambda t: t.index)[1:])
        if b.break_reason is None  # an extended turn: what came between is exactly the new messages' ids
    ]
    return BudgetFigures(
        rollouts=len(used),
        successful=len(successful),
        turns=len(replies),
        max_turns_successful=max((len(r.turns) for r in successful), default=None),
        max_turns_seen=max(len(r.turns) for r in used),
        turn_limited=sum(bool(r.metrics.get("hit_turn_limit")) for r in used),
        replies_at_cap=sum(t.finish_reason == "length" for t in replies),
        longest_reply=max(len(t.completion_ids) for t in replies),
        prompt_tokens=max(len(min(r.turns, key=lambda t: t.index).prompt_ids) for r in used),
        tool_output_tokens=max(added, default=0),
    )


def recommend(
    rollouts: Sequence[Rollout],
    *,
    max_turns: int,
    max_tokens: int,
    context_length: int | None,
    context_source: str = "the engine",
    success_threshold: float = 1.0,
) -> BudgetReport:
    """The budget of ``rollouts`` recorded under ``max_turns`` and a cap of ``max_tokens`` (the module docstring)."""
    if max_turns < 1 or max_tokens < 1:
        raise ValueError(f"max_turns and max_tokens must be >= 1, got {max_turns} and {max_tokens}")
    figures = measure(rollouts, success_threshold)
    notes: list[str] = []
    if figures.max_turns_successful is None:
        turns = max_turns
        notes.append(f"no rollout reached the success threshold {success_threshold:g}: max_turns kept at {max_turns}; "
                     "give the base model a foothold first (mtrl check reward)")
    else:
        turns = max(1, math.ceil(TURN_FACTOR * figures.max_turns_successful))
    lengths = sorted(len(t.completion_ids) for r in rollouts for t in r.turns)
    if figures.replies_at_cap >= CAP_FRACTION * figures.turns:
        tokens = 2 * max_tokens  # cut replies only say "at least the cap": raise it and measure again
        notes.append(f"{figures.replies_at_cap} of {figures.turns} replies hit the cap of {max_tokens}: their length "
                     f"is not known; try {tokens} and run the check again")
    else:
        tokens = _cap(lengths)
    if context_length is not None and figures.prompt_tokens + turns * tokens + max(0, turns - 1) * figures.tool_output_tokens > context_length:
        notes.append(f"even the recommended budget does not fit the context of {context_length} tokens: shorten the "
                     "prompt or the tool results, or compact the conversation in the agent")
    return BudgetReport(figures, max_turns, max_tokens, context_length, context_source, turns, tokens, tuple(notes))


def _cap(lengths: Sequence[int]) -> int:
    """The smallest multiple of ``TOKEN_STEP`` that under ``CAP_FRACTION`` of ``lengths`` (sorted) reach."""
    allowed = math.ceil(CAP_FRACTION * len(lengths)) - 1  # replies that may reach the cap: strictly under 5%
    longest_below = lengths[len(lengths) - 1 - allowed] if allowed < len(lengths) else 0
    return max(TOKEN_STEP, TOKEN_STEP * math.ceil((longest_below + 1) / TOKEN_STEP))


def context_budget_warning(max_turns: int, max_tokens: int, context_length: int | None) -> str | None:
    """Why a config's turns cannot fit the context before any prompt or tool result is counted, else None."""
    if context_length is None or max_turns * max_tokens <= context_length:
        return None
    return (f"core.max_turns {max_turns} x sampling_params.max_tokens {max_tokens} = {max_turns * max_tokens} tokens "
            f"of replies alone exceed the model's context of {context_length} tokens (prompt and tool results come "
            "on top): late turns will be cut short or refused. mtrl check budget recommends both from rollouts")



__all__ = ["CAP_FRACTION", "TOKEN_STEP", "TURN_FACTOR", "BudgetFigures", "BudgetReport", "context_budget_warning",
           "measure", "recommend"]
