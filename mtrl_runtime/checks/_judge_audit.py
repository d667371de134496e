"""What the group judge audit (``_judge``) and the per-turn one (``_turn_judge``) share, written once.

Both show a judge the same items (a group's trajectories, a rollout's turns)
in several orders, then measure the same things on its scores: how many
pairs the reference tells apart the judge orders alike, whether a score
follows the place it was shown at, whether it follows a feature of the item
once each unit's mean is taken out, and the verdict over all the checks.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Awaitable, Callable, Hashable, Iterable, Mapping, Sequence, TypeVar

from ._checklist import CheckItem, Status, failed, passed

TIE = 1e-9  # scores closer than this are equal
CONCURRENT_REQUESTS = 8  # judge calls in flight at once

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

# one unit's scores and positions by item key, one mapping per order
Judged = tuple[tuple[Mapping[K, float], ...], tuple[Mapping[K, int], ...]]


def orders_of(n: int, count: int, rng: random.Random) -> list[list[int]]:
    """``count`` orders of ``n`` items: as recorded, reversed, then shuffles (distinct while there are any left)."""
    found = [list(range(n))]
    if n > 1 and count > 1:
        found.append(list(reversed(range(n))))
    for _ in range(50 * count):
        if len(found) >= min(count, math.factorial(n)):
            break
        order = list(range(n))
        rng.shuffle(order)
        if order not in found:
            found.append(order)
    return found


async def judge_in_orders(
    units: Mapping[str, Sequence[T]], orders: int, seed: int, key: Callable[[T], K],
    ask: Callable[[str, list[T]], Awaitable[Sequence[float]]],
) -> dict[str, Judged[K]]:
    """Each unit's items judged in ``orders`` orders (``orders_of``, shuffles seeded by ``seed`` and the unit's id).

    ``ask(unit, shown)`` is one judge call, its scores in the order shown;
    at most ``CONCURRENT_REQUESTS`` run at once. Per unit: the scores and
    the 0-based positions of each order, by ``key(item)``, the recorded order first.
    """
    if orders < 1:
        raise ValueError(f"orders: expected >= 1, got {orders}")
    gate = asyncio.Semaphore(CONCURRENT_REQUESTS)
    plans = {unit: orders_of(len(items), orders, random.Random(f"{seed}:{unit}")) for unit, items in units.items()}

    async def one(unit: str, order: list[int]) -> dict[K, float]:
        shown = [units[unit][i] for i in order]
        async with gate:
            scores = await ask(unit, shown)
        return {key(item): score for item, score in zip(shown, scores)}

    results = await asyncio.gather(*(one(unit, order) for unit in units for order in plans[unit]))
    judged: dict[str, Judged[K]] = {}
    at = 0
    for unit, items in units.items():
        plan = plans[unit]
        positions = tuple({key(items[i]): p for p, i in enumerate(order)} for order in plan)
        judged[unit] = (tuple(results[at:at + len(plan)]), positions)
        at += len(plan)
    return judged


def ordered_alike(keys: Sequence[K], reference: Mapping[K, float], scores: Mapping[K, float]) -> tuple[float, int]:
    """Of the pairs of ``keys`` the reference tells apart: how many the scores order alike (a tie in the scores
    counts half), and how many such pairs there are."""
    agree, pairs = 0.0, 0
    for i, a in enumerate(keys):
        for b in keys[i + 1:]:
            want = reference[a] - reference[b]
            if abs(want) <= TIE:
                continue
            got = scores[a] - scores[b]
            pairs += 1
            agree += 0.5 if abs(got) <= TIE else float((got > 0) == (want > 0))
    return agree, pairs


def position_correlation(
    units: Iterable[tuple[Sequence[K], Sequence[Mapping[K, float]], Sequence[Mapping[K, int]]]],
) -> float:
    """Units of two or more items, each judged in several orders (``(keys, scores, positions)``): the correlation
    of where an item was shown (0 first, 1 last) with its score less its mean over the orders."""
    xs, ys = [], []
    for keys, scores, positions in units:
        n = len(keys)
        for k in keys:
            mean = sum(s[k] for s in scores) / len(scores)
            for shown_scores, shown_at in zip(scores, positions):
                xs.append(shown_at[k] / (n - 1))
                ys.append(shown_scores[k] - mean)
    return pearson(xs, ys)


def centred(values: Sequence[float]) -> list[float]:
    """``values`` less their mean (a unit's own level taken out before comparing across units)."""
    mean = sum(values) / len(values)
    return [v - mean for v in values]


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson's r; 0 when either side does not vary (nothing to correlate)."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= TIE or syy <= TIE:
        return 0.0
    return sxy / math.sqrt(sxx * syy)


def bounded_correlation(name: str, detail: str, corr: float, limit: float, metric: str, why: str, fix: str
                        ) -> CheckItem:
    """Passed while ``|corr| <= limit``; else failed, saying ``why`` (what scores higher) and the first fix.
    ``corr`` is recorded as the evidence ``metric``."""
    if abs(corr) <= limit:
        return passed(name, detail, **{metric: corr})
    return failed(name, detail + f" (beyond +-{limit:g}): " + why, fix, **{metric: corr})


def verdict(name: str, items: Sequence[CheckItem], audited: str, fix: str) -> CheckItem:
    """The judge is fit when none of ``items`` failed (``audited`` says what was looked at); else the first fix."""
    failures = [i.name for i in items if i.status is Status.FAIL]
    if failures:
        return failed(name, f"not fit: {len(failures)} check(s) failed ({'; '.join(failures)})", fix,
                      failed_checks=failures)
    return passed(name, f"{audited}, no check failed", failed_checks=[])


__all__ = [
    "CONCURRENT_REQUESTS",
    "TIE",
    "bounded_correlation",
    "centred",
    "judge_in_orders",
    "ordered_alike",
    "orders_of",
    "pearson",
    "position_correlation",
    "verdict",
]
