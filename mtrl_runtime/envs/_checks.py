"""Environment checks as library functions (what ``mtrl check env`` runs).

- ``check_determinism``: run an episode twice and diff the message lists; a
  replayed environment with a fixed policy must produce the same messages,
  or rewards will not mean the same thing from one step to the next.
- ``check_isolation``: run episodes concurrently, each writing its own
  marker into its state; none may see another's marker.
- ``describe_tools``: name and JSON schema of each tool, as a model sees them.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import secrets
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping, Sequence

from ._tooling import JSON, callable_parameters, tool_spec

# Fields that legitimately differ between two runs of the same episode (random call ids).
DEFAULT_IGNORED_FIELDS = frozenset({"id", "tool_call_id"})
_MAX_DIFFS = 20  # enough to see the pattern; the first one is usually the cause


@dataclass(frozen=True)
class MessageDiff:
    """One difference: message ``index``, the field's path inside it, and both values."""

    index: int
    field: str
    first: JSON
    second: JSON

    def __str__(self) -> str:
        return f"message {self.index} {self.field}: {_short(self.first)} != {_short(self.second)}"


@dataclass(frozen=True)
class DiffReport:
    """What differed between two runs; ``same`` when nothing did."""

    length_first: int
    length_second: int
    differences: tuple[MessageDiff, ...] = ()
    truncated: bool = False  # more differences than were listed

    @property
    def same(self) -> bool:
        return not self.differences

    @property
    def first_difference(self) -> MessageDiff | None:
        return self.differences[0] if self.differences else None

    def __str__(self) -> str:
        if self.same:
            return f"deterministic: both runs produced the same {self.length_first} messages"
        lines = [f"not deterministic: run 1 has {self.length_first} messages, run 2 has {self.length_second}"]
        lines += [f"  {d}" for d in self.differences]
        if self.truncated:
            lines.append(f"  ... (first {_MAX_DIFFS} differences shown)")
        return "\n".join(lines)


def diff_messages(
    first: Sequence[Mapping[str, JSON]],
    second: Sequence[Mapping[str, JSON]],
    *,
    ignore_fields: Iterable[str] = DEFAULT_IGNORED_FIELDS,
) -> DiffReport:
    """Field-by-field differences of two message lists; tool-call ``arguments`` compare as parsed JSON."""
    ignored = frozenset(ignore_fields)
    diffs: list[MessageDiff] = []
    for i in range(max(len(first), len(second))):
        a = first[i] if i < len(first) else _MISSING
        b = second[i] if i < len(second) else _MISSING
        for path, va, vb in _walk(a, b, "", ignored):
            diffs.append(MessageDiff(i, path or "(message)", va, vb))
    return DiffReport(len(first), len(second), tuple(diffs[:_MAX_DIFFS]), truncated=len(diffs) > _MAX_DIFFS)


def check_determinism(
    run_once: Callable[[], Sequence[Mapping[str, JSON]]],
    *,
    ignore_fields: Iterable[str] = DEFAULT_IGNORED_FIELDS,
) -> DiffReport:
    """Run ``run_once`` (an episode returning its messages) twice and diff the results."""
    first, second = run_once(), run_once()
    if inspect.isawaitable(first) or inspect.isawaitable(second):
        for r in (first, second):
            if inspect.iscoroutine(r):
                r.close()
        raise TypeError("check_determinism: run_once returned an awaitable; use check_determinism_async")
    return diff_messages(_messages(first), _messages(second), ignore_fields=ignore_fields)


async def check_determinism_async(
    run_once: Callable[[], Awaitable[Sequence[Mapping[str, JSON]]]],
    *,
    ignore_fields: Iterable[str] = DEFAULT_IGNORED_FIELDS,
) -> DiffReport:
    """``check_determinism`` for an async episode (the runs are sequential, not concurrent)."""
    first = await run_once()
    second = await run_once()
    return diff_messages(_messages(first), _messages(second), ignore_fields=ignore_fields)


@dataclass(frozen=True)
class IsolationReport:
    """Per run: its marker, whether its own state showed it, and whose markers leaked in."""

    markers: tuple[str, ...]
    saw_own: tuple[bool, ...]
    leaks: tuple[tuple[int, int], ...] = field(default=())  # (run that saw, run whose marker it saw)

    @property
    def isolated(self) -> bool:
        return not self.leaks and all(self.saw_own)

    def __str__(self) -> str:
        if self.isolated:
            return f"isolated: {len(self.markers)} concurrent runs each saw only their own state"
        lines = ["not isolated:"]
        lines += [f"  run {i} saw the state of run {j}" for i, j in self.leaks]
        lines += [f"  run {i} did not see its own marker (the check did not exercise its state)"
                  for i, ok in enumerate(self.saw_own) if not ok]
        return "\n".join(lines)


async def check_isolation(run: Callable[[str], Awaitable[JSON]], *, runs: int = 2) -> IsolationReport:
    """Run ``run(marker)`` ``runs`` times concurrently and look for markers in the wrong run.

    ``run`` is one episode: it writes ``marker`` into its state through the
    environment (a file, a row, a state key), gives other runs a chance to run
    (any ``await``), then returns a snapshot of what its state holds (any
    JSON-able value). An isolated environment's snapshot holds its own marker
    and nobody else's.
    """
    if runs < 2:
        raise ValueError(f"runs must be >= 2 to check isolation, got {runs}")
    markers = tuple(f"mtrl-marker-{i}-{secrets.token_hex(6)}" for i in range(runs))
    snapshots = await asyncio.gather(*(run(m) for m in markers))
    texts = [json.dumps(s, default=str, sort_keys=True) for s in snapshots]
    saw_own = tuple(m in t for m, t in zip(markers, texts))
    leaks = tuple((i, j) for i, t in enumerate(texts) for j, m in enumerate(markers) if i != j and m in t)
    return IsolationReport(markers, saw_own, leaks)


def describe_tools(tools: Iterable[Any]) -> list[dict[str, JSON]]:
    """``{"name", "description", "parameters"}`` for each tool; duplicate names are an error.

    Accepts this package's tools (``.spec``), Strands tools (``.tool_spec``),
    OpenAI tool dicts, and plain functions (schema from signature and hints).
    """
    specs = [_describe(t) for t in tools]
    seen: set[str] = set()
    for spec in specs:
        if spec["name"] in seen:
            raise ValueError(f"describe_tools: two tools are named {spec['name']!r}; a model cannot tell them apart")
        seen.add(spec["name"])
    return specs


def _describe(tool: Any) -> dict[str, JSON]:
    spec = getattr(tool, "spec", None)
    if isinstance(spec, Mapping):
        return dict(spec)
    strands_spec = getattr(tool, "tool_spec", None)
    if isinstance(strands_spec, Mapping):
        schema = strands_spec.get("inputSchema", {})
        return tool_spec(strands_spec["name"], strands_spec.get("description", ""), schema.get("json", schema))
    if isinstance(tool, Mapping):
        fn = tool.get("function", tool)  # {"type": "function", "function": {...}} or the inner record
        if "name" not in fn:
            raise ValueError(f"describe_tools: tool dict has no 'name': {tool!r}")
        return tool_spec(fn["name"], fn.get("description", ""), fn.get("parameters", {"type": "object", "properties": {}}))
    if callable(tool) and hasattr(tool, "__name__"):
        doc = inspect.getdoc(tool) or ""
        return tool_spec(tool.__name__, doc.split("\n\n")[0].strip(), callable_parameters(tool))
    raise TypeError(f"describe_tools: cannot describe a {type(tool).__name__}; pass a tool, a function or an OpenAI tool dict")


class _Missing:
    def __repr__(self) -> str:
        return "(absent)"


_MISSING = _Missing()


def _walk(a: Any, b: Any, path: str, ignored: frozenset[str]) -> Iterable[tuple[str, Any, Any]]:
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        for key in sorted(set(a) | set(b), key=str):
            if key in ignored:
                continue
            va, vb = a.get(key, _MISSING), b.get(key, _MISSING)
            if key == "arguments":
                va, vb = _parsed(va), _parsed(vb)
            yield from _walk(va, vb, f"{path}.{key}" if path else str(key), ignored)
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
        for i in range(max(len(a), len(b))):
            va = a[i] if i < len(a) else _MISSING
            vb = b[i] if i < len(b) else _MISSING
            yield from _walk(va, vb, f"{path}[{i}]", ignored)
    elif a != b:
        yield path, a, b


def _parsed(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _messages(value: Any) -> list[Mapping[str, JSON]]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(m, Mapping) for m in value):
        raise TypeError(f"run_once must return a list of message dicts, got {type(value).__name__}")
    return list(value)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
