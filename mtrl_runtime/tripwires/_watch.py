"""The coordinator's tripwire watch: each live rollout's wires, checked as its tool calls are recorded.

``open`` takes the state checksums when a rollout is created; ``check_calls``
runs the call wires on each tool call the agent's adapter reports (training,
evaluation and ``mtrl serve`` alike: they all record through the
coordinator); ``close`` runs the answer wires on the final answer and the
state wires again, and returns every trip of the rollout. Each tripped
rollout's evidence is appended to ``<run_dir>/tripwires.jsonl`` and kept in
memory (the latest ``KEPT_ROLLOUTS``) for the run-stopping error. Thread-safe:
rollouts are created from worker threads while the server's loop records.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from ..types import Task, ToolCall
from ._settings import TripwireSettings
from ._wires import AnswerWire, CallWire, StateWire, Trip

_log = logging.getLogger("mtrl.tripwires")

KEPT_ROLLOUTS = 10_000  # tripped rollouts whose evidence stays in memory (the file keeps them all)


@dataclass
class _Open:
    task: Task
    snapshots: dict[str, str]
    trips: list[Trip] = field(default_factory=list)


class TripwireWatch:
    """Checks the run's tripwires on every live rollout (see the module docstring)."""

    def __init__(self, settings: TripwireSettings, evidence_path: str | Path | None = None) -> None:
        wires = settings.build()
        self.on_trip = settings.on_trip
        self.call_wires = [w for w in wires if isinstance(w, CallWire)]
        self.answer_wires = [w for w in wires if isinstance(w, AnswerWire)]
        self.state_wires = [w for w in wires if isinstance(w, StateWire)]
        self.evidence_path = Path(evidence_path) if evidence_path is not None else None
        self._open: dict[str, _Open] = {}
        self._tripped: OrderedDict[str, tuple[Trip, ...]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def reads_answers(self) -> bool:
        return bool(self.answer_wires)

    def open(self, rollout_id: str, task: Task) -> None:
        """Start watching a new rollout: its state checksums now."""
        snapshots = {w.name: w.snapshot(task) for w in self.state_wires}
        with self._lock:
            self._open[rollout_id] = _Open(task, snapshots)

    def check_calls(self, rollout_id: str, calls: Sequence[ToolCall]) -> list[Trip]:
        """Run the call wires on ``calls`` (just recorded); the trips they found, also kept for ``close``."""
        with self._lock:
            watched = self._open.get(rollout_id)
        if watched is None:
            return []
        found = []
        for call in calls:
            for wire in self.call_wires:
                evidence = wire.check_call(call, watched.task)
                if evidence is not None:
                    found.append(Trip(wire.name, wire.kind, evidence, call.name, call.turn_index))
        if found:
            with self._lock:
                watched.trips.extend(found)
        return found

    def close(self, rollout_id: str, answer: str | None = None) -> tuple[Trip, ...]:
        """The rollout ended: run the answer and state wires; every trip of the rollout, recorded if any."""
        with self._lock:
            watched = self._open.pop(rollout_id, None)
        if watched is None:
            return ()
        trips = list(watched.trips)
        for wire in self.answer_wires if answer else ():
            evidence = wire.check_answer(answer, watched.task)
            if evidence is not None:
                trips.append(Trip(wire.name, wire.kind, evidence))
        for wire in self.state_wires:
            before = watched.snapshots.get(wire.name)
            try:
                after = wire.snapshot(watched.task)
            except Exception as exc:  # the state could not be read back: unverified is not clean
                trips.append(Trip(wire.name, wire.kind, f"the state checksum could not be taken at the end: {exc!r}"))
                continue
            if after != before:
                trips.append(Trip(wire.name, wire.kind, f"environment state changed: checksum {before} -> {after}"))
        result = tuple(trips)
        if result:
            self._record(rollout_id, watched.task, result)
        return result

    def trips(self, rollout_id: str) -> tuple[Trip, ...]:
        """The trips of an ended rollout (among the latest ``KEPT_ROLLOUTS`` tripped), else ()."""
        with self._lock:
            return self._tripped.get(rollout_id, ())

    def _record(self, rollout_id: str, task: Task, trips: tuple[Trip, ...]) -> None:
        with self._lock:
            self._tripped[rollout_id] = trips
            while len(self._tripped) > KEPT_ROLLOUTS:
                self._tripped.popitem(last=False)
        _log.info("mtrl: rollout %s tripped %s", rollout_id, ", ".join(sorted({t.wire for t in trips})))
        if self.evidence_path is None:
            return
        record = {"time": time.time(), "rollout_id": rollout_id, "task_id": task.id,
                  "trips": [t.to_dict() for t in trips]}
        self.evidence_path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock, self.evidence_path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record, default=str) + "\n")


def trip_metrics(trips: Sequence[Trip]) -> dict[str, float]:
    """The rollout metrics a rollout's trips become: the flag ``tripwire_tripped`` and ``tripwire/<wire>`` counts."""
    if not trips:
        return {}
    out: dict[str, float] = {"tripwire_tripped": float(len(trips))}
    for trip in trips:
        key = f"{TRIP_METRIC_PREFIX}{trip.wire}"
        out[key] = out.get(key, 0.0) + 1.0
    return out


TRIP_METRIC_PREFIX = "tripwire/"
TRIPWIRE_ZEROED = "tripwire_zeroed"  # 1.0: on_trip zero set the reward to 0; a group judge keeps it there



class TripwireStop(RuntimeError):
    """A step's share of tripped rollouts passed ``advanced.tripwires.stop_rate``: the run stops, with the evidence."""

    def __init__(self, step: int, tripped: int, total: int, limit: float,
                 evidence: Sequence[tuple[str, Sequence[Trip]]], evidence_file: str | Path | None = None) -> None:
        self.step, self.tripped, self.total, self.limit = step, tripped, total, limit
        self.evidence = [(rid, tuple(trips)) for rid, trips in evidence]
        lines = [f"step {step}: {tripped} of {total} rollouts ({tripped / max(total, 1):.0%}) tripped tripwires, over "
                 f"advanced.tripwires.stop_rate {limit:g}; the run stopped before its next step"]
        for rid, trips in self.evidence[:10]:
            for trip in trips[:3]:
                lines.append(f"  rollout {rid}: {trip.wire} ({trip.kind}): {trip.evidence}")
        if len(self.evidence) > 10:
            lines.append(f"  ... and {len(self.evidence) - 10} more rollouts")
        if evidence_file is not None:
            lines.append(f"every trip with its evidence: {evidence_file}")
        super().__init__("\n".join(lines))


__all__ = ["KEPT_ROLLOUTS", "TRIPWIRE_ZEROED", "TRIP_METRIC_PREFIX", "TripwireStop", "TripwireWatch", "trip_metrics"]
