"""The store's checks of scalar fields: each raises ValueError (or TypeError) naming the field and the value,
so a bad write fails in the caller before anything is queued."""

from __future__ import annotations

import math
from typing import Any, Mapping

from ..types import RolloutStatus


# ---- scalars -------------------------------------------------------------

INT_MAX = 2**63 - 1  # SQLite keeps integers as signed 64 bits: a larger one fails in the writer, after the caller moved on


def check_str(field: str, value: Any, *, optional: bool = False, empty: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str) or (not empty and not value):
        kind = "a string" if empty else "a non-empty string"
        raise ValueError(f"{field} must be {kind}, got {value!r:.200}")
    return value


def check_int(field: str, value: Any, *, optional: bool = False, minimum: int = 0) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{field} must be an integer >= {minimum}, got {value!r}")
    if value > INT_MAX:
        raise ValueError(f"{field} must be at most 2**63-1 (the store's integers are 64-bit), got {value!r}")
    return value


def check_float(field: str, value: Any, *, optional: bool = False, minimum: float | None = None) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {value!r}")
    return float(value)


def check_metrics(field: str, metrics: Any) -> dict[str, float]:
    if not isinstance(metrics, Mapping):
        raise ValueError(f"{field} must be a mapping of name to number, got {metrics!r}")
    out: dict[str, float] = {}
    for name, value in metrics.items():
        check_str(f"{field} key", name)
        out[name] = check_float(f"{field}[{name!r}]", value)
    return out


def status_of(field: str, value: Any) -> RolloutStatus:
    try:
        return RolloutStatus(value)
    except ValueError:
        known = ", ".join(s.value for s in RolloutStatus)
        raise ValueError(f"{field} must be one of {known}; got {value!r}") from None


def final_status(field: str, value: Any) -> RolloutStatus:
    """A final status (every status but running), or a ValueError naming the field."""
    final = status_of(field, value)
    if not final.is_final:
        known = ", ".join(s.value for s in RolloutStatus if s.is_final)
        raise ValueError(f"{field} must be a final status ({known}), got {value!r}")
    return final


def check_rollout_ids(field: str, rollout_ids: Any) -> list[str]:
    """At least one rollout id, each a non-empty string named at most once."""
    ids = list(rollout_ids)
    if not ids:
        raise ValueError(f"{field} must name at least one rollout, got []")
    for rollout_id in ids:
        check_str(f"{field}[]", rollout_id)
    if len(set(ids)) != len(ids):
        twice = sorted({r for r in ids if ids.count(r) > 1})
        raise ValueError(f"{field}: each id at most once, got duplicates {twice[:10]!r}")
    return ids


def check_call(field: str, call: Any, kind: type) -> None:
    """A recorded call (``ToolCall``, ``ModelCall``): an instance of ``kind`` that succeeded or failed."""
    if not isinstance(call, kind):
        raise ValueError(f"{field.replace('_', ' ')} must be a {kind.__name__}, got {call!r:.200}")
    if call.status not in ("success", "error"):
        raise ValueError(f"{field}.status must be 'success' or 'error', got {call.status!r}")


FIXED_ONCE_TRAINED = {
    "tool calls": "its tool calls are fixed",
    "model calls": "its model calls are fixed",
    "reward": "its reward is fixed",
}
"""What an update's training on a rollout freezes, and how a refused change says so (every backend, same words)."""


def check_untrained(rollout_id: str, trained_step: int | None, what: str) -> None:
    """Refuses a change to ``what`` (a key of ``FIXED_ONCE_TRAINED``) of a rollout an update trained on."""
    if trained_step is not None:
        raise ValueError(f"rollout {rollout_id!r} was trained at step {trained_step}; {FIXED_ONCE_TRAINED[what]}")


__all__ = ["FIXED_ONCE_TRAINED", "INT_MAX", "check_call", "check_float", "check_int", "check_metrics", "check_rollout_ids", "check_str",
           "check_untrained", "final_status", "status_of"]
