"""The values an agent hands to mtrl, checked and made sendable: rewards and metrics, tool results, sampling
fields, the ids of the policy's models. A bad value raises naming its field."""

from __future__ import annotations

import json
import numbers
from typing import Any, Mapping

from .wire import RewardReport

MAX_RESULT_CHARS = 65536  # a tool result longer than this is cut (the store keeps what the model saw, bounded)


def policy_model_ids(value: Any) -> frozenset[str] | None:
    """``policy_models`` as a set of model ids (None stays None: ``_policy_rule``'s unnamed rule); bad values raise.

    A mapping of roles to model ids (``{"planner": "plan-model", "worker": "work-model"}``) names its values: the
    coordinator tells the roles apart by the model id each call names."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    elif isinstance(value, Mapping):
        value = list(value.values())
    ids = frozenset(value)
    if not ids or not all(isinstance(m, str) and m for m in ids):
        raise ValueError(f"policy_models must be a non-empty list of model ids (strings), got {value!r}")
    return ids


def sampling_fields(sampling: Any) -> dict[str, Any]:
    """OpenAI request fields from a ``SamplingParams``-like object or mapping (None fields dropped)."""
    if sampling is None:
        return {}
    names = ("temperature", "top_p", "max_tokens", "seed")
    if isinstance(sampling, Mapping):
        values = {n: sampling.get(n) for n in names}
        values["max_tokens"] = values["max_tokens"] or sampling.get("maxTokens")
        values["top_p"] = values["top_p"] if values["top_p"] is not None else sampling.get("topP")
    else:
        values = {n: getattr(sampling, n, None) for n in names}
    return {k: v for k, v in values.items() if v is not None}


def reward_report(reward: Any, metrics: Mapping[str, float] | None,
                  role_rewards: Mapping[str, float] | None = None) -> RewardReport:
    """Validate ``update_reward``'s arguments into a report; bad values raise naming the field."""
    clean_metrics = {str(k): _real(f"metrics[{k!r}]", v) for k, v in dict(metrics or {}).items()}
    if role_rewards is not None and not isinstance(role_rewards, Mapping):
        raise TypeError(f"role_rewards must be a mapping of role names to floats, got {role_rewards!r}")
    roles = None if role_rewards is None else {
        str(k): _real(f"role_rewards[{k!r}]", v) for k, v in role_rewards.items()}
    try:
        if isinstance(reward, (list, tuple)):
            turn_rewards = [_real(f"turn_rewards[{i}]", r) for i, r in enumerate(reward)]
            return RewardReport(turn_rewards=turn_rewards, metrics=clean_metrics, role_rewards=roles)
        return RewardReport(reward=_real("reward", reward), metrics=clean_metrics, role_rewards=roles)
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        raise ValueError(_first_error(exc)) from None


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a float, got {value!r}")
    return float(value)


def _first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        return "; ".join(str(e.get("msg", "")).removeprefix("Value error, ") for e in errors())
    return str(exc)


def jsonable(value: Any) -> Any:
    """``value`` if it round-trips through JSON (strings cut to MAX_RESULT_CHARS), else its text."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value[:MAX_RESULT_CHARS]
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        return str(value)[:MAX_RESULT_CHARS]
    return value if len(text) <= MAX_RESULT_CHARS else text[:MAX_RESULT_CHARS]


__all__ = ["MAX_RESULT_CHARS", "jsonable", "policy_model_ids", "reward_report", "sampling_fields"]
