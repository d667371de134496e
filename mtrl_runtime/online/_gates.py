"""The gate a candidate adapter passes before it serves users.

Two checks, both on the held-out set (``online.holdout``), run on a stack of
the gate's own (its own engine, store and loopback server: the serving
engine never evaluates, so users are not slowed by the gate's rollouts
beyond the CPU they share):

- strict success: the candidate's success rate (the strict scorer's when
  ``online.strict`` names one, else the reward's at ``core.success_threshold``)
  is not below the serving adapter's, measured side by side with the same
  tasks and seeds;
- tripwires quiet: no rollout of the candidate on the held-out set, and none
  of the rollouts it was trained on since the last promotion, tripped a
  tripwire (``advanced.tripwires``).

``judge`` is the pure decision; ``GateRunner`` measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..evaluation import EvalPlan, EvalSide, StrictScorer, run_side, success_rate
from ..rollouts import RolloutStack
from ..training import tripwire_counts
from ..types import Rollout, Task


@dataclass(frozen=True)
class GateVerdict:
    """What the gate measured for one candidate and whether it passed (``reasons``: why not)."""

    candidate_version: int
    serving_version: int
    candidate_success: float
    serving_success: float
    trips: Mapping[str, float] = field(default_factory=dict)
    passed: bool = False
    reasons: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"candidate_version": self.candidate_version, "serving_version": self.serving_version,
                "candidate_success": self.candidate_success, "serving_success": self.serving_success,
                "trips": dict(self.trips), "passed": self.passed, "reasons": list(self.reasons)}


def judge(candidate_version: int, serving_version: int, candidate_success: float, serving_success: float,
          trips: Mapping[str, float]) -> GateVerdict:
    """Pass when the candidate's success is not below the serving adapter's and no tripwire tripped."""
    reasons = []
    if candidate_success < serving_success:
        reasons.append(f"strict success {candidate_success:.3f} is below the serving adapter's {serving_success:.3f}")
    tripped = {name: n for name, n in trips.items() if n > 0}
    if tripped:
        reasons.append("tripwires tripped: " + ", ".join(f"{name} ({n:g})" for name, n in sorted(tripped.items())))
    return GateVerdict(candidate_version, serving_version, candidate_success, serving_success, dict(tripped),
                       not reasons, tuple(reasons))


class GateRunner:
    """Evaluates adapters on the held-out set, on a stack of its own (see the module docstring)."""

    def __init__(self, stack: RolloutStack, tasks: Sequence[Task], samples: int,
                 scorer: StrictScorer | None) -> None:
        self.stack = stack
        self.plan = EvalPlan.from_config(stack.config, tasks, samples=samples)
        self.scorer = scorer
        self._runs = 0

    async def success(self, adapter: Path, version: int, label: str) -> EvalSide:
        """The held-out side of ``adapter`` (loaded into the gate's engine as ``version``)."""
        await self.stack.engine.load_adapter(str(adapter), version)
        self._runs += 1
        return await run_side(self.stack.dispatcher(), self.plan, label=label, group_prefix=f"gate{self._runs}-{label}",
                              scorer=self.scorer, prefix="gate")

    async def check(self, candidate: Path, candidate_version: int, serving: Path, serving_version: int,
                    trained: Sequence[Rollout]) -> GateVerdict:
        """Measure the serving adapter and the candidate side by side, then ``judge``."""
        served = await self.success(serving, serving_version, "serving")
        tried = await self.success(candidate, candidate_version, "candidate")
        trips = tripwire_counts([*tried.rollouts, *trained])
        return judge(candidate_version, serving_version, _success(tried), _success(served), trips)

    async def close(self) -> None:
        await self.stack.close()


def _success(side: EvalSide) -> float:
    return side.strict.success_rate if side.strict is not None else success_rate(side.records)


__all__ = ["GateRunner", "GateVerdict", "judge"]
