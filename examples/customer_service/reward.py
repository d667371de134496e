"""Reward and strict evaluation for the support task.

The agent answers with one JSON object inside ``<final_output>...</final_output>``:
``resolution`` (refund / replace / escalate / deny), ``refund_amount`` (the
amount refunded, else 0) and ``case_id``. Given the episode's session
snapshot, one more check compares what the agent *did* with what it
should have done: the amount the session actually refunded.

``reward`` is dense, so RL sees partial progress: 0.9 x the fraction of
checks passed + 0.1 x a valid format. ``strict_score`` is 1 only when the
answer parses strictly and every check passes exactly (type included: the
string "40" is not the number 40).
"""

from __future__ import annotations

import json
from types import MappingProxyType
from typing import Any, Mapping

from .data import RESOLUTIONS

FIELDS: tuple[str, ...] = ("resolution", "refund_amount", "case_id")
FIELD_WEIGHT = 0.9
FORMAT_WEIGHT = 0.1
REFUND_CHECK = "refund_issued"  # the session check's name in the metrics

_OPEN, _CLOSE = "<final_output>", "</final_output>"

# What a well-formed answer holds, field by field (the format term).
_WELL_FORMED = MappingProxyType({
    "resolution": lambda v: isinstance(v, str) and v in RESOLUTIONS,
    "refund_amount": lambda v: type(v) is int and v >= 0,
    "case_id": lambda v: isinstance(v, str) and bool(v),
})


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key in final_output: {keys}")
    return dict(pairs)


def parse_final_output(text: Any) -> dict[str, Any] | None:
    """The answer object, or None unless ``text`` holds exactly one well-formed block.

    Text around the block is allowed; two blocks, a missing or misspelled
    tag, or content that is not a JSON object with unique keys are not.
    """
    if not isinstance(text, str) or text.count(_OPEN) != 1 or text.count(_CLOSE) != 1:
        return None
    start, end = text.index(_OPEN) + len(_OPEN), text.index(_CLOSE)
    if end < start:
        return None
    try:
        value = json.loads(text[start:end], object_pairs_hook=_reject_duplicate_keys)
    except ValueError:  # a JSONDecodeError or a duplicate key
        return None
    return value if isinstance(value, dict) else None


def _same(value: Any, expected: Any) -> bool:
    """Exact match: equal and of the same type (True is not 1, "40" is not 40)."""
    return type(value) is type(expected) and value == expected


def _check_ground_truth(ground_truth: Any) -> None:
    if not isinstance(ground_truth, Mapping):
        raise ValueError(f"ground_truth must be a mapping with {list(FIELDS)}, got {ground_truth!r}")
    missing = [name for name in FIELDS if name not in ground_truth]
    if missing:
        raise ValueError(f"ground_truth lacks field(s) {missing}; it has {sorted(ground_truth)}")


def checks(text: str, ground_truth: Mapping[str, Any],
           session: Mapping[str, Any] | None = None) -> dict[str, bool]:
    """Each check by name: the three fields, plus ``refund_issued`` when a session snapshot is given."""
    _check_ground_truth(ground_truth)
    answer = parse_final_output(text)
    result = {name: answer is not None and name in answer and _same(answer[name], ground_truth[name])
              for name in FIELDS}
    if session is not None:
        refunded = session.get("refunded", 0)
        result[REFUND_CHECK] = answer is not None and _same(refunded, ground_truth["refund_amount"])
    return result


def format_ok(text: str) -> bool:
    """One parsable block holding every field, each with a value of the allowed kind."""
    answer = parse_final_output(text)
    return answer is not None and all(name in answer and _WELL_FORMED[name](answer[name]) for name in FIELDS)


def reward(text: str, ground_truth: Mapping[str, Any],
           session: Mapping[str, Any] | None = None) -> tuple[float, dict[str, float]]:
    """Dense reward for the final message: 0.9 x checks passed + 0.1 x format valid.

    Metrics: ``field_acc/<check>`` per check, ``field_acc`` (their mean),
    ``format_ok``, ``completion`` (an answer block was found) and ``strict``.
    """
    passed = checks(text, ground_truth, session)
    metrics = {f"field_acc/{name}": float(ok) for name, ok in passed.items()}
    field_acc = sum(passed.values()) / len(passed)
    well_formed = format_ok(text)
    metrics.update({
        "field_acc": field_acc,
        "format_ok": float(well_formed),
        "completion": float(parse_final_output(text) is not None),
        "strict": float(all(passed.values())),
    })
    return FIELD_WEIGHT * field_acc + FORMAT_WEIGHT * float(well_formed), metrics


def strict_score(text: str, ground_truth: Mapping[str, Any], session: Mapping[str, Any] | None = None) -> float:
    """1.0 when the answer parses strictly and every check passes exactly, else 0.0."""
    return float(all(checks(text, ground_truth, session).values()))


def format_answer(answer: Mapping[str, Any]) -> str:
    """The canonical final message for ``answer``: the three fields in a final_output block."""
    return f"{_OPEN}{json.dumps({name: answer[name] for name in FIELDS})}{_CLOSE}"


__all__ = [
    "FIELDS",
    "FIELD_WEIGHT",
    "FORMAT_WEIGHT",
    "REFUND_CHECK",
    "checks",
    "format_answer",
    "format_ok",
    "parse_final_output",
    "reward",
    "strict_score",
]
