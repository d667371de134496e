"""Reward and strict evaluation for the aircraft inspection task.

The agent answers with one JSON object inside ``<final_output>...</final_output>``.
``reward`` is dense so that RL sees partial progress: 0.9 x the fraction of
fields correct + 0.1 x a valid format. ``strict_score`` is 1 only when the
answer parses strictly and every field matches exactly (type included: the
string "true" is not the boolean true).

``lenient_reward`` is deliberately loose (no tags needed, key=value text,
any case). It exists to show that an evaluator comparing a lenient reward
with the strict score catches the answers a loose checker would let through.
"""

from __future__ import annotations

import json
import re
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from .tools import SOP_ORDER

# name -> the values the SOP allows, in the type the JSON answer must use
FIELD_VALUES: Mapping[str, tuple[Any, ...]] = MappingProxyType(
    {
        "aircraft_valid": (True, False),
        "maintenance_due": (True, False),
        "mechanical_status": ("pass", "fail"),
        "electrical_status": ("pass", "fail"),
        "incident_flag": (True, False),
        "decision": ("release", "ground"),
    }
)
FIELDS: tuple[str, ...] = tuple(FIELD_VALUES)

# The difficulty knob: smaller answers give a tiny model an easier foothold.
FIELD_SETS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "full": FIELDS,
        "three": ("mechanical_status", "electrical_status", "decision"),
        "decision": ("decision",),
    }
)

FIELD_WEIGHT = 0.9
FORMAT_WEIGHT = 0.1

_OPEN, _CLOSE = "<final_output>", "</final_output>"


def check_fields(fields: Sequence[str]) -> tuple[str, ...]:
    """Return ``fields`` as a tuple, or raise naming the first unknown or repeated field."""
    fields = tuple(fields)
    if not fields:
        raise ValueError("fields must name at least one field; got an empty sequence")
    for name in fields:
        if name not in FIELD_VALUES:
            raise ValueError(f"unknown field {name!r} in fields; known: {', '.join(FIELDS)}")
    if len(set(fields)) != len(fields):
        raise ValueError(f"fields repeats a name: {list(fields)}")
    return fields


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError(f"duplicate key in final_output: {keys}")
    return dict(pairs)


def parse_final_output(text: str) -> dict[str, Any] | None:
    """The answer object, or None unless ``text`` holds exactly one well-formed block.

    Text before and after the block is allowed; two blocks, a missing or
    misspelled tag, or content that is not a JSON object (with unique keys)
    are not.
    """
    if not isinstance(text, str) or text.count(_OPEN) != 1 or text.count(_CLOSE) != 1:
        return None
    start, end = text.index(_OPEN) + len(_OPEN), text.index(_CLOSE)
    if end < start:
        return None
    try:
        value = json.loads(text[start:end], object_pairs_hook=_reject_duplicate_keys)
    except ValueError:  # json.JSONDecodeError is a ValueError, as is a duplicate key
        return None
    return value if isinstance(value, dict) else None


def _same(value: Any, expected: Any) -> bool:
    """Exact match: equal and of the same type (True is not 1, "true" is not True)."""
    return type(value) is type(expected) and value == expected


def _allowed(name: str, value: Any) -> bool:
    return any(_same(value, option) for option in FIELD_VALUES[name])


def _score(answer: Mapping[str, Any] | None, ground_truth: Mapping[str, Any],
           fields: tuple[str, ...], same: Any) -> tuple[float, dict[str, float]]:
    """Dense score and metrics for an already parsed answer (None: nothing parsed)."""
    metrics: dict[str, float] = {}
    for name in fields:
        ok = answer is not None and name in answer and same(answer[name], ground_truth[name])
        metrics[f"field_acc/{name}"] = float(ok)
    field_acc = sum(metrics[f"field_acc/{name}"] for name in fields) / len(fields)
    metrics["field_acc"] = field_acc
    return field_acc, metrics


def _check_ground_truth(ground_truth: Mapping[str, Any], fields: tuple[str, ...]) -> None:
    missing = [name for name in fields if name not in ground_truth]
    if missing:
        raise ValueError(f"ground_truth lacks field(s) {missing}; it has {sorted(ground_truth)}")


def reward(text: str, ground_truth: Mapping[str, Any],
           fields: Sequence[str] = FIELDS) -> tuple[float, dict[str, float]]:
    """Dense reward for the agent's final message: 0.9 x fields correct + 0.1 x format valid.

    Metrics: ``field_acc/<name>`` per field, ``field_acc``, ``format_ok``
    (every asked field present with an allowed value) and ``strict``.
    """
    fields = check_fields(fields)
    _check_ground_truth(ground_truth, fields)
    answer = parse_final_output(text)
    field_acc, metrics = _score(answer, ground_truth, fields, _same)
    format_ok = answer is not None and all(
        name in answer and _allowed(name, answer[name]) for name in fields
    )
    metrics["format_ok"] = float(format_ok)
    metrics["strict"] = float(field_acc == 1.0)  # every field exact: the strict score
    return FIELD_WEIGHT * field_acc + FORMAT_WEIGHT * float(format_ok), metrics


def strict_score(text: str, ground_truth: Mapping[str, Any], fields: Sequence[str] = FIELDS) -> float:
    """1.0 when the answer parses strictly and every asked field matches exactly, else 0.0."""
    fields = check_fields(fields)
    _check_ground_truth(ground_truth, fields)
    answer = parse_final_output(text)
    return float(answer is not None and all(
        name in answer and _same(answer[name], ground_truth[name]) for name in fields
    ))


def strict_turn_scores(rollout: Any, task: Any) -> list[float]:
    """Per-turn labels for auditing a per-turn judge: turn k of the SOP calls its step's tool (``SOP_ORDER[k]``)
    on the task's aircraft, once; the turn after the last step answers strictly right. 1.0 or 0.0 per turn."""
    tail = str((task.data or {}).get("tail_number", "")).upper()
    truth = task.ground_truth
    fields = tuple(truth) if isinstance(truth, Mapping) else FIELDS
    scores = []
    for k, turn in enumerate(sorted(rollout.turns, key=lambda t: t.index)):
        if k < len(SOP_ORDER):
            calls = [c.get("function", {}) for c in turn.tool_calls]
            right = len(calls) == 1 and calls[0].get("name") == SOP_ORDER[k] and tail in str(calls[0].get("arguments"))
            scores.append(float(right))
        else:
            scores.append(strict_score(turn.completion_text, truth, fields) if not turn.tool_calls else 0.0)
    return scores


# --- the deliberately lenient variant -------------------------------------------------

_TAG_BLOCK = re.compile(r"<\s*final[_ ]?output\s*>(.*?)<\s*/\s*final[_ ]?output\s*>", re.I | re.S)
_JSON_OBJECT = re.compile(r"\{.*?\}", re.S)
_KEY_VALUE = re.compile(r"[\"']?([A-Za-z_]+)[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9_]+)")
_TRUTHY = {"true", "yes", "1", "y"}
_FALSY = {"false", "no", "0", "n"}


def _loose(value: Any) -> Any:
    """Normalize a value the lenient way: any case, yes/no and "true"/"false" as booleans."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().strip("\"'").lower()
    if text in _TRUTHY:
        return True
    if text in _FALSY:
        return False
    return text


def lenient_parse(text: str) -> dict[str, Any] | None:
    """Whatever answer can be found: the last tag block, else a JSON object, else key=value pairs."""
    if not isinstance(text, str):
        return None
    blocks = _TAG_BLOCK.findall(text)
    body = blocks[-1] if blocks else text
    for candidate in _JSON_OBJECT.findall(body):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(value, dict):
            return {str(key).lower(): val for key, val in value.items()}
    pairs = {key.lower(): val for key, val in _KEY_VALUE.findall(body)}
    return pairs or None


def lenient_reward(text: str, ground_truth: Mapping[str, Any],
                   fields: Sequence[str] = FIELDS) -> tuple[float, dict[str, float]]:
    """Same formula as ``reward`` under a loose parser; over-rewards malformed answers on purpose."""
    fields = check_fields(fields)
    _check_ground_truth(ground_truth, fields)
    answer = lenient_parse(text)
    field_acc, metrics = _score(answer, ground_truth, fields, lambda a, b: _loose(a) == _loose(b))
    format_ok = answer is not None and all(name in answer for name in fields)
    metrics["format_ok"] = float(format_ok)
    return FIELD_WEIGHT * field_acc + FORMAT_WEIGHT * float(format_ok), metrics


def format_answer(answer: Mapping[str, Any], fields: Sequence[str] = FIELDS) -> str:
    """The canonical final message for ``answer``: the asked fields in a final_output block."""
    fields = check_fields(fields)
    return f"{_OPEN}{json.dumps({name: answer[name] for name in fields})}{_CLOSE}"


__all__ = [
    "FIELDS",
    "FIELD_SETS",
    "FIELD_VALUES",
    "check_fields",
    "format_answer",
    "lenient_parse",
    "lenient_reward",
    "parse_final_output",
    "reward",
    "strict_score",
    "strict_turn_scores",
]
