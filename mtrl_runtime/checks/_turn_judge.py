"""``mtrl check reward --judge`` with a per-turn judge (``per_turn: true``): fit to give process rewards?

Every completed baseline rollout's assistant turns are judged in ``orders``
orders (as recorded, reversed, seeded shuffles). The scores of the recorded
order are compared with labels from a strict per-turn scorer
(``--strict-turns module:function``, ``fn(rollout, task)`` -> one score in
[0, 1] per assistant turn), else with the per-turn rewards the agent
reported (a turn without one is unlabelled). Checks:

- turn agreement: on labelled turns, judge score >= 0.5 exactly where the
  label is above 0 (a step the task needs, done right);
- turn order agreement: of the pairs of turns of one rollout the labels
  tell apart, the share the judge orders the same way (a tie counts half);
- position bias: a turn's score (less its mean over all orders) against its
  position in the prompt;
- turn-order bias: the judge's excess over the label against the turn's
  place in the rollout (does it favour early or late steps for their place);
- length bias: the excess against the turn's length in generated tokens;
- the verdict, which refuses the judge when any of these failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..rewards import TurnJudge, TurnView, turns_of
from ..types import Rollout, RolloutStatus, Task
from ._checklist import CheckItem, Checklist, failed, passed, skipped
from ._judge import LENGTH_CORRELATION_MAX, ORDER_AGREEMENT_MIN, POSITION_CORRELATION_MAX, SUCCESS_AGREEMENT_MIN
from ._judge_audit import bounded_correlation, centred, judge_in_orders, ordered_alike, pearson, position_correlation, verdict

TURN_ORDER_CORRELATION_MAX = 0.3  # the judge's excess over the label, against the turn's place in the rollout
GOOD_TURN = 0.5  # a judge score at or above this calls a turn good; a label above 0 does

TurnScorer = Callable[[Rollout, Task], Sequence[float]]


@dataclass(frozen=True)
class JudgedTurns:
    """One rollout's turns judged in several orders: ``scores[k][turn index]`` and ``positions[k][turn index]``."""

    rollout: Rollout
    turns: tuple[TurnView, ...]
    scores: tuple[Mapping[int, float], ...]
    positions: tuple[Mapping[int, int], ...]


async def ajudge_turns(
    judge: TurnJudge, rollouts: Sequence[Rollout], tasks: Mapping[str, Task], orders: int = 3, seed: int = 0,
) -> list[JudgedTurns]:
    """Judge every completed rollout's turns in ``orders`` orders (recorded, reversed, seeded shuffles)."""
    chosen = {r.id: r for r in rollouts if r.status is RolloutStatus.COMPLETED and r.turns}
    views = {rid: turns_of(r, judge.spec.max_chars_per_message) for rid, r in chosen.items()}

    async def ask(rid: str, shown: list[TurnView]) -> Sequence[float]:
        rollout = chosen[rid]
        return (await judge.aturns(rollout, tasks[rollout.task_id], shown)).scores

    judged = await judge_in_orders(views, orders, seed, lambda view: view.index, ask)
    return [JudgedTurns(r, views[rid], *judged[rid]) for rid, r in chosen.items()]


def turn_labels(judged: Sequence[JudgedTurns], tasks: Mapping[str, Task], scorer: TurnScorer | None
                ) -> tuple[dict[tuple[str, int], float], str]:
    """Each labelled turn's reference score, by (rollout id, turn index), and what the labels are."""
    labels: dict[tuple[str, int], float] = {}
    for j in judged:
        if scorer is not None:
            values = list(scorer(j.rollout, tasks[j.rollout.task_id]))
            if len(values) != len(j.turns):
                raise ValueError(f"strict turn scorer: {len(values)} scores for rollout {j.rollout.id!r}, which has "
                                 f"{len(j.turns)} assistant turns; give one per turn")
        else:
            values = list(j.rollout.turn_rewards or ())
        for view, value in zip(j.turns, values):
            labels[(j.rollout.id, view.index)] = float(value)
    name = f"the strict turn scorer {getattr(scorer, '__name__', 'scorer')}" if scorer is not None else \
        "the agent's per-turn rewards"
    return labels, name


def turn_judge_checklist(
    judged: Sequence[JudgedTurns], tasks: Mapping[str, Task], *, strict_turns: TurnScorer | None = None,
) -> Checklist:
    """The per-turn judge audit of the module docstring."""
    if not judged:
        raise ValueError("judged: the per-turn judge audit needs judged baseline rollouts, got none "
                         "(did every rollout fail, or make no model call?)")
    labels, ref_name = turn_labels(judged, tasks, strict_turns)
    items = [*_agreement(judged, labels, ref_name), _position_bias(judged),
             *(bias.check(judged, labels, ref_name) for bias in (_TURN_ORDER_BIAS, _LENGTH_BIAS))]
    fit = verdict("the per-turn judge is fit to train on", items,
                  f"{sum(len(j.turns) for j in judged)} turns of {len(judged)} rollouts audited",
                  "fix the first failed check (rubric, prompt, or a stronger judge model) and run this check "
                  "again before training on the judge's per-turn scores")
    return Checklist("mtrl check reward --judge (per turn)", (*items, fit))


def _agreement(judged: Sequence[JudgedTurns], labels: Mapping[tuple[str, int], float], ref: str) -> list[CheckItem]:
    good_name, order_name = "judge agrees with the labelled turns", "judge orders turns as the labels do"
    if not labels:
        reason = ("no labelled turn: give a strict per-turn scorer (--strict-turns) or have the agent report "
                  "per-turn rewards")
        return [skipped(good_name, reason), skipped(order_name, reason)]
    rows = [(j.scores[0][v.index], labels[(j.rollout.id, v.index)], f"{j.rollout.id}#{v.index}")
            for j in judged for v in j.turns if (j.rollout.id, v.index) in labels]
    wrong = [name for judge, label, name in rows if (judge >= GOOD_TURN) != (label > 0)]
    share = 1 - len(wrong) / len(rows)
    detail = f"{share:.0%} of {len(rows)} labelled turns: judge score >= {GOOD_TURN:g} exactly where {ref} is above 0"
    items = [passed(good_name, detail, turn_agreement=share) if share >= SUCCESS_AGREEMENT_MIN else failed(
        good_name, detail + f" (below {SUCCESS_AGREEMENT_MIN:.0%}); e.g. {', '.join(wrong[:5])}",
        "state in the rubric what makes a step right (the tool the procedure needs next, with the right arguments); "
        "read the disagreeing turns next to the judge's explanations", turn_agreement=share, turns=wrong)]
    agree = pairs = 0.0
    for j in judged:
        marked = {v.index: labels[(j.rollout.id, v.index)] for v in j.turns if (j.rollout.id, v.index) in labels}
        alike, told_apart = ordered_alike(list(marked), marked, j.scores[0])
        agree += alike
        pairs += told_apart
    if not pairs:
        items.append(skipped(order_name, f"{ref} scores every rollout's turns alike: no pair to order"))
    else:
        share = agree / pairs
        detail = f"{share:.0%} of {int(pairs)} pairs of turns {ref} tells apart are ordered alike"
        items.append(passed(order_name, detail, order_agreement=share) if share >= ORDER_AGREEMENT_MIN else failed(
            order_name, detail + f" (below {ORDER_AGREEMENT_MIN:.0%})",
            "the judge ranks a rollout's steps unlike the labels: sharpen the rubric, or use a stronger judge model",
            order_agreement=share))
    return items


def _position_bias(judged: Sequence[JudgedTurns]) -> CheckItem:
    name = "no position bias (turn score vs position shown)"
    shuffled = [j for j in judged if len(j.scores) > 1 and len(j.turns) > 1]
    if not shuffled:
        return skipped(name, "no rollout's turns were judged in more than one order (one turn, or --judge-orders 1)")
    corr = position_correlation(([v.index for v in j.turns], j.scores, j.positions) for j in shuffled)
    detail = f"correlation of a turn's score with where it is shown {corr:+.2f} over {len(shuffled)} rollouts"
    return bounded_correlation(
        name, detail, corr, POSITION_CORRELATION_MAX, "position_correlation",
        "turns shown " + ("earlier" if corr < 0 else "later") + " score higher for their place alone",
        "have the judge give each turn a reason before its score, or average it over shuffled orders; "
        "a stronger judge model is less position-biased")


def _excess(judged: Sequence[JudgedTurns], labels: Mapping[tuple[str, int], float], feature: Callable[[TurnView, int], float]
            ) -> tuple[list[float], list[float]]:
    """Within each rollout: the feature, centred, against the judge's excess over the label (the score unlabelled)."""
    xs, ys = [], []
    for j in judged:
        if len(j.turns) < 2:
            continue
        feats = [feature(v, n) for n, v in enumerate(j.turns)]
        excess = [j.scores[0][v.index] - labels.get((j.rollout.id, v.index), 0.0) for v in j.turns]
        xs += centred(feats)
        ys += centred(excess)
    return xs, ys


@dataclass(frozen=True)
class _ExcessBias:
    """A turn feature the judge's excess over the labels must not follow, within rollouts, and how to report it."""

    name: str
    feature: Callable[[TurnView, int], float]  # of the turn and its place in the rollout
    feature_name: str
    limit: float  # the largest |correlation| that passes
    metric: str  # the evidence key of the correlation
    favoured: tuple[str, str]  # which turns score higher for the feature: correlation positive, negative
    first_fix: str

    def check(self, judged: Sequence[JudgedTurns], labels: Mapping[tuple[str, int], float], ref: str) -> CheckItem:
        xs, ys = _excess(judged, labels, self.feature)
        if not xs:
            return skipped(self.name, "every rollout has one turn: nothing to compare within rollouts")
        corr = pearson(xs, ys)
        detail = f"correlation of the judge's excess over {ref} with {self.feature_name}: {corr:+.2f}"
        return bounded_correlation(self.name, detail, corr, self.limit, self.metric,
                                   self.favoured[0] if corr > 0 else self.favoured[1], self.first_fix)


_TURN_ORDER_BIAS = _ExcessBias(
    name="no turn-order bias (score vs place in the rollout)",
    feature=lambda v, n: float(n), feature_name="the turn's place in its rollout",
    limit=TURN_ORDER_CORRELATION_MAX, metric="turn_order_correlation",
    favoured=("later steps score higher for their place in the attempt",
              "earlier steps score higher for their place in the attempt"),
    first_fix="tell the judge in the rubric that a step is judged by what it does, not when; show it the whole "
              "attempt's outcome only if the labels do the same",
)
_LENGTH_BIAS = _ExcessBias(
    name="no length bias (turn score vs turn length)",
    feature=lambda v, n: float(v.tokens), feature_name="a turn's length in generated tokens",
    limit=LENGTH_CORRELATION_MAX, metric="length_correlation",
    favoured=("longer turns score higher for their length", "shorter turns score higher for their length"),
    first_fix="tell the judge in the rubric that length is not quality",
)


def load_turn_scorer(fn: Any) -> TurnScorer:
    """A strict per-turn scorer: a function ``fn(rollout, task)`` returning one score per assistant turn."""
    if not callable(fn):
        raise ValueError(f"strict_turns: expected a function fn(rollout, task) -> per-turn scores, got {fn!r}")
    return fn


__all__ = ["GOOD_TURN", "TURN_ORDER_CORRELATION_MAX", "JudgedTurns", "ajudge_turns", "load_turn_scorer",
           "turn_judge_checklist", "turn_labels"]
