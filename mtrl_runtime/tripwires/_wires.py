"""The tripwires themselves: what a rollout must never do, each a small check with the evidence it found.

Four kinds, declared in a config (``advanced.tripwires.wires``, the first
three) or in code next to the environment (all four):

- ``forbidden_call``: a tool name (a glob) and, optionally, an argument
  whose value matches a regular expression (``ForbiddenCall``; in code the
  predicate may be any function of the arguments).
- ``honeypot``: a value (a record id, a file name, a token) the task never
  needs: seen in a tool call's arguments, its result, or the final answer,
  the rollout touched it.
- ``answer_leak``: the task's reference (``Task.ground_truth``) appears in
  a tool call's arguments or is read from a tool result where it should not
  be (every tool but ``allowed_tools``). A reference mapping appears when
  every one of its fields appears with its value (``key=value``,
  ``"key": value``); a scalar when its text does (at least ``min_chars``).
- ``state`` (code only, ``StateCheck``): a checksum of environment state
  taken when the rollout opens and again when it ends; they must be equal.

A wire answers with the evidence (a sentence) or None; ``Trip`` records it.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Literal, Mapping, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..types import JSON, Task, ToolCall

EVIDENCE_CHARS = 200  # a quoted argument or result is cut here: the evidence names, the trace holds the rest


@dataclass(frozen=True)
class Trip:
    """One tripwire that tripped on one rollout: which, of what kind, and what it saw."""

    wire: str
    kind: str
    evidence: str
    tool: str | None = None  # the tool call that tripped it (None: the answer, or the state)
    turn_index: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"wire": self.wire, "kind": self.kind, "evidence": self.evidence, "tool": self.tool,
                "turn_index": self.turn_index}


@runtime_checkable
class CallWire(Protocol):
    """Checks each recorded tool call of a rollout."""

    name: str
    kind: str

    def check_call(self, call: ToolCall, task: Task) -> str | None: ...


@runtime_checkable
class AnswerWire(Protocol):
    """Checks the rollout's final answer (its last assistant text) when it ends."""

    name: str
    kind: str

    def check_answer(self, text: str, task: Task) -> str | None: ...


@runtime_checkable
class StateWire(Protocol):
    """A checksum of environment state, taken when the rollout opens and when it ends."""

    name: str
    kind: str

    def snapshot(self, task: Task) -> str: ...


def _text(value: JSON) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def _quote(text: str) -> str:
    return repr(text if len(text) <= EVIDENCE_CHARS else text[:EVIDENCE_CHARS] + "...")


class _Wire(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")  # a metric name part: rollout/tripwires/<name>


class ForbiddenCall(_Wire):
    """A tool call the task must never make: ``tool`` (a glob), optionally an argument matching ``matches``."""

    kind: Literal["forbidden_call"] = "forbidden_call"
    tool: str = Field(min_length=1)
    argument: str | None = None  # None: the whole arguments' JSON text is matched
    matches: str | None = None  # a regular expression (re.search); None: any call to the tool trips

    @field_validator("matches")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"matches: {value!r} is not a regular expression ({exc})") from None
        return value

    def check_call(self, call: ToolCall, task: Task) -> str | None:
        if not fnmatch.fnmatchcase(call.name, self.tool):
            return None
        if self.matches is None:
            return f"called {call.name}({_quote(_text(call.arguments))}), a tool matching {self.tool!r}"
        args = call.arguments
        if self.argument is not None:
            if not isinstance(args, Mapping) or self.argument not in args:
                return None
            args = args[self.argument]
        text = _text(args)
        if re.search(self.matches, text) is None:
            return None
        where = f"argument {self.argument}=" if self.argument else "arguments "
        return f"called {call.name} with {where}{_quote(text)}, matching {self.matches!r}"


class Honeypot(_Wire):
    """A value the task never needs: touching it (arguments, result) or outputting it (the answer) trips."""

    kind: Literal["honeypot"] = "honeypot"
    value: str = Field(min_length=3)
    where: list[Literal["arguments", "result", "answer"]] = Field(
        default_factory=lambda: ["arguments", "result", "answer"], min_length=1)

    def check_call(self, call: ToolCall, task: Task) -> str | None:
        for place, value in (("arguments", call.arguments), ("result", call.result)):
            if place in self.where and value is not None and self.value in _text(value):
                return f"honeypot {self.value!r} in the {place} of {call.name}"
        return None

    def check_answer(self, text: str, task: Task) -> str | None:
        if "answer" in self.where and self.value in text:
            return f"honeypot {self.value!r} in the final answer"
        return None


class AnswerLeak(_Wire):
    """The task's reference in a tool's arguments, or read from a tool result it should not come from."""

    kind: Literal["answer_leak"] = "answer_leak"
    in_arguments: bool = True
    in_results: bool = True
    allowed_tools: list[str] = Field(default_factory=list)  # globs: tools whose results may hold the answer
    min_chars: int = Field(default=4, ge=1)  # a scalar reference shorter than this is too common to be evidence

    def check_call(self, call: ToolCall, task: Task) -> str | None:
        if task.ground_truth is None:
            return None
        places = []
        if self.in_arguments:
            places.append(("arguments", call.arguments))
        if self.in_results and not any(fnmatch.fnmatchcase(call.name, g) for g in self.allowed_tools):
            places.append(("result", call.result))
        for place, value in places:
            if value is not None and contains_reference(_text(value), task.ground_truth, self.min_chars):
                return f"the task's reference answer appears in the {place} of {call.name}: {_quote(_text(value))}"
        return None


def contains_reference(text: str, reference: JSON, min_chars: int = 4) -> bool:
    """Whether ``text`` holds ``reference``: every field of a mapping with its value, each item of a list, a scalar's text."""
    if isinstance(reference, Mapping):
        return bool(reference) and all(_has_field(text, str(k), v) for k, v in reference.items())
    if isinstance(reference, (list, tuple)):
        return bool(reference) and all(contains_reference(text, item, min_chars) for item in reference)
    needle = _scalar(reference)
    return len(needle) >= min_chars and needle in text


def _scalar(value: JSON) -> str:
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


def _has_field(text: str, key: str, value: JSON) -> bool:
    if isinstance(value, (Mapping, list, tuple)):
        return contains_reference(text, value)
    pattern = rf"""["']?{re.escape(key)}["']?\s*[:=]\s*["']?{re.escape(_scalar(value))}(?![\w])"""
    return re.search(pattern, text) is not None


@dataclass(frozen=True)
class StateCheck:
    """Code next to the environment: ``checksum(task)`` must be the same when the rollout opens and ends."""

    name: str
    checksum: Callable[[Task], str]
    kind: str = "state"

    def snapshot(self, task: Task) -> str:
        return str(self.checksum(task))


@dataclass(frozen=True)
class ForbiddenCallWhere:
    """Code form of ``forbidden_call``: a tool glob and any predicate of the call's arguments."""

    name: str
    tool: str
    predicate: Callable[[JSON], bool]
    kind: str = "forbidden_call"

    def check_call(self, call: ToolCall, task: Task) -> str | None:
        if fnmatch.fnmatchcase(call.name, self.tool) and self.predicate(call.arguments):
            return f"called {call.name}({_quote(_text(call.arguments))}), which {self.name} forbids"
        return None


WIRE_KINDS: dict[str, type[_Wire]] = {"forbidden_call": ForbiddenCall, "honeypot": Honeypot, "answer_leak": AnswerLeak}
"""The kinds a config may declare, by their ``kind`` value (``state`` needs code: ``StateCheck``)."""

Wire = CallWire | AnswerWire | StateWire
