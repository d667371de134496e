"""The inspection tools: read-only, replayed from the fixtures, keyed by tail number.

Each check returns one line of ``key=value`` pairs, short enough for a tiny
model to read, and names the answer field it decides (``mechanical_status=fail``);
the tail number comes back too, so the next call can copy it from close by,
and ``next=`` names the SOP's next step. Both are there for a tiny model:
measured on SmolLM2-135M-Instruct, the step hints and the ``<final_output>``
hint after the report raise the log-probability of the reference actions.
The report (``InspectionSession.file_report``) returns the findings of the
checks made, as the JSON the answer uses.
Bad input never raises: the tool returns a line starting with ``error:`` so
the model sees its mistake as a tool result. Same arguments, same result.

``TOOL_SPECS`` (OpenAI function definitions) is built from the functions'
signatures and docstrings, so the two cannot drift apart.
"""

from __future__ import annotations

import csv
import functools
import inspect
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping

FIXTURES_DIR = Path(__file__).resolve().parent / "fixtures"

Table = Mapping[str, Mapping[str, str]]  # tail number -> row


class ToolInputError(ValueError):
    """Bad tool arguments; turned into an ``error: ...`` result, never raised to the caller."""


@dataclass(frozen=True)
class Fixtures:
    """The fixture tables, each keyed by tail number."""

    aircraft: Table
    maintenance: Table
    mechanical: Table
    electrical: Table
    incidents: Table


def _table(path: Path) -> Table:
    with path.open(newline="", encoding="utf-8") as f:
        return MappingProxyType({row["tail_number"]: MappingProxyType(row) for row in csv.DictReader(f)})


@functools.lru_cache(maxsize=4)
def load_fixtures(root: Path = FIXTURES_DIR) -> Fixtures:
    """Read the fixture tables once per folder (read-only, so sharing them is safe)."""
    root = Path(root)
    return Fixtures(**{name: _table(root / f"{name}.csv") for name in Fixtures.__dataclass_fields__})


def _returns_errors(tool: Callable[..., str]) -> Callable[..., str]:
    """Turn a tool's ToolInputError into an ``error: ...`` result."""

    @functools.wraps(tool)
    def run(*args: Any, **kwargs: Any) -> str:
        try:
            return tool(*args, **kwargs)
        except ToolInputError as err:
            return f"error: {err}"

    return run


def _tail(tail_number: Any) -> str:
    if not isinstance(tail_number, str) or not tail_number.strip():
        raise ToolInputError(f"tail_number must be a non-empty string like N482QK; got {tail_number!r}")
    return tail_number.strip().upper()


def _row(table: str, tail_number: Any) -> tuple[str, Mapping[str, str]]:
    tail = _tail(tail_number)
    row = getattr(load_fixtures(), table).get(tail)
    if row is None:
        raise ToolInputError(f"unknown tail_number {tail!r}: no such aircraft in the registry")
    return tail, row


def _flag(value: bool) -> str:
    return "true" if value else "false"


@_returns_errors
def validate_aircraft(tail_number: str) -> str:
    """Check the aircraft's registration (step 1).

    Args:
        tail_number: aircraft tail number, e.g. N482QK
    """
    tail, row = _row("aircraft", tail_number)
    valid = row["registration"] == "current"
    return (f"tail={tail} type={row['type']} registration={row['registration']} "
            f"aircraft_valid={_flag(valid)} next=get_maintenance_record")


@_returns_errors
def get_maintenance_record(tail_number: str) -> str:
    """Read hours flown since the last check (step 2).

    Args:
        tail_number: aircraft tail number
    """
    tail, row = _row("maintenance", tail_number)
    due = int(row["hours_since_check"]) >= int(row["hours_limit"])
    return (f"tail={tail} hours_since_check={row['hours_since_check']} "
            f"limit={row['hours_limit']} maintenance_due={_flag(due)} next=inspect_mechanical")


@_returns_errors
def inspect_mechanical(tail_number: str) -> str:
    """Inspect brakes, tires, gear and hydraulics (step 3).

    Args:
        tail_number: aircraft tail number
    """
    tail, row = _row("mechanical", tail_number)
    return (f"tail={tail} mechanical_status={row['status']} finding={row['finding']} "
            "next=inspect_electrical")


@_returns_errors
def inspect_electrical(tail_number: str) -> str:
    """Inspect generators, wiring and battery (step 4).

    Args:
        tail_number: aircraft tail number
    """
    tail, row = _row("electrical", tail_number)
    return (f"tail={tail} electrical_status={row['status']} finding={row['finding']} "
            "next=check_incidents")


@_returns_errors
def check_incidents(tail_number: str) -> str:
    """Look up open incident reports (step 5).

    Args:
        tail_number: aircraft tail number
    """
    tail, row = _row("incidents", tail_number)
    flag = int(row["open_incidents"]) > 0
    return (f"tail={tail} open_incidents={row['open_incidents']} "
            f"last={row['last_incident']} incident_flag={_flag(flag)} next=file_report")


CHECKS: Mapping[str, Callable[..., str]] = MappingProxyType({
    tool.__name__: tool
    for tool in (validate_aircraft, get_maintenance_record, inspect_mechanical, inspect_electrical, check_incidents)
})
# The answer field each check decides, in the SOP's order: the check's result line names it.
CHECK_FIELDS: Mapping[str, str] = MappingProxyType({
    "validate_aircraft": "aircraft_valid", "get_maintenance_record": "maintenance_due",
    "inspect_mechanical": "mechanical_status", "inspect_electrical": "electrical_status",
    "check_incidents": "incident_flag",
})
SOP_ORDER: tuple[str, ...] = (*CHECKS, "file_report")  # the order the SOP calls the tools in


def parse_kv(line: str) -> dict[str, str]:
    """``a=1 b=x`` -> {"a": "1", "b": "x"}; words without ``=`` are ignored."""
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


def _finding(value: str) -> bool | str:
    return {"true": True, "false": False}.get(value, value)


class InspectionSession:
    """One episode's tools: the five checks as they are, and ``file_report``, which files what they found.

    The report returns the findings of the checks this session ran on that
    aircraft, as the JSON the answer uses, so the answer step copies from the
    last tool result instead of from five results spread over the episode
    (a 135M model copies from close by; see the example's README). A check
    the agent skipped is missing from the report. Create one per episode.
    """

    def __init__(self) -> None:
        self._findings: dict[str, dict[str, bool | str]] = {}
        checks = {name: self._recorded(name, check) for name, check in CHECKS.items()}
        self.tools: Mapping[str, Callable[..., str]] = MappingProxyType({**checks, "file_report": self._report_tool()})

    def _recorded(self, name: str, check: Callable[..., str]) -> Callable[..., str]:
        @functools.wraps(check)
        def run(tail_number: str) -> str:
            result = check(tail_number)
            if not result.startswith("error:"):
                pairs = parse_kv(result)
                self._findings.setdefault(pairs["tail"], {})[CHECK_FIELDS[name]] = _finding(pairs[CHECK_FIELDS[name]])
            return result

        return run

    def _report_tool(self) -> Callable[..., str]:
        @functools.wraps(self.file_report)  # name, docstring and signature (without self) of the method
        def file_report(tail_number: str) -> str:
            return self.file_report(tail_number)

        return _returns_errors(file_report)

    def findings(self, tail_number: str) -> dict[str, bool | str]:
        """The findings filed so far for ``tail_number``, in the SOP's order."""
        found = self._findings.get(_tail(tail_number), {})
        return {field: found[field] for field in CHECK_FIELDS.values() if field in found}

    def file_report(self, tail_number: str) -> str:
        """File the inspection report: the findings of the checks made (step 6).

        Args:
            tail_number: aircraft tail number
        """
        tail, _ = _row("aircraft", tail_number)
        report = zlib.crc32(tail.encode()) % 10000  # stable across processes, unlike hash()
        return f"report_id=RPT-{report:04d} filed=true findings={json.dumps(self.findings(tail))} next=<final_output>"

    def call(self, name: str, arguments: Mapping[str, Any] | str | None) -> str:
        """Run the tool ``name`` with ``arguments`` (a dict or its JSON text); errors come back as text."""
        return dispatch(self, name, arguments)


_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


def _arg_docs(doc: str) -> dict[str, str]:
    """``name: description`` lines of a docstring's Args section."""
    lines = doc.split("Args:", 1)[1].splitlines() if "Args:" in doc else []
    return dict(line.strip().split(": ", 1) for line in lines if ": " in line)


def tool_spec(tool: Callable[..., str]) -> dict[str, Any]:
    """The OpenAI function definition of a tool: description and parameters from its docstring and signature."""
    doc = inspect.getdoc(tool) or ""
    arg_docs = _arg_docs(doc)
    signature = inspect.signature(tool, eval_str=True)
    properties = {
        name: {"type": _JSON_TYPES[param.annotation], "description": arg_docs[name]}
        for name, param in signature.parameters.items()
    }
    return {
        "type": "function",
        "function": {
            "name": tool.__name__,
            "description": doc.split("\n", 1)[0],
            "parameters": {"type": "object", "properties": properties, "required": list(properties)},
        },
    }


TOOL_SPECS: tuple[dict[str, Any], ...] = tuple(tool_spec(tool) for tool in InspectionSession().tools.values())


def dispatch(session: InspectionSession, name: str, arguments: Mapping[str, Any] | str | None) -> str:
    """Run ``session``'s tool ``name`` with ``arguments`` (a dict or its JSON text); errors come back as text."""
    tool = session.tools.get(name) if isinstance(name, str) else None
    if tool is None:
        return f"error: unknown tool {name!r}; known: {', '.join(SOP_ORDER)}"
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return f"error: arguments for {name} are not valid JSON: {arguments!r}"
    arguments = {} if arguments is None else arguments
    if not isinstance(arguments, Mapping):
        return f"error: arguments for {name} must be a JSON object; got {arguments!r}"
    try:
        inspect.signature(tool).bind(**arguments)
    except TypeError as err:
        params = ", ".join(inspect.signature(tool).parameters)
        return f"error: bad arguments for {name} ({err}); expected: {params}"
    return tool(**arguments)


__all__ = [
    "CHECKS",
    "CHECK_FIELDS",
    "FIXTURES_DIR",
    "Fixtures",
    "InspectionSession",
    "SOP_ORDER",
    "TOOL_SPECS",
    "ToolInputError",
    "check_incidents",
    "dispatch",
    "parse_kv",
    "get_maintenance_record",
    "inspect_electrical",
    "inspect_mechanical",
    "load_fixtures",
    "tool_spec",
    "validate_aircraft",
]
