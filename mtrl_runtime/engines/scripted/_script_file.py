"""Script files for the ``scripted`` engine: per-task replies and tool calls, written as JSON or YAML.

So that ``mtrl serve --engine scripted --script script.yaml`` (or
``advanced.engine_options: {script_file: script.yaml}``) exercises an
agent's tools without a model::

    tasks:                       # tried in order; the first whose `match` occurs in the prompt answers
      - match: "order 42"
        replies:
          - tool_call: {name: lookup_order, arguments: {order_id: "42"}}
          - "Order 42 ships tomorrow."
      - replies: ["DONE"]        # no `match`: every other task

A reply is a string (the completion's text), or a mapping with ``text``,
``tool_call`` (``{name, arguments}``; with ``text`` the text comes first),
``error`` (the turn fails with this message) and ``delay_s``. A rollout's
entry is chosen at its first turn (by the rendered prompt, which holds the
task's prompt) and kept for its later turns; turn ``i`` answers
``replies[i]`` (a call that names no rollout, served in inference mode: ``i``
is the number of assistant messages after its last user message, so ``mtrl
serve --inference`` replays whole episodes to a plain client); a rollout that asks for more turns than its entry holds
fails naming the entry. A file that is just a list of replies is one entry
for every task. Every mistake is a ``ScriptFileError`` naming the file, the
field and the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...datafile import read_data_file
from ...types import GenerationRequest
from ._engine import ScriptedReply, ScriptExhausted


class ScriptFileError(ValueError):
    """A script file that cannot be used, naming the file, the field and the value."""


@dataclass(frozen=True)
class ScriptEntry:
    """The replies of the tasks whose prompt contains ``match`` (None: any task)."""

    match: str | None
    replies: tuple[ScriptedReply, ...]
    where: str  # "tasks[0]", for errors


class FileScript:
    """A script callable ``(request, prompt_text) -> ScriptedReply`` built from a script file."""

    def __init__(self, entries: tuple[ScriptEntry, ...], source: str) -> None:
        self.entries = entries
        self.source = source
        self._chosen: dict[str, ScriptEntry] = {}

    def __call__(self, request: GenerationRequest, prompt_text: str) -> ScriptedReply:
        entry = self._chosen.get(request.rollout_id) if request.rollout_id is not None else None
        if entry is None:
            entry = self._entry_for(prompt_text, request.rollout_id)
            if request.rollout_id is not None:
                self._chosen[request.rollout_id] = entry
        turn = request.turn_index
        if turn >= len(entry.replies):
            raise ScriptExhausted(
                f"script {self.source}: {entry.where} has {len(entry.replies)} replies; rollout "
                f"{request.rollout_id!r} asked for turn {turn} (add replies, or end the agent sooner)"
            )
        return entry.replies[turn]

    def _entry_for(self, prompt_text: str, rollout_id: str | None) -> ScriptEntry:
        for entry in self.entries:
            if entry.match is None or entry.match in prompt_text:
                return entry
        matches = [e.match for e in self.entries]
        raise ScriptExhausted(
            f"script {self.source}: no entry matches rollout {rollout_id!r} (matches tried: {matches!r}); "
            "add an entry without 'match' for every other task"
        )


def load_script_file(path: str | Path) -> FileScript:
    """Read and validate a JSON (``.json``) or YAML script file (see the module docstring)."""
    file, data = read_data_file(path, ScriptFileError, "script_file", "script")
    return FileScript(parse_script(data, str(file)), str(file))


def parse_script(data: Any, source: str = "script") -> tuple[ScriptEntry, ...]:
    """The entries of a parsed script document, or a ScriptFileError naming the field and value."""
    if isinstance(data, list):
        return (ScriptEntry(None, _replies(data, source, "replies"), "replies"),)
    if not isinstance(data, dict):
        raise ScriptFileError(f"script {source}: expected a mapping with 'tasks' or a list of replies, "
                              f"got {type(data).__name__} {_show(data)}")
    unknown = sorted(set(data) - {"tasks"})
    if unknown:
        raise ScriptFileError(f"script {source}: unknown key(s) {unknown!r}; expected 'tasks'")
    tasks = data.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        raise ScriptFileError(f"script {source}: tasks: expected a non-empty list of entries, got {_show(tasks)}")
    entries = []
    for i, item in enumerate(tasks):
        where = f"tasks[{i}]"
        if not isinstance(item, dict):
            raise ScriptFileError(f"script {source}: {where}: expected a mapping with 'replies', got {_show(item)}")
        extra = sorted(set(item) - {"match", "replies"})
        if extra:
            raise ScriptFileError(f"script {source}: {where}: unknown key(s) {extra!r}; expected 'match', 'replies'")
        match = item.get("match")
        if match is not None and (not isinstance(match, str) or not match):
            raise ScriptFileError(f"script {source}: {where}.match: expected a non-empty string, got {_show(match)}")
        entries.append(ScriptEntry(match, _replies(item.get("replies"), source, f"{where}.replies"), where))
    return tuple(entries)


def _replies(value: Any, source: str, where: str) -> tuple[ScriptedReply, ...]:
    if not isinstance(value, list) or not value:
        raise ScriptFileError(f"script {source}: {where}: expected a non-empty list of replies, got {_show(value)}")
    return tuple(_reply(v, source, f"{where}[{i}]") for i, v in enumerate(value))


def _reply(value: Any, source: str, where: str) -> ScriptedReply:
    if isinstance(value, str):
        return ScriptedReply.plain(value)
    if not isinstance(value, dict):
        raise ScriptFileError(f"script {source}: {where}: expected a string or a mapping, got {_show(value)}")
    extra = sorted(set(value) - {"text", "tool_call", "error", "delay_s"})
    if extra:
        raise ScriptFileError(f"script {source}: {where}: unknown key(s) {extra!r}; "
                              "expected 'text', 'tool_call', 'error', 'delay_s'")
    text = value.get("text", "")
    if not isinstance(text, str):
        raise ScriptFileError(f"script {source}: {where}.text: expected a string, got {_show(text)}")
    delay = value.get("delay_s", 0.0)
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or delay < 0:
        raise ScriptFileError(f"script {source}: {where}.delay_s: expected a number >= 0, got {_show(delay)}")
    if "error" in value:
        error = value["error"]
        if not isinstance(error, str) or not error or "tool_call" in value:
            raise ScriptFileError(f"script {source}: {where}.error: expected a non-empty message and no "
                                  f"tool_call, got {_show(error)}")
        return ScriptedReply.fail(error, float(delay))
    call = value.get("tool_call")
    if call is None:
        return ScriptedReply.plain(text, float(delay))
    if not isinstance(call, dict):
        raise ScriptFileError(f"script {source}: {where}.tool_call: expected {{name, arguments}}, got {_show(call)}")
    name, arguments = call.get("name"), call.get("arguments", {})
    if not isinstance(name, str) or not name:
        raise ScriptFileError(f"script {source}: {where}.tool_call.name: expected a non-empty string, "
                              f"got {_show(name)}")
    if not isinstance(arguments, dict):
        raise ScriptFileError(f"script {source}: {where}.tool_call.arguments: expected a mapping, "
                              f"got {_show(arguments)}")
    extra = sorted(set(call) - {"name", "arguments"})
    if extra:
        raise ScriptFileError(f"script {source}: {where}.tool_call: unknown key(s) {extra!r}; "
                              "expected 'name', 'arguments'")
    return ScriptedReply.tool_call(name, arguments, text, float(delay))


def _show(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:77] + "..."


__all__ = ["FileScript", "ScriptEntry", "ScriptFileError", "load_script_file", "parse_script"]
