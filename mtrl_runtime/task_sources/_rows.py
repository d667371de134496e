"""One dataset row to one Task: mtrl's own row shape and SageMaker AI MTRL's (verl's) parquet shape.

mtrl's shape: ``id``, ``prompt`` (a string) or ``messages`` (OpenAI chat
messages), ``ground_truth``, ``split``, an optional ``data`` object, and
any other column, all of which land in ``Task.data``.

SageMaker AI MTRL's shape (its ``verl`` dataset schema; ``prompts.parquet``):
``prompt`` as a string or as a list of chat messages, ``reward_model:
{ground_truth, style}``, ``extra_info`` (``split``, ``index``,
``tools_kwargs`` ...), ``data_source``, ``ability``, ``agent_name``,
``attributes``, ``difficulty``, optional ``id``. A list ``prompt`` becomes
``Task.messages``; ``reward_model.ground_truth`` becomes
``Task.ground_truth``; ``extra_info.split`` is the split when the row has
no ``split`` column. Every column is also kept in ``Task.data`` under its
own name (a list ``prompt`` too), so an agent server written for SageMaker
gets the row it would get there (``executors.task_instance``).

Every problem of a row is reported (index, field, what is wrong), not only
the first.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..types import Task
from ._plain import NotJSON, plain_json
from ._problems import DatasetError, RowProblem

TASK_FIELDS = frozenset({"id", "prompt", "messages", "ground_truth", "split", "data"})


def _shown(value: Any) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


class _Row:
    """The problems of one row, gathered while its Task is built."""

    def __init__(self, index: int, where: str) -> None:
        self.index, self.where = index, where
        self.problems: list[RowProblem] = []

    def bad(self, field: str | None, message: str) -> None:
        self.problems.append(RowProblem(self.index, field, message, self.where))

    def messages(self, value: Any, field: str) -> tuple[dict[str, Any], ...] | None:
        """Chat messages, each an object with a string ``role``; keys whose value is null are left out
        (a columnar file gives every message each key any message of the file has), ``content`` excepted."""
        if not isinstance(value, list) or not value:
            self.bad(field, f"expected a non-empty list of chat messages, got {_shown(value)}")
            return None
        out = []
        for i, message in enumerate(value):
            if not isinstance(message, Mapping):
                self.bad(f"{field}[{i}]", f"expected a chat message object, got {_shown(message)}")
                continue
            role = message.get("role")
            if not isinstance(role, str) or not role:
                self.bad(f"{field}[{i}].role", f"expected a non-empty string, got {_shown(role)}")
            content = message.get("content")
            if content is not None and not isinstance(content, (str, list)):
                self.bad(f"{field}[{i}].content", f"expected a string, a list of parts or null, got {_shown(content)}")
            out.append({k: v for k, v in message.items() if v is not None or k == "content"})
        return tuple(out)


def _plain_row(row: Mapping[str, Any], check: _Row) -> dict[str, Any]:
    out = {}
    for key, value in row.items():
        if not isinstance(key, str):
            check.bad(repr(key), "a column name must be a string")
            continue
        try:
            out[key] = plain_json(value, key)
        except NotJSON as err:
            check.bad(err.field, str(err))
    return out


def convert_row(row: Any, index: int, where: str = "", default_split: str | None = None) -> tuple[
        Task | None, list[RowProblem]]:
    """The Task of dataset row ``index``, or None and every problem found (see the module docstring).

    ``default_split``: the split of a row that names none (a DatasetDict's split); else ``train``.
    """
    check = _Row(index, where)
    if not isinstance(row, Mapping):
        check.bad(None, f"expected an object (column -> value), got {_shown(row)}")
        return None, check.problems
    plain = _plain_row(row, check)
    data: dict[str, Any] = {}
    raw_data = plain.get("data")
    if isinstance(raw_data, Mapping):
        data.update(raw_data)
    elif raw_data is not None:
        check.bad("data", f"expected an object, got {_shown(raw_data)}")
    for key, value in plain.items():
        if key in TASK_FIELDS:
            continue
        if key in data and data[key] != value:
            check.bad(key, f"the column and data.{key} differ ({_shown(value)} vs {_shown(data[key])}); rename one")
        data[key] = value

    prompt, messages = plain.get("prompt"), plain.get("messages")
    if isinstance(prompt, list):  # SageMaker / verl: the prompt is the chat so far
        prompt_messages = check.messages(prompt, "prompt")
        if messages is not None:
            check.bad("messages", "give the chat as 'prompt' (a list of messages) or as 'messages', not both")
        messages, prompt = prompt_messages, None
        data["prompt"] = plain["prompt"]  # the row as a SageMaker agent server reads it
    elif messages is not None:
        messages = check.messages(messages, "messages")
    if prompt is not None and not isinstance(prompt, str):
        check.bad("prompt", f"expected a string or a list of chat messages, got {_shown(prompt)}")
    if plain.get("prompt") is None and plain.get("messages") is None:
        check.bad(None, f"needs a 'prompt' or 'messages' field (absent or null here); its columns: {sorted(plain)}")

    ground_truth = plain.get("ground_truth")
    reward_model = plain.get("reward_model")
    if isinstance(reward_model, Mapping) and reward_model.get("ground_truth") is not None:
        if ground_truth is not None and ground_truth != reward_model["ground_truth"]:
            check.bad("reward_model.ground_truth", f"differs from the ground_truth column ({_shown(ground_truth)}); "
                      "give one")
        ground_truth = reward_model["ground_truth"]
    elif reward_model is not None and not isinstance(reward_model, Mapping):
        check.bad("reward_model", f"expected an object such as {{'ground_truth': ...}}, got {_shown(reward_model)}")

    task_id = plain.get("id")
    if task_id is None:
        task_id = f"task-{index}"
    elif isinstance(task_id, bool) or not isinstance(task_id, (str, int)) or not str(task_id).strip():
        check.bad("id", f"expected a non-empty string or an integer, got {_shown(task_id)}")

    split = plain.get("split")
    extra = plain.get("extra_info")
    if split is None and isinstance(extra, Mapping) and extra.get("split") is not None:
        split, split_field = extra["split"], "extra_info.split"
    else:
        split_field = "split"
    if split is None:
        split = default_split or "train"
    elif not isinstance(split, str) or not split.strip():
        check.bad(split_field, f"expected a non-empty string, got {_shown(split)}")

    if check.problems:
        return None, check.problems
    return Task(id=str(task_id), prompt=prompt, messages=messages, ground_truth=ground_truth, split=split,
                data=data), []


def task_from_row(row: Any, index: int = 0, default_split: str | None = None) -> Task:
    """A Task from one dataset row (see the module docstring); a DatasetError listing the row's problems."""
    task, problems = convert_row(row, index, default_split=default_split)
    if task is None:
        raise DatasetError(f"row {index}", problems=problems)
    return task


__all__ = ["TASK_FIELDS", "convert_row", "task_from_row"]
