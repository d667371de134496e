"""Conversations from OpenTelemetry GenAI spans exported as JSON.

``source`` is a file, or a folder of ``*.json`` / ``*.jsonl`` files, of
OTLP JSON or the Python SDK's ``ConsoleSpanExporter`` output (read by
``_otel_files``).

A chat span is one whose ``gen_ai.operation.name`` is ``chat`` or
``generate_content``, or that carries messages. Its messages are read from
the GenAI semantic conventions' attributes:

- newer, structured: ``gen_ai.input.messages`` / ``gen_ai.output.messages``
  (JSON: ``[{"role", "parts": [{"type": "text", "content"} | {"type":
  "tool_call", "id", "name", "arguments"} | {"type": "tool_call_response",
  "id", "response"} | {"type": "reasoning", "content"}]}]``, one output
  message per choice), ``gen_ai.system_instructions``;
- older, flattened: ``gen_ai.prompt.N.role`` / ``.content`` /
  ``.tool_call_id`` / ``.tool_calls.M.id|name|arguments`` and
  ``gen_ai.completion.N.*`` the same way;
- a reply's finish reason: the output message's ``finish_reason``,
  ``gen_ai.completion.N.finish_reason`` or ``gen_ai.response.finish_reasons``;
  ``length`` (the token limit cut it) marks it ``Conversation.cut``;
- tools: ``gen_ai.tool.definitions`` (``[{"type": "function", "name",
  "description", "parameters"}]``) or the older ``llm.request.functions.N.
  name|description|parameters``, on the chat span or an enclosing one (an
  ``invoke_agent`` span), since some instrumentations record them there only.

A span whose ``gen_ai.operation.name`` is an agent's or a tool's
(``invoke_agent``, ``execute_tool`` ...) is not a model call even when it
carries messages (some frameworks put the agent's input and final answer
there): its chat spans hold the dialogue. A semconv message without a
``parts`` list, or a text or reasoning part whose ``content`` is not a
string, is a ValueError naming the part; tool results that share a message
with text come first, next to the calls they answer.

Spans are grouped by trace; ``_from_traces.assemble`` keeps one conversation
per dialogue (the last chat span of a trace carries the whole history) and
merges traces that are one chat call, nothing around it, into the
conversation they begin. A chat span without
messages (content capture off), with content uploaded elsewhere (``*.ref``),
with a non-text part, or with tool calls but no tool definitions anywhere in
its trace, is a ValueError naming the file, trace and span, and the setting
that records what is missing. Traces without a chat span are skipped and
counted.

An error in a rebuilt message (``messages[i]`` of the OpenAI-format list,
where one semconv message may become several) also names the span field
it was rebuilt from (``gen_ai.input.messages[j].parts[k]``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from ._conversation import Conversation
from ._from_traces import Call, assemble, function_tool, tool_call
from ._otel_files import Span, read_spans

_CHAT_OPERATIONS = ("chat", "generate_content")
_NOT_CHAT_OPERATIONS = ("invoke_agent", "create_agent", "execute_tool", "embeddings")
_CAPTURE_HINT = ("the instrumentation recorded no message content: with opentelemetry-instrumentation-openai-v2 set "
                 "OTEL_SEMCONV_STABILITY_OPT_IN=gen_ai_latest_experimental and "
                 "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_only (content on the span, not in events); "
                 "with OpenLLMetry (traceloop) TRACELOOP_TRACE_CONTENT=true")


def load(source: str | os.PathLike[str]) -> list[Conversation]:
    """Every conversation in the exported spans at ``source`` (a file, or a folder of .json/.jsonl files)."""
    path = Path(source)
    files = sorted(p for p in path.iterdir() if p.suffix in (".json", ".jsonl")) if path.is_dir() else [path]
    if not path.exists() or not files:
        raise ValueError(f"otel source {str(path)!r}: no such file, or a folder without .json/.jsonl files")
    traces: dict[str, list[Span]] = {}
    for file in files:
        for span in read_spans(file):
            traces.setdefault(span.trace_id, []).append(span)
    calls: dict[str, list[Call]] = {}
    skipped = []
    for trace_id, spans in sorted(traces.items(), key=lambda item: min(s.start for s in item[1])):
        found = trace_calls(spans)
        if found:
            calls[trace_id] = found
        else:
            skipped.append(trace_id)
    return assemble(calls, skipped, f"otel {path}")


def trace_calls(spans: list[Span]) -> list[Call]:
    """The chat calls of one trace's spans, in the order they started (one per output message)."""
    by_id = {s.span_id: s for s in spans}
    out = []
    for span in sorted(spans, key=lambda s: s.start):
        if not _is_chat(span.attributes):
            continue
        request, replies = _messages(span)  # each (message, the span field it was rebuilt from)
        tools = _tools(span, by_id)
        if not tools and any(m.get("tool_calls") for m, _ in (*request, *replies)):
            raise ValueError(f"{span.where}: the conversation calls tools, and neither the span nor one enclosing it "
                             "records their definitions (gen_ai.tool.definitions, or llm.request.functions.N.*); "
                             "record them on the span or on the agent's invoke_agent span")
        cut = _cut(span, len(replies))
        for i, reply in enumerate(replies):
            where = span.where if len(replies) == 1 else f"{span.where} output {i}"
            messages, origins = zip(*request, reply)
            out.append(Call(span.trace_id, messages, tools, where, root=not span.parent_id, cut=cut[i],
                            origins=origins))
    return out


# ---- messages ---------------------------------------------------------------------------------------------------


def _is_chat(attributes: Mapping[str, Any]) -> bool:
    """A model call. An agent's or a tool's span may carry the agent's input and final answer as messages
    (``invoke_agent``); those repeat what its chat spans hold and are not a call of their own."""
    operation = attributes.get("gen_ai.operation.name") or attributes.get("llm.request.type")
    if operation in _NOT_CHAT_OPERATIONS:
        return False
    return (operation in _CHAT_OPERATIONS or "gen_ai.input.messages" in attributes
            or "gen_ai.prompt.0.role" in attributes or "gen_ai.prompt.0.content" in attributes)


Located = tuple[dict[str, Any], str]  # a message in OpenAI's format, and the span field it was rebuilt from


def _messages(span: Span) -> tuple[list[Located], list[Located]]:
    """(request messages, one reply per output message) of a chat span, in OpenAI's format, each with its field."""
    attrs = span.attributes
    for key in ("gen_ai.input.messages.ref", "gen_ai.output.messages.ref"):
        if key in attrs and key.removesuffix(".ref") not in attrs:
            raise ValueError(f"{span.where}: its messages were uploaded to {attrs[key]!r} ({key}) and are not on "
                             f"the span; also set OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_only")
    if "gen_ai.input.messages" in attrs:
        request = _structured(span, "gen_ai.input.messages")
        system = _json_attribute(span, "gen_ai.system_instructions") if "gen_ai.system_instructions" in attrs else None
        if system and not (request and request[0][0]["role"] == "system"):
            request.insert(0, _from_parts(span, "gen_ai.system_instructions", "system",
                                          system if isinstance(system, list) else [system])[0])
        replies = _structured(span, "gen_ai.output.messages") if "gen_ai.output.messages" in attrs else []
    else:
        request, replies = _flattened(span, "gen_ai.prompt"), _flattened(span, "gen_ai.completion")
    if not request:
        raise ValueError(f"{span.where}: a chat span without its input messages; {_CAPTURE_HINT}")
    if not replies:
        raise ValueError(f"{span.where}: a chat span without the model's reply (gen_ai.output.messages or "
                         f"gen_ai.completion.N.*): the call failed, or {_CAPTURE_HINT}")
    return request, [(dict(r, role="assistant"), origin) for r, origin in replies]


def _cut(span: Span, replies: int) -> list[bool]:
    """Whether the token limit cut each reply: its finish reason ``length``, from the output message
    (``finish_reason``), the flattened ``gen_ai.completion.N.finish_reason``, else
    ``gen_ai.response.finish_reasons``."""
    attrs = span.attributes
    reasons: list[Any] = []
    if "gen_ai.output.messages" in attrs:
        messages = _json_attribute(span, "gen_ai.output.messages")
        reasons = [m.get("finish_reason") if isinstance(m, Mapping) else None for m in messages]
    elif "gen_ai.input.messages" not in attrs:
        reasons = [attrs.get(f"gen_ai.completion.{i}.finish_reason") for i in _sub_indices(attrs, "gen_ai.completion.")]
    if len(reasons) != replies or not any(reasons):
        listed = attrs.get("gen_ai.response.finish_reasons")
        reasons = list(listed) if isinstance(listed, (list, tuple)) and len(listed) == replies else reasons
    return [i < len(reasons) and reasons[i] == "length" for i in range(replies)]


def _structured(span: Span, key: str) -> list[Located]:
    messages = _json_attribute(span, key)
    if not isinstance(messages, list):
        raise ValueError(f"{span.where}: {key} must be a JSON list of messages, got {type(messages).__name__}")
    out: list[Located] = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("parts"), list):
            hint = ("; 'content' is OpenAI's message shape, the GenAI conventions put the text in parts"
                    if isinstance(message, Mapping) and "content" in message else "")
            raise ValueError(f"{span.where}: {key}[{i}] must be {{'role', 'parts': [...]}}, got {message!r}{hint}")
        out += _from_parts(span, f"{key}[{i}]", message.get("role"), message.get("parts") or [])
    return out


def _from_parts(span: Span, where: str, role: Any, parts: list[Any]) -> list[Located]:
    """One semconv message as OpenAI messages: tool results become ``tool`` messages, one per result (each located
    at its part)."""
    texts, calls, reasoning, results = [], [], [], []
    for j, part in enumerate(parts):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in ("text", "reasoning") and not isinstance(part.get("content"), str):
            raise ValueError(f"{span.where}: {where}.parts[{j}].content: a {kind} part's content must be a string, "
                             f"got {part.get('content')!r} (keys {sorted(part)})")
        if kind == "text":
            texts.append(part["content"])
        elif kind == "tool_call":
            calls.append(tool_call(part.get("id"), part.get("name"), part.get("arguments")))
        elif kind == "tool_call_response":
            response = part.get("response")
            content = response if isinstance(response, str) else json.dumps(response, ensure_ascii=False)
            results.append(({"role": "tool", "content": content, **({"tool_call_id": str(part["id"])}
                                                                    if part.get("id") else {})}, f"{where}.parts[{j}]"))
        elif kind == "reasoning":
            reasoning.append(part["content"])
        else:
            raise ValueError(f"{span.where}: {where}.parts[{j}]: a part of type {kind!r} is not read; the policy "
                             "endpoint is text-only (text, tool_call, tool_call_response, reasoning)")
    message: dict[str, Any] = {"role": role, "content": _content(texts, bool(calls))}
    if calls:
        message["tool_calls"] = calls
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if results and not calls:  # results answer the calls before them: they come first, then what else it says
        return [*results, (message, where)] if texts or reasoning else results
    return [(message, where), *results]


def _content(texts: list[str], has_calls: bool) -> Any:
    if not texts:
        return None if has_calls else ""
    return texts[0] if len(texts) == 1 else [{"type": "text", "text": t} for t in texts]


def _flattened(span: Span, prefix: str) -> list[Located]:
    """The older flattened attributes (``gen_ai.prompt.N.role`` ...) as OpenAI messages."""
    attrs = span.attributes
    indices = sorted({int(k.split(".")[2]) for k in attrs
                      if k.startswith(prefix + ".") and k.split(".")[2].isdigit()})
    out = []
    for i in indices:
        base = f"{prefix}.{i}"
        role = attrs.get(f"{base}.role") or ("assistant" if prefix == "gen_ai.completion" else None)
        calls = [tool_call(attrs.get(f"{base}.tool_calls.{j}.id"), attrs.get(f"{base}.tool_calls.{j}.name"),
                           attrs.get(f"{base}.tool_calls.{j}.arguments"))
                 for j in _sub_indices(attrs, f"{base}.tool_calls.")]
        content = attrs.get(f"{base}.content")
        message: dict[str, Any] = {"role": role, "content": _parts_or_text(content) if content is not None else (
            None if calls else "")}
        if calls:
            message["tool_calls"] = calls
        if attrs.get(f"{base}.tool_call_id"):
            message["tool_call_id"] = str(attrs[f"{base}.tool_call_id"])
        out.append((message, base))
    return out


def _sub_indices(attrs: Mapping[str, Any], prefix: str) -> list[int]:
    return sorted({int(k[len(prefix):].split(".")[0]) for k in attrs
                   if k.startswith(prefix) and k[len(prefix):].split(".")[0].isdigit()})


def _parts_or_text(content: Any) -> Any:
    """Flattened content: a string, or the JSON of a list of content parts (what OpenLLMetry writes for lists)."""
    if isinstance(content, str) and content.startswith("[{"):
        try:
            parts = json.loads(content)
        except ValueError:
            return content
        if isinstance(parts, list) and all(isinstance(p, Mapping) and "type" in p for p in parts):
            return parts
    return content


def _json_attribute(span: Span, key: str) -> Any:
    value = span.attributes[key]
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError as exc:
        raise ValueError(f"{span.where}: {key} is not valid JSON ({exc})") from None


# ---- tools ------------------------------------------------------------------------------------------------------


def _tools(span: Span, by_id: Mapping[str, Span]) -> tuple[dict[str, Any], ...]:
    """The tool definitions on the span, else on the nearest enclosing span that has them."""
    seen = set()
    current: Span | None = span
    while current is not None and current.span_id not in seen:
        seen.add(current.span_id)
        tools = _span_tools(current)
        if tools:
            return tools
        current = by_id.get(current.parent_id)
    return ()


def _span_tools(span: Span) -> tuple[dict[str, Any], ...]:
    try:
        return _definitions(span)
    except ValueError as exc:
        if str(exc).startswith(span.where):
            raise
        raise ValueError(f"{span.where}: {exc}") from None


def _definitions(span: Span) -> tuple[dict[str, Any], ...]:
    attrs = span.attributes
    if "gen_ai.tool.definitions" in attrs:
        definitions = _json_attribute(span, "gen_ai.tool.definitions")
        if not isinstance(definitions, list):
            raise ValueError(f"{span.where}: gen_ai.tool.definitions must be a JSON list, got {definitions!r}")
        out = []
        for i, tool in enumerate(definitions):
            if not isinstance(tool, Mapping):
                raise ValueError(f"{span.where}: gen_ai.tool.definitions[{i}] must be an object, got {tool!r}")
            fn = tool.get("function") if isinstance(tool.get("function"), Mapping) else tool  # OpenAI's nesting
            out.append(function_tool(fn.get("name"), fn.get("description"), fn.get("parameters")))
        return tuple(out)
    prefix = "llm.request.functions."
    return tuple(function_tool(attrs.get(f"{prefix}{i}.name"), attrs.get(f"{prefix}{i}.description"),
                               attrs.get(f"{prefix}{i}.parameters")) for i in _sub_indices(attrs, prefix))


__all__ = ["load", "trace_calls"]
