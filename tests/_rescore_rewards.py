"""Reward functions over a stored ``Trajectory`` for tests/test_rescore.py (named on the command line as file:fn)."""

from __future__ import annotations

import math
from typing import Any


def original(trajectory: Any) -> tuple[float, dict[str, float]]:
    """What the test run's agent reported (``_eval_agents.answer_score``), read off the stored trajectory."""
    text = trajectory.final_answer
    return float("ANSWER 42" in text), {"answered": float(text.startswith("ANSWER"))}


def lenient(trajectory: Any) -> float:
    """Any case: ``answer 42`` counts too (the loophole a strict scorer catches)."""
    return float("answer 42" in trajectory.final_answer.lower())


def not_a_number(trajectory: Any) -> float:
    return math.nan


def broken(trajectory: Any) -> float:
    return trajectory.no_such_field
