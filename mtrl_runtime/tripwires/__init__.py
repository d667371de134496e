"""Live reward-hack tripwires: what a rollout must never do, checked as its tool calls are recorded.

Declared in the config (``advanced.tripwires``, ``TripwireSettings``) or in
code next to the environment (``StateCheck``, ``ForbiddenCallWhere``, or
the config kinds as objects, named by ``advanced.tripwires.code``). The
coordinator runs a ``TripwireWatch``; a tripped rollout carries the flag
``tripwire_tripped`` and ``tripwire/<wire>`` counts in its metrics, its
reward is zeroed (or kept), and the evidence goes to
``<run_dir>/tripwires.jsonl``. docs/tripwires.md tells the whole story.
"""

from ._settings import TripwireSettings, load_code_wires
from ._watch import KEPT_ROLLOUTS, TRIP_METRIC_PREFIX, TRIPWIRE_ZEROED, TripwireStop, TripwireWatch, trip_metrics, unreported_calls
from ._wires import (
    EVIDENCE_CHARS,
    WIRE_KINDS,
    AnswerLeak,
    AnswerWire,
    CallWire,
    ForbiddenCall,
    ForbiddenCallWhere,
    Honeypot,
    StateCheck,
    StateWire,
    Trip,
    Wire,
    contains_reference,
)

__all__ = [
    "EVIDENCE_CHARS",
    "KEPT_ROLLOUTS",
    "TRIPWIRE_ZEROED",
    "TRIP_METRIC_PREFIX",
    "WIRE_KINDS",
    "AnswerLeak",
    "AnswerWire",
    "CallWire",
    "ForbiddenCall",
    "ForbiddenCallWhere",
    "Honeypot",
    "StateCheck",
    "StateWire",
    "Trip",
    "TripwireSettings",
    "TripwireStop",
    "TripwireWatch",
    "Wire",
    "contains_reference",
    "load_code_wires",
    "trip_metrics",
    "unreported_calls",
]
