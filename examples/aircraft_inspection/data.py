"""Deterministic generator of the aircraft fixtures and task instances.

Every aircraft has a hidden state (registration, hours since the last check,
mechanical and electrical findings, open incidents); the fixtures are that
state as the tools see it, and each instance's ground truth is computed from
the same state by the SOP rules. The tools and the reference solver take the
other road (tool outputs -> SOP), and the tests check both roads agree.

Labels are balanced by construction: about a fifth of the aircraft pass every
check (release), the rest fail one or two checks, spread evenly, so that no
constant answer scores well.

Regenerate the committed files with ``python -m examples.aircraft_inspection``
(``--check`` only compares).
"""

from __future__ import annotations

import csv
import io
import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from .._datafiles import data_main, read_split, split_instances, stale_paths, write_files

PACKAGE_DIR = Path(__file__).resolve().parent
SEED = 1729
SPLIT_SIZES: Mapping[str, int] = {"train": 100, "val": 25, "test": 25}

# The five SOP checks, named by the answer field each one decides.
CHECKS = ("aircraft_valid", "maintenance_due", "mechanical_status", "electrical_status", "incident_flag")
N_ALL_PASS = 30  # aircraft with no failing check (decision "release")
N_PER_SINGLE = 17  # aircraft failing exactly one check, per check

TYPES = ("ATR72", "A320", "B737", "E175", "DHC8", "CRJ9")
REQUESTS = ("pre-flight check", "overnight check", "return to service", "post-maintenance check")
MECHANICAL_FINDINGS = ("brake_wear", "tire_cut", "hydraulic_leak", "gear_corrosion", "loose_panel")
ELECTRICAL_FINDINGS = ("generator_fault", "chafed_wiring", "battery_low", "bus_short")
INCIDENTS = ("bird_strike", "hard_landing", "tail_strike", "lightning_strike")
_TAIL_LETTERS = "ABCDEFGHJKLMNPQRSTUVWXYZ"  # no I or O: they read as 1 and 0



@dataclass(frozen=True)
class AircraftState:
    """The hidden truth about one aircraft, from which fixtures and ground truth both follow."""

    tail_number: str
    type: str
    registration: str  # "current" | "expired"
    hours_since_check: int
    hours_limit: int
    mechanical_status: str  # "pass" | "fail"
    mechanical_finding: str
    electrical_status: str
    electrical_finding: str
    open_incidents: int
    last_incident: str
    request: str


def ground_truth(state: AircraftState) -> dict[str, Any]:
    """The six answer fields, by the SOP rules applied to the hidden state."""
    truth = {
        "aircraft_valid": state.registration == "current",
        "maintenance_due": state.hours_since_check >= state.hours_limit,
        "mechanical_status": state.mechanical_status,
        "electrical_status": state.electrical_status,
        "incident_flag": state.open_incidents > 0,
    }
    release = (truth["aircraft_valid"] and not truth["maintenance_due"]
               and truth["mechanical_status"] == "pass" and truth["electrical_status"] == "pass"
               and not truth["incident_flag"])
    truth["decision"] = "release" if release else "ground"
    return truth


def _failure_patterns(rng: random.Random, total: int) -> list[frozenset[str]]:
    """Which checks fail, per aircraft: all-pass, each single check, then pairs in turn."""
    patterns = [frozenset()] * N_ALL_PASS
    for check in CHECKS:
        patterns += [frozenset({check})] * N_PER_SINGLE
    pairs = [frozenset(pair) for pair in itertools.combinations(CHECKS, 2)]
    rng.shuffle(pairs)
    patterns += [pairs[i % len(pairs)] for i in range(total - len(patterns))]
    rng.shuffle(patterns)
    return patterns


def _tail_numbers(rng: random.Random, count: int) -> list[str]:
    tails: set[str] = set()
    while len(tails) < count:
        tail = f"N{rng.randint(100, 999)}{rng.choice(_TAIL_LETTERS)}{rng.choice(_TAIL_LETTERS)}"
        if tail not in EXAMPLE_TAILS:
            tails.add(tail)
    return sorted(tails)


def _state(rng: random.Random, tail: str, failing: frozenset[str]) -> AircraftState:
    limit = rng.choice((400, 500, 600))
    due = "maintenance_due" in failing
    hours = limit + rng.randint(0, 80) if due else rng.randint(limit // 4, limit - 10)
    mech_fail = "mechanical_status" in failing
    elec_fail = "electrical_status" in failing
    incident = "incident_flag" in failing
    return AircraftState(
        tail_number=tail,
        type=rng.choice(TYPES),
        registration="expired" if "aircraft_valid" in failing else "current",
        hours_since_check=hours,
        hours_limit=limit,
        mechanical_status="fail" if mech_fail else "pass",
        mechanical_finding=rng.choice(MECHANICAL_FINDINGS) if mech_fail else "none",
        electrical_status="fail" if elec_fail else "pass",
        electrical_finding=rng.choice(ELECTRICAL_FINDINGS) if elec_fail else "none",
        open_incidents=rng.randint(1, 2) if incident else 0,
        last_incident=rng.choice(INCIDENTS) if incident else "none",
        request=rng.choice(REQUESTS),
    )


# The worked examples' aircraft: in the fixtures, never an instance. A tiny model
# copies the example's answer values (teacher-forced, SmolLM2-135M gave the
# example's "fail" ~98% where the tools said "pass"), so the default example fails
# only a boolean check (an open incident): it shows the grounding rule, biases
# no pass/fail field, and keeps both decisions likely enough to be sampled.
# "release" passes every check: copying it is right for every all-pass aircraft
# but makes "ground" very unlikely (about e^-10 at the report step).
EXAMPLE_STATES: Mapping[str, AircraftState] = MappingProxyType({
    "ground": AircraftState(
        tail_number="N100EX", type="DHC8", registration="current", hours_since_check=410,
        hours_limit=600, mechanical_status="pass", mechanical_finding="none",
        electrical_status="pass", electrical_finding="none", open_incidents=1,
        last_incident="bird_strike", request="pre-flight check",
    ),
    "release": AircraftState(
        tail_number="N101EX", type="E175", registration="current", hours_since_check=230,
        hours_limit=500, mechanical_status="pass", mechanical_finding="none",
        electrical_status="pass", electrical_finding="none", open_incidents=0,
        last_incident="none", request="overnight check",
    ),
})
DEFAULT_EXAMPLE = "ground"
EXAMPLE_TAILS = frozenset(state.tail_number for state in EXAMPLE_STATES.values())


def request_text(state: AircraftState) -> str:
    """The user's request for one aircraft, as the agent receives it.

    The closing hint names the first step line: without it SmolLM2-135M
    often goes on from the worked example's numbering ("Step 8: ...") or
    opens its first turn with ``<tool_response>`` instead of a call.
    """
    return (f"Inspect aircraft {state.tail_number} ({state.request}) and decide release or ground. "
            "Start with Step 1: validate_aircraft.")


def instance(state: AircraftState, split: str, index: int) -> dict[str, Any]:
    """One task row: id, split, the request as prompt, the six-field ground truth, the tail number."""
    return {
        "id": f"aircraft-{split}-{index:03d}",
        "split": split,
        "prompt": request_text(state),
        "ground_truth": ground_truth(state),
        "data": {"tail_number": state.tail_number, "request": state.request},
    }


def _csv(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


def _fixture_files(states: Sequence[AircraftState], seed: int) -> dict[str, str]:
    states = sorted(states, key=lambda s: s.tail_number)  # table order says nothing about splits
    return {
        "fixtures/aircraft.csv": _csv(
            ("tail_number", "type", "registration"),
            [(s.tail_number, s.type, s.registration) for s in states]),
        "fixtures/maintenance.csv": _csv(
            ("tail_number", "hours_since_check", "hours_limit"),
            [(s.tail_number, s.hours_since_check, s.hours_limit) for s in states]),
        "fixtures/mechanical.csv": _csv(
            ("tail_number", "status", "finding"),
            [(s.tail_number, s.mechanical_status, s.mechanical_finding) for s in states]),
        "fixtures/electrical.csv": _csv(
            ("tail_number", "status", "finding"),
            [(s.tail_number, s.electrical_status, s.electrical_finding) for s in states]),
        "fixtures/incidents.csv": _csv(
            ("tail_number", "open_incidents", "last_incident"),
            [(s.tail_number, s.open_incidents, s.last_incident) for s in states]),
        "fixtures/meta.json": json.dumps(
            {"seed": seed, "aircraft": len(states), "example_tails": sorted(EXAMPLE_TAILS)}, indent=2) + "\n",
    }


def generate(seed: int = SEED) -> dict[str, str]:
    """Every committed data file as text, keyed by its path relative to this package."""
    rng = random.Random(seed)
    total = sum(SPLIT_SIZES.values())
    tails = _tail_numbers(rng, total)
    rng.shuffle(tails)
    states = [_state(rng, tail, failing) for tail, failing in zip(tails, _failure_patterns(rng, total))]
    return {**_fixture_files([*states, *EXAMPLE_STATES.values()], seed),
            **split_instances(states, SPLIT_SIZES, instance)}


def write(root: Path = PACKAGE_DIR, seed: int = SEED) -> list[Path]:
    """Write the generated files under ``root``; returns the paths written."""
    return write_files(generate(seed), root)


def load_instances(split: str, root: Path = PACKAGE_DIR) -> list[dict[str, Any]]:
    """The committed instances of one split (train, val or test)."""
    return read_split(root, split, SPLIT_SIZES)


def example_instance(name: str = DEFAULT_EXAMPLE) -> dict[str, Any]:
    """A worked example's row (same shape as an instance, split "example"): "ground" or "release"."""
    if name not in EXAMPLE_STATES:
        raise ValueError(f"unknown example {name!r}; known: {', '.join(EXAMPLE_STATES)}")
    return instance(EXAMPLE_STATES[name], "example", 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Regenerate the committed files, or with ``--check`` report whether they are up to date."""
    return data_main(argv, "examples.aircraft_inspection", write, lambda: stale_paths(generate(), PACKAGE_DIR))
