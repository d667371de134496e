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
from typing import Any, Sequence

from ..types import Rollout, Task, ToolCall
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
    def reads_turns(self) -> bool:
        """Whether closing a rollout needs its turns: the answer wires read the last reply, the call wires the
        calls the model asked for that no adapter reported."""
        return bool(self.answer_wires or self.call_wires)

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

    def close(self, rollout_id: str, answer: str | None = None, unreported: Sequence[ToolCall] = ()) -> tuple[Trip, ...]:
        """The rollout ended: run the answer and state wires; every trip of the rollout, recorded if any.

        ``unreported``: the tool calls the model asked for that no adapter reported (an agent without mtrl's
        adapters, SageMaker's): the call wires run on them too, their results read from the conversation.
        """
        with self._lock:
            watched = self._open.pop(rollout_id, None)
        if watched is None:
            return ()
        trips = list(watched.trips)
        for call in unreported:
            for wire in self.call_wires:
                evidence = wire.check_call(call, watched.task)
                if evidence is not None:
                    trips.append(Trip(wire.name, wire.kind, evidence + " (asked by the model; no adapter reported it)",
                                      call.name, call.turn_index))
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


def unreported_calls(rollout: Rollout) -> list[ToolCall]:
    """The tool calls the rollout's model asked for (its turns) that no adapter reported, each with the result the
    conversation's later ``tool`` message gave it (None when none came)."""
    reported = {c.call_id for c in rollout.tool_calls if c.call_id}
    reported_by_value = {_key(c.name, c.arguments) for c in rollout.tool_calls}  # an adapter's report without an id
    turns = sorted(rollout.turns, key=lambda t: t.index)
    results: dict[str, Any] = {}
    for turn in turns:
        for message in turn.messages:
            if message.get("role") == "tool" and message.get("tool_call_id"):
                results[str(message["tool_call_id"])] = message.get("content")
    out = []
    for turn in turns:
        for call in turn.tool_calls:
            call_id = str(call.get("id") or "")
            if call_id and call_id in reported:
                continue
            function = call.get("function") or {}
            arguments: Any = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    arguments = json.loads(arguments)
                except ValueError:
                    pass  # not JSON: the wires check the text as the model wrote it (nothing is dropped)
            name = str(function.get("name", ""))
            if _key(name, arguments) in reported_by_value:
                continue
            out.append(ToolCall(rollout_id=rollout.id, name=name, arguments=arguments,
                                call_id=call_id or None, result=results.get(call_id), turn_index=turn.index))
    return out


def _key(name: str, arguments: Any) -> tuple[str, str]:
    return name, json.dumps(arguments, sort_keys=True, default=str)


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


__all__ = ["KEPT_ROLLOUTS", "TRIPWIRE_ZEROED", "TRIP_METRIC_PREFIX", "TripwireStop", "TripwireWatch", "trip_metrics",
           "unreported_calls"]
