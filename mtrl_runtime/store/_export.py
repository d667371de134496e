"""Export of recorded rollouts as JSON Lines: one self-contained rollout per line, the same for every backend.

Each line is an object with these keys (times are Unix seconds)::

    id, task_id, group_id, status           str ("completed" | "failed" | "timed_out" | "interrupted" | "abandoned" | "running")
    reward                                  float | null   (a scalar reward)
    turn_rewards                            [float] | null (per-turn rewards; exactly one of the two once reported)
    total_reward                            float          (sum of turn_rewards, else reward, else 0)
    reward_defaulted                        bool           (never reported; got the configured default)
    metrics                                 {name: float}
    error                                   str | null
    policy_version, step, trained_step      int | null     (step: batch it was dispatched for; trained_step: the
                                                            update that consumed it)
    created_at, finished_at                 float | null
    task        {id, prompt, messages, ground_truth, split, data}
    turns       [{index, messages, tools, prompt_ids, completion_ids, logprobs, finish_reason,
                  completion_text, tool_calls, policy_version, segment, break_reason,
                  malformed_tool_call, started_at, latency_s, reasoning, reasoning_tokens, model,
                  token_versions}]                          by index; prompt_ids is the full prompt;
                                                            reasoning: the reply's reasoning_content or null;
                                                            model: null (the policy's turn) or the reference
                                                            model that wrote it (no ids; never trained);
                                                            token_versions: null (every id policy_version's)
                                                            or the version behind each completion id
    tool_calls  [{call_id, name, arguments, result, error, status, latency_s, turn_index, started_at, source}]
                                                            in order of arrival
    model_calls [{rollout_id, protocol, model, latency_s, started_at, input_tokens, output_tokens, stream,
                  status, error}]                           non-policy calls (a judge...): never trained on

The rollout's bearer-token hash is never exported.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any, Iterable

from ..types import Rollout, Task, ToolCall, Turn


def write_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> int:
    """Write one JSON line per record to ``path``; returns how many lines were written.

    Holds one record in memory at a time, and replaces ``path`` only once the
    whole file is written.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    count = 0
    with open(tmp, "w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
            count += 1
    os.replace(tmp, path)
    return count


def rollout_record(rollout: Rollout, task: Task | None, trained_step: int | None) -> dict[str, Any]:
    return {
        "id": rollout.id,
        "task_id": rollout.task_id,
        "group_id": rollout.group_id,
        "status": rollout.status.value,
        "reward": rollout.reward,
        "turn_rewards": None if rollout.turn_rewards is None else list(rollout.turn_rewards),
        "total_reward": rollout.total_reward,
        "reward_defaulted": rollout.reward_defaulted,
        "metrics": dict(rollout.metrics),
        "error": rollout.error,
        "policy_version": rollout.policy_version,
        "step": rollout.step,
        "trained_step": trained_step,
        "created_at": rollout.created_at,
        "finished_at": rollout.finished_at,
        "task": None if task is None else _task_record(task),
        "turns": [_turn_record(t) for t in rollout.turns],
        "tool_calls": [_tool_call_record(c) for c in rollout.tool_calls],
        "model_calls": [dataclasses.asdict(c) for c in rollout.model_calls],  # non-policy calls: never trained
    }


def _task_record(task: Task) -> dict[str, Any]:
    return {
        "id": task.id,
        "prompt": task.prompt,
        "messages": None if task.messages is None else list(task.messages),
        "ground_truth": task.ground_truth,
        "split": task.split,
        "data": dict(task.data),
    }


def _turn_record(turn: Turn) -> dict[str, Any]:
    return {
        "index": turn.index,
        "messages": list(turn.messages),
        "tools": list(turn.tools),
        "prompt_ids": list(turn.prompt_ids),
        "completion_ids": list(turn.completion_ids),
        "logprobs": list(turn.logprobs),
        "finish_reason": turn.finish_reason,
        "completion_text": turn.completion_text,
        "tool_calls": list(turn.tool_calls),
        "policy_version": turn.policy_version,
        "segment": turn.segment,
        "break_reason": None if turn.break_reason is None else turn.break_reason.value,
        "malformed_tool_call": turn.malformed_tool_call,
        "started_at": turn.started_at,
        "latency_s": turn.latency_s,
        "reasoning": turn.reasoning,
        "reasoning_tokens": turn.reasoning_tokens,
        "model": turn.model,
        "token_versions": None if turn.token_versions is None else list(turn.token_versions),
    }


def _tool_call_record(call: ToolCall) -> dict[str, Any]:
    return {
        "call_id": call.call_id,
        "name": call.name,
        "arguments": call.arguments,
        "result": call.result,
        "error": call.error,
        "status": call.status,
        "latency_s": call.latency_s,
        "turn_index": call.turn_index,
        "started_at": call.started_at,
        "source": call.source,
    }
