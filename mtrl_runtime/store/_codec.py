"""Validation and encoding between the contract's dataclasses and the store's rows, for every backend.

Every ``encode_*`` checks its input (with ``_checks``' scalar checks) and
raises ValueError naming the field and the value, so a bad write fails in
the caller before anything is queued; every ``decode_*`` turns a row back
into the dataclass. Each backend writes
through them (``sqlite`` into its tables, ``memory`` into dicts), so all of
them refuse the same values with the same messages and read back the same
values (JSON text in, JSON values out).
Token ids are stored as little-endian uint32 bytes and logprobs as
little-endian float64 bytes: 4 and 8 bytes a token against ~6 and ~20 for
JSON, and float64 keeps every Python float exact.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from array import array
from typing import Any, Iterable, NamedTuple

import orjson

from ..types import BreakReason, Rollout, RolloutStatus, Task, ToolCall, Turn
from ._checks import check_call, check_float, check_int, check_metrics, check_str, status_of

_SWAP = sys.byteorder != "little"  # blobs are little-endian on every machine
_MAX_ID = 2**32 - 1
_IDS = "I"  # uint32; array itself rejects negative and too large ids
_HEX_DIGITS = frozenset("0123456789abcdef")


# ---- JSON and blobs --------------------------------------------------------


def dumps(field: str, value: Any) -> str:
    """Compact, strict JSON (no NaN or Infinity), or a ValueError naming the field.

    orjson writes it, ten times faster than the json module (a turn's
    messages and tools are on the endpoint's hot path). What orjson would not
    write back exactly (NaN and infinities become null, a tuple a list, a
    dataclass an object) reads back unequal and goes through the json module,
    which refuses or writes it as it always did.
    """
    try:
        text = orjson.dumps(value)
        if orjson.loads(text) == value:
            return text.decode()
    except TypeError:  # orjson.JSONEncodeError: non-string keys, unknown types, 64-bit overflow
        pass
    try:
        return json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{field} must be JSON-serializable: {exc}; got {value!r:.200}") from None


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def ids_array(field: str, ids: Iterable[int]) -> array:
    """Token ids as a uint32 array; ids must lie in [0, 2**32)."""
    try:
        return array(_IDS, ids)
    except (TypeError, OverflowError) as exc:
        raise ValueError(f"{field} must be integers in [0, {_MAX_ID}]: {exc}; got {ids!r:.200}") from None


def floats_array(field: str, values: Iterable[float]) -> array:
    """Finite floats as a float64 array."""
    try:
        arr = array("d", values)
    except TypeError as exc:
        raise ValueError(f"{field} must be finite numbers: {exc}; got {values!r:.200}") from None
    if not math.isfinite(sum(arr)):  # fast path; locate the culprit only when needed
        for i, x in enumerate(arr):
            if not math.isfinite(x):
                raise ValueError(f"{field}[{i}] must be a finite number, got {x!r}")
    return arr


def to_blob(arr: array) -> bytes:
    if _SWAP:
        arr = array(arr.typecode, arr)
        arr.byteswap()
    return arr.tobytes()


def empty_ids() -> array:
    return array(_IDS)


def ids_from_blob(blob: bytes) -> array:
    return from_blob(_IDS, blob)


def from_blob(typecode: str, blob: bytes) -> array:
    arr = array(typecode)
    arr.frombytes(blob)
    if _SWAP:
        arr.byteswap()
    return arr


# ---- rows ----------------------------------------------------------------


class TurnRow(NamedTuple):
    """A validated turn; ``prompt_ids`` is kept as an array so the writer can share its prefix."""

    rollout_id: str
    index: int
    messages: str
    tools: str
    prompt_ids: array
    completion_ids: bytes
    logprobs: bytes
    finish_reason: str
    completion_text: str
    tool_calls: str
    policy_version: int
    segment: int
    break_reason: str | None
    malformed_tool_call: int
    started_at: float
    latency_s: float
    reasoning: str | None
    reasoning_tokens: int
    model: str | None
    token_versions: bytes | None  # uint32 LE, one per completion id; None: every id is policy_version's
    role: str | None


def encode_task(task: Task) -> tuple:
    if not isinstance(task, Task):
        raise ValueError(f"task must be a Task, got {task!r:.200}")
    check_str("task.id", task.id)
    check_str("task.prompt", task.prompt, optional=True, empty=True)
    messages = None if task.messages is None else dumps("task.messages", list(task.messages))
    if task.prompt is None and task.messages is None:
        raise ValueError(f"task {task.id!r}: give prompt or messages, got neither")
    return (
        task.id,
        task.prompt,
        messages,
        dumps("task.ground_truth", task.ground_truth),
        check_str("task.split", task.split),
        dumps("task.data", dict(task.data)),
    )


def decode_task(row: tuple) -> Task:
    id_, prompt, messages, ground_truth, split, data = row
    msgs = loads(messages)
    return Task(
        id=id_,
        prompt=prompt,
        messages=None if msgs is None else tuple(msgs),
        ground_truth=loads(ground_truth),
        split=split,
        data=loads(data),
    )


def encode_turn(turn: Turn) -> TurnRow:
    if not isinstance(turn, Turn):
        raise ValueError(f"turn must be a Turn, got {turn!r:.200}")
    completion_ids = ids_array("turn.completion_ids", turn.completion_ids)
    logprobs = floats_array("turn.logprobs", turn.logprobs)
    if len(logprobs) != len(completion_ids):
        raise ValueError(
            f"turn.logprobs must have one value per completion id: "
            f"{len(logprobs)} logprobs for {len(completion_ids)} ids"
        )
    if turn.break_reason is not None and not isinstance(turn.break_reason, BreakReason):
        raise ValueError(f"turn.break_reason must be a BreakReason or None, got {turn.break_reason!r}")
    return TurnRow(
        rollout_id=check_str("turn.rollout_id", turn.rollout_id),
        index=check_int("turn.index", turn.index),
        messages=dumps("turn.messages", list(turn.messages)),
        tools=dumps("turn.tools", list(turn.tools)),
        prompt_ids=ids_array("turn.prompt_ids", turn.prompt_ids),
        completion_ids=to_blob(completion_ids),
        logprobs=to_blob(logprobs),
        finish_reason=check_str("turn.finish_reason", turn.finish_reason),
        completion_text=check_str("turn.completion_text", turn.completion_text, empty=True),
        tool_calls=dumps("turn.tool_calls", list(turn.tool_calls)),
        policy_version=check_int("turn.policy_version", turn.policy_version),
        segment=check_int("turn.segment", turn.segment),
        break_reason=None if turn.break_reason is None else turn.break_reason.value,
        malformed_tool_call=int(bool(turn.malformed_tool_call)),
        started_at=check_float("turn.started_at", turn.started_at),
        latency_s=check_float("turn.latency_s", turn.latency_s, minimum=0.0),
        reasoning=check_str("turn.reasoning", turn.reasoning, optional=True, empty=True),
        reasoning_tokens=check_int("turn.reasoning_tokens", turn.reasoning_tokens),
        model=_reference_model(turn),
        token_versions=_token_versions(turn, len(completion_ids)),
        role=check_str("turn.role", turn.role, optional=True),
    )


def _token_versions(turn: Turn, completions: int) -> bytes | None:
    """``turn.token_versions``, checked: one version >= 0 per completion id (a partial rollout's turn)."""
    if turn.token_versions is None:
        return None
    versions = ids_array("turn.token_versions", turn.token_versions)
    if len(versions) != completions:
        raise ValueError(f"turn.token_versions must have one version per completion id: "
                         f"{len(versions)} versions for {completions} ids")
    return to_blob(versions)


def _reference_model(turn: Turn) -> str | None:
    """``turn.model``, checked: a turn a reference model wrote (a name) holds no token ids."""
    model = check_str("turn.model", turn.model, optional=True)
    if model is not None and (turn.prompt_ids or turn.completion_ids):
        raise ValueError(f"turn.model is {model!r} (a reference model's turn, passed through) but the turn holds "
                         f"{len(turn.prompt_ids)} prompt and {len(turn.completion_ids)} completion ids; a reference "
                         "turn has none")
    return model


def decode_turn(row: TurnRow) -> Turn:
    (rollout_id, index, messages, tools, prompt_ids, completion_ids, logprobs, finish_reason,
     completion_text, tool_calls, policy_version, segment, break_reason, malformed, started_at,
     latency_s, reasoning, reasoning_tokens, model, token_versions, role) = row
    return Turn(
        rollout_id=rollout_id,
        index=index,
        messages=tuple(json.loads(messages)),
        prompt_ids=tuple(prompt_ids),
        completion_ids=tuple(from_blob(_IDS, completion_ids)),
        logprobs=tuple(from_blob("d", logprobs)),
        finish_reason=finish_reason,
        completion_text=completion_text,
        tool_calls=tuple(json.loads(tool_calls)),
        tools=tuple(json.loads(tools)),
        policy_version=policy_version,
        segment=segment,
        break_reason=None if break_reason is None else BreakReason(break_reason),
        malformed_tool_call=bool(malformed),
        started_at=started_at,
        latency_s=latency_s,
        reasoning=reasoning,
        reasoning_tokens=reasoning_tokens,
        model=model,
        token_versions=None if token_versions is None else tuple(from_blob(_IDS, token_versions)),
        role=role,
    )


def encode_tool_call(call: ToolCall) -> tuple:
    """The row (``TOOL_CALL_COLUMNS``) without its ``seq``, which the writer assigns (order of arrival per rollout)."""
    check_call("tool_call", call, ToolCall)
    return (
        check_str("tool_call.rollout_id", call.rollout_id),
        check_str("tool_call.call_id", call.call_id, optional=True),
        check_str("tool_call.name", call.name),
        dumps("tool_call.arguments", call.arguments),
        dumps("tool_call.result", call.result),
        check_str("tool_call.error", call.error, optional=True, empty=True),
        call.status,
        check_float("tool_call.latency_s", call.latency_s, minimum=0.0),
        check_int("tool_call.turn_index", call.turn_index, optional=True),
        check_float("tool_call.started_at", call.started_at),
        check_str("tool_call.source", call.source, optional=True),
    )


TOOL_CALL_COLUMNS = (
    "rollout_id, seq, call_id, name, arguments, result, error, status, latency_s, turn_index, started_at, source"
)
_TOOL_CALL_FIELDS = tuple(TOOL_CALL_COLUMNS.split(", "))


def decode_tool_call(row: tuple) -> ToolCall:
    """A ``tool_calls`` row (in ``TOOL_CALL_COLUMNS`` order); ``seq`` is its place in the rollout, not a field."""
    fields = dict(zip(_TOOL_CALL_FIELDS, row, strict=True))
    del fields["seq"]
    return ToolCall(**fields | {name: loads(fields[name]) for name in ("arguments", "result")})


def encode_reward(reward: Any, turn_rewards: Any, metrics: Any) -> tuple[float | None, str | None, str]:
    """Exactly one of ``reward`` and ``turn_rewards``; every number finite."""
    if (reward is None) == (turn_rewards is None):
        raise ValueError(
            f"give exactly one of reward and turn_rewards, got reward={reward!r}, turn_rewards={turn_rewards!r:.200}"
        )
    turns_json = None
    if turn_rewards is not None:
        if isinstance(turn_rewards, (str, bytes)) or not isinstance(turn_rewards, Iterable):
            raise ValueError(f"turn_rewards must be a sequence of numbers, got {turn_rewards!r:.200}")
        values = [check_float(f"turn_rewards[{i}]", r) for i, r in enumerate(turn_rewards)]
        turns_json = dumps("turn_rewards", values)
    return (
        check_float("reward", reward, optional=True),
        turns_json,
        dumps("metrics", check_metrics("metrics", metrics)),
    )


ROLLOUT_COLUMNS = (
    "id, task_id, group_id, status, reward, turn_rewards, reward_defaulted, metrics, error, "
    "policy_version, step, token_hash, created_at, finished_at"
)


def encode_rollout(rollout: Rollout, token_hash: str) -> tuple:
    """The rollouts row (in ``ROLLOUT_COLUMNS`` order); turns and tool calls are encoded apart."""
    if not isinstance(rollout, Rollout):
        raise ValueError(f"rollout must be a Rollout, got {rollout!r:.200}")
    if not isinstance(token_hash, str) or len(token_hash) != 64 or not _is_hex(token_hash):
        raise ValueError(f"token_hash must be a sha256 hex digest (64 lowercase hex chars), got {token_hash!r:.80}")
    has_reward = rollout.reward is not None or rollout.turn_rewards is not None
    reward, turns_json, metrics = (
        encode_reward(rollout.reward, rollout.turn_rewards, rollout.metrics)
        if has_reward
        else (None, None, dumps("metrics", check_metrics("rollout.metrics", rollout.metrics)))
    )
    return (
        check_str("rollout.id", rollout.id),
        check_str("rollout.task_id", rollout.task_id),
        check_str("rollout.group_id", rollout.group_id),
        status_of("rollout.status", rollout.status).value,
        reward,
        turns_json,
        int(bool(rollout.reward_defaulted)),
        metrics,
        check_str("rollout.error", rollout.error, optional=True, empty=True),
        check_int("rollout.policy_version", rollout.policy_version),
        check_int("rollout.step", rollout.step, optional=True),
        token_hash,
        check_float("rollout.created_at", rollout.created_at),
        check_float("rollout.finished_at", rollout.finished_at, optional=True),
    )


def decode_rollout(row: tuple, turns: tuple[Turn, ...] = (), tool_calls: tuple[ToolCall, ...] = ()) -> Rollout:
    (id_, task_id, group_id, status, reward, turn_rewards, defaulted, metrics, error, policy_version,
     step, _token_hash, created_at, finished_at) = row
    rewards = loads(turn_rewards)
    return Rollout(
        id=id_,
        task_id=task_id,
        group_id=group_id,
        status=RolloutStatus(status),
        turns=turns,
        tool_calls=tool_calls,
        reward=reward,
        turn_rewards=None if rewards is None else tuple(rewards),
        reward_defaulted=bool(defaulted),
        metrics=json.loads(metrics),
        error=error,
        policy_version=policy_version,
        step=step,
        created_at=created_at,
        finished_at=finished_at,
    )


def hash_token(token: str) -> str:
    """The sha256 hex digest a rollout's bearer token is recorded (and checked) as."""
    check_str("token", token)
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _is_hex(text: str) -> bool:
    return set(text) <= _HEX_DIGITS
