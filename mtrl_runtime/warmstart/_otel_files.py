"""OpenTelemetry spans exported as JSON, read into ``Span`` records (``_otel_spans`` makes conversations of them).

A file holds OTLP JSON (``{"resourceSpans": [{"scopeSpans": [{"spans":
[...]}]}]}``, one document or one per line: the Collector's ``file``
exporter, ``opentelemetry-exporter-otlp-json-file``'s ``FileSpanExporter``),
attributes as OTLP ``AnyValue``s and ids in hex (or base64); or the Python
SDK's ``ConsoleSpanExporter`` output (``span.to_json()`` objects one after
another). Anything else is a ValueError naming the file and the JSON value.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping


@dataclass(frozen=True)
class Span:
    """One exported span: ids in hex, ``start`` in ns (0 where the export has none), ``where`` names it in errors."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    start: int
    attributes: Mapping[str, Any]
    where: str


def read_spans(file: Path) -> Iterator[Span]:
    """Every span in ``file``, in the order written."""
    text = file.read_text(encoding="utf-8")
    for index, value in enumerate(_json_values(file, text)):
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, Mapping) and "resourceSpans" in item:
                yield from _otlp_spans(file, item)
            elif isinstance(item, Mapping) and isinstance(item.get("context"), Mapping) and "name" in item:
                yield _console_span(file, item)
            else:
                keys = sorted(item) if isinstance(item, Mapping) else type(item).__name__
                raise ValueError(f"{file}: JSON value {index}: expected OTLP JSON ({{'resourceSpans': [...]}}) or "
                                 f"the SDK's span.to_json(), got {keys}")


def _json_values(file: Path, text: str) -> Iterator[Any]:
    """The JSON values of ``text`` one after another (one document, JSON lines, or concatenated objects)."""
    decoder, pos = json.JSONDecoder(), 0
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos >= len(text):
            return
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError as exc:
            raise ValueError(f"{file}: not valid JSON at character {pos} ({exc})") from None
        yield value


def _otlp_spans(file: Path, document: Mapping[str, Any]) -> Iterator[Span]:
    for resource in document.get("resourceSpans") or ():
        for scope in resource.get("scopeSpans") or resource.get("instrumentationLibrarySpans") or ():
            for span in scope.get("spans") or ():
                trace_id = _hex_id(span.get("traceId"))
                attributes = {a["key"]: _any_value(a.get("value")) for a in span.get("attributes") or ()}
                yield Span(trace_id, _hex_id(span.get("spanId")), _hex_id(span.get("parentSpanId")),
                            str(span.get("name", "")), int(span.get("startTimeUnixNano") or 0), attributes,
                            f"{file}: trace {trace_id} span {span.get('name', '')!r}")


def _console_span(file: Path, span: Mapping[str, Any]) -> Span:
    context = span["context"]
    trace_id = str(context.get("trace_id", "")).removeprefix("0x")
    parent = span.get("parent_id")
    return Span(trace_id, str(context.get("span_id", "")).removeprefix("0x"),
                 str(parent).removeprefix("0x") if parent else "", str(span["name"]),
                 0, dict(span.get("attributes") or {}), f"{file}: trace {trace_id} span {span['name']!r}")


def _hex_id(value: Any) -> str:
    """An OTLP id as hex (OTLP JSON writes hex; protobuf's own JSON mapping writes base64)."""
    text = str(value or "")
    if not text or all(c in "0123456789abcdefABCDEF" for c in text):
        return text.lower()
    try:
        return base64.b64decode(text, validate=True).hex()
    except ValueError:
        return text


def _any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` as Python (int64 values come as strings in OTLP JSON)."""
    if not isinstance(value, Mapping):
        return value
    if "stringValue" in value:
        return value["stringValue"]
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])
    if "boolValue" in value:
        return bool(value["boolValue"])
    if "arrayValue" in value:
        return [_any_value(v) for v in (value["arrayValue"] or {}).get("values") or ()]
    if "kvlistValue" in value:
        return {kv["key"]: _any_value(kv.get("value")) for kv in (value["kvlistValue"] or {}).get("values") or ()}
    if "bytesValue" in value:
        return value["bytesValue"]
    return None


__all__ = ["Span", "read_spans"]
