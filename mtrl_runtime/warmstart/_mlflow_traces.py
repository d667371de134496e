"""Conversations from MLflow traces: mtrl's own and what MLflow's autologging writes for OpenAI and LangChain.

``source`` is what a user has:

- a tracking store: a URI as a string (``sqlite:////abs/runs/x/mlflow.db``,
  ``http://mlflow:5000``), or a run folder or its ``mlflow.db`` file; with
  ``#EXPERIMENT`` (a name or an id) to read one experiment, all of them
  otherwise (``runs/x/mlflow.db#mtrl``);
- a JSON file of exported traces (``trace.to_json()`` / ``trace.to_dict()``
  of ``mlflow.search_traces(return_type="list")``): one trace, a list of
  them, or one per line.

What each kind of trace holds, and what is read:

- mtrl's (tagged ``mtrl.rollout_id``, ``tracking.Tracker``): a span per
  model call, ``llm turn N``: inputs ``{"messages", "tools"}`` (the request
  as the endpoint received it), outputs ``{"content": completion text,
  "tool_calls", "finish_reason"}``. The reply is the text parsed by the chat
  format the trace names (tag ``mtrl.chat_format``), with the tool calls
  (and their ids) as recorded; without that tag, the next turn's echo of
  it, or the text itself when it calls no tool;
- ``mlflow.openai.autolog()``: a ``CHAT_MODEL`` span per chat completion,
  inputs the call's keyword arguments (``messages``, ``tools``), outputs the
  ``ChatCompletion`` (one conversation per choice); attribute
  ``mlflow.message.format`` ``openai``;
- ``mlflow.langchain.autolog()``: a ``CHAT_MODEL`` span per chat model call,
  inputs ``{"messages": [...]}`` in MLflow's chat format (OpenAI's), outputs
  ``{"choices": [{"message": ...}]}``, tools in ``mlflow.chat.tools``;
  ``mlflow.message.format`` ``langchain``.

A reply the token limit cut (``finish_reason`` ``length``) is marked
(``Conversation.cut``): it is learned without an end token. An mtrl
trace's conversation carries the rollout's reward (``Conversation.reward``:
``mtrl sft`` then needs ``--min-reward``); traces of its validation and
evaluation passes (held-out tasks), of rollouts that did not complete and
of rollouts whose agent reported no reward are left out and counted, as
``--from-run`` leaves those rollouts out.

A failed call (no outputs) is no turn and is left out. A chat span whose
messages cannot be rebuilt (another message format, the Responses API, a
batched LangChain call, mtrl's tool names without definitions) is a
ValueError naming the trace and the span. Traces with no chat span are
skipped and counted (``_from_traces.assemble``).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..chat.formats import CHAT_FORMATS
from ._conversation import Conversation
from ._from_traces import Call, assemble, without_nones
from ._store import never_a_demonstration

_SCHEME = re.compile(r"^[A-Za-z][\w+.-]*://")
_MANGLED = re.compile(r"^[A-Za-z][\w+.-]+:/[^/]")  # what Path() leaves of a URI: 'sqlite:/x.db'
_MTRL_TURN = re.compile(r"^llm turn (\d+)$")
_PAGE = 500


def load(source: str | os.PathLike[str]) -> list[Conversation]:
    """Every conversation in the traces at ``source`` (see the module docstring for what ``source`` may be)."""
    traces, label = _read(source)
    calls: dict[str, list[Call]] = {}
    skipped: list[str] = []
    left_out: Counter[str] = Counter()
    for trace in sorted(traces, key=lambda t: (t.info.request_time or 0, t.info.trace_id)):
        why = _left_out(trace.info.tags or {})
        if why is not None:
            left_out[why] += 1
            continue
        found = trace_calls(trace)
        if found:
            calls[trace.info.trace_id] = found
        else:
            skipped.append(trace.info.trace_id)
    return assemble(calls, skipped, label, left_out)


def _left_out(tags: Mapping[str, str]) -> str | None:
    """Why an mtrl rollout's trace is no demonstration (None: it may be one; other traces always may)."""
    if "mtrl.rollout_id" not in tags:
        return None
    never = never_a_demonstration(tags.get("mtrl.group_id", ""), tags.get("mtrl.status", "completed"))
    if never is None and tags.get("mtrl.reward_defaulted") == "true":
        never = "without a reported reward"
    return None if never is None else f"mtrl rollout(s) {never}"


def trace_calls(trace: Any) -> list[Call]:
    """The chat calls of one MLflow ``Trace``, in the order they started."""
    if "mtrl.rollout_id" in (trace.info.tags or {}):
        return _mtrl_calls(trace)
    out = []
    for span in sorted(trace.data.spans, key=lambda s: s.start_time_ns or 0):
        if span.span_type not in ("CHAT_MODEL", "LLM") or span.outputs is None:
            continue  # not a model call, or one that failed: no reply, no turn
        where = f"mlflow trace {trace.info.trace_id} span {span.name!r}"
        out += _autolog_calls(trace.info.trace_id, span, where)
    return out


# ---- reading traces ---------------------------------------------------------------------------------------------


def _read(source: str | os.PathLike[str]) -> tuple[list[Any], str]:
    text = os.fspath(source)
    if _MANGLED.match(text) and not _SCHEME.match(text):
        raise ValueError(f"mlflow source {text!r} looks like a tracking URI that went through Path(), which drops "
                         "its '//'; pass the URI as a string (e.g. 'sqlite:////abs/path/mlflow.db#experiment')")
    if _SCHEME.match(text):
        uri, _, experiment = text.partition("#")
        return _from_store(uri, experiment), f"mlflow {text}"
    path, experiment = Path(text), ""
    if not path.exists() and "#" in text:
        head, _, experiment = text.rpartition("#")
        path = Path(head)
    if path.is_dir() and (path / "mlflow.db").is_file():
        path = path / "mlflow.db"
    if path.is_file() and path.suffix in (".db", ".sqlite"):
        return _from_store(f"sqlite:///{path.resolve()}", experiment), f"mlflow {text}"
    if path.is_file():
        if experiment:
            raise ValueError(f"mlflow source {text!r}: '#{experiment}' selects an experiment of a tracking store; "
                             f"{str(path)!r} is a JSON file of exported traces")
        return _from_json(path), f"mlflow {text}"
    raise ValueError(f"mlflow source {text!r}: no such file or folder; give a tracking URI (as a string), a run "
                     "folder or its mlflow.db (optionally '#EXPERIMENT'), or a JSON file of exported traces")


def _from_store(uri: str, experiment: str) -> list[Any]:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    if experiment:
        found = client.get_experiment_by_name(experiment)
        if found is None and experiment.isdigit():
            found = client.get_experiment(experiment)
        if found is None:
            names = sorted(e.name for e in client.search_experiments())
            raise ValueError(f"mlflow source {uri}#{experiment}: no experiment named {experiment!r}; "
                             f"known: {', '.join(names) or 'none'}")
        ids = [found.experiment_id]
    else:
        ids = [e.experiment_id for e in client.search_experiments()]
    traces: list[Any] = []
    for start in range(0, len(ids), 100):
        token = None
        while True:
            page = client.search_traces(locations=ids[start : start + 100], max_results=_PAGE, page_token=token)
            traces += list(page)
            token = page.token
            if not token:
                break
    return traces


def _from_json(path: Path) -> list[Any]:
    from mlflow.entities import Trace

    text = path.read_text(encoding="utf-8")
    try:
        records: Iterable[Any] = [json.loads(text)]
    except ValueError:
        records = []
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except ValueError as exc:
                    raise ValueError(f"{path}:{number}: not valid JSON ({exc})") from None
    flat = [item for record in records for item in (record if isinstance(record, list) else [record])]
    traces = []
    for i, item in enumerate(flat):
        if not isinstance(item, Mapping) or "info" not in item or "data" not in item:
            keys = sorted(item) if isinstance(item, Mapping) else type(item).__name__
            raise ValueError(f"{path}: trace {i}: expected an exported MLflow trace {{'info', 'data'}} "
                             f"(trace.to_dict() / trace.to_json()), got {keys}")
        traces.append(Trace.from_dict(dict(item)))
    return traces


# ---- autologged chat spans --------------------------------------------------------------------------------------


def _autolog_calls(trace_id: str, span: Any, where: str) -> list[Call]:
    """A ``CHAT_MODEL`` span of MLflow's OpenAI or LangChain autologging as one call per choice."""
    inputs, outputs = span.inputs, span.outputs
    shape = span.get_attribute("mlflow.message.format")
    if not isinstance(inputs, Mapping) or not isinstance(inputs.get("messages"), list):
        hint = ("an OpenAI Responses API call (input=...), which is not read: record chat completions"
                if isinstance(inputs, Mapping) and "input" in inputs else
                "a batched LangChain call (one conversation per batch entry) or another message format")
        raise ValueError(f"{where}: its inputs hold no 'messages' list ({shape or 'no mlflow.message.format'}); "
                         f"it looks like {hint}")
    choices = outputs.get("choices") if isinstance(outputs, Mapping) else None
    if not isinstance(choices, list) or not choices:
        raise ValueError(f"{where}: its outputs hold no 'choices' (got {_preview(outputs)}); "
                         "cannot tell what the model answered")
    tools = _span_tools(span, inputs, where)
    out = []
    for i, choice in enumerate(choices):
        message = choice.get("message") if isinstance(choice, Mapping) else None
        if not isinstance(message, Mapping):
            raise ValueError(f"{where}: outputs.choices[{i}] has no message (got {_preview(choice)})")
        reply = {"role": "assistant", **without_nones(message)}
        request = tuple(without_nones(m) if isinstance(m, Mapping) else m for m in inputs["messages"])
        label = where if len(choices) == 1 else f"{where} choice {i}"
        out.append(Call(trace_id, (*request, reply), tools, label, root=span.parent_id is None,
                        cut=choice.get("finish_reason") == "length"))
    return out


def _span_tools(span: Any, inputs: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], ...]:
    """The tools as sent: OpenAI's call arguments, LangChain's ``invocation_params`` when OpenAI-shaped, else
    ``mlflow.chat.tools`` (MLflow's parsed copy, whose JSON-schema keys may be reordered: the prompt would differ)."""
    invocation = span.get_attribute("invocation_params")
    sent = invocation.get("tools") if isinstance(invocation, Mapping) else None
    if not (isinstance(sent, list) and all(isinstance(t, Mapping) and "function" in t for t in sent)):
        sent = None
    tools = inputs.get("tools") or sent or span.get_attribute("mlflow.chat.tools") or []
    if not isinstance(tools, list):
        raise ValueError(f"{where}: tools must be a list of tool definitions, got {_preview(tools)}")
    out = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping):
            raise ValueError(f"{where}: tool {_preview(tool)} is not an OpenAI function tool "
                             "({'type': 'function', 'function': {...}})")
        out.append({"type": "function", "function": without_nones(function)})
    return tuple(out)


# ---- mtrl's own traces ------------------------------------------------------------------------------------------


def _mtrl_calls(trace: Any) -> list[Call]:
    """mtrl's trace of one rollout: each ``llm turn N`` span as its request plus the reply the endpoint sent."""
    trace_id = trace.info.trace_id
    fmt_name = trace.info.tags.get("mtrl.chat_format")
    if fmt_name and fmt_name not in CHAT_FORMATS:
        raise ValueError(f"mlflow trace {trace_id}: tag mtrl.chat_format names {fmt_name!r}, which this mtrl does not "
                         f"know ({', '.join(CHAT_FORMATS.names())}); import the run's trajectories.db instead")
    fmt = CHAT_FORMATS.get(fmt_name) if fmt_name else None
    turns = sorted((int(m.group(1)), s) for s in trace.data.spans if (m := _MTRL_TURN.match(s.name or "")))
    reward = float(trace.info.tags["mtrl.reward"]) if "mtrl.reward" in trace.info.tags else None
    out = []
    for position, (index, span) in enumerate(turns):
        where = f"mlflow trace {trace_id} (rollout {trace.info.tags['mtrl.rollout_id']}) span 'llm turn {index}'"
        inputs, outputs = span.inputs or {}, span.outputs or {}
        messages, tools = inputs.get("messages"), inputs.get("tools") or []
        if not isinstance(messages, list) or not isinstance(outputs, Mapping) or "content" not in outputs:
            raise ValueError(f"{where}: expected inputs {{'messages', 'tools'}} and outputs {{'content', "
                             f"'tool_calls'}}, got {_preview(inputs)} -> {_preview(outputs)}")
        if any(not isinstance(t, Mapping) for t in tools):
            raise ValueError(f"{where}: its tools are names only ({_preview(tools)}), as mtrl traced them before "
                             "tool definitions were recorded; the prompt cannot be rebuilt from names: import the "
                             "run's trajectories.db instead")
        following = turns[position + 1][1].inputs if position + 1 < len(turns) else None
        reply = _mtrl_reply(where, fmt, messages, outputs, bool(tools), following)
        out.append(Call(trace_id, (*messages, reply), tuple(tools), where, cut=outputs.get("finish_reason") == "length",
                        reward=reward))
    return out


def _mtrl_reply(where: str, fmt: Any, messages: list[Any], outputs: Mapping[str, Any], has_tools: bool,
                following: Any) -> dict[str, Any]:
    """The assistant message the endpoint sent for one turn of mtrl's trace."""
    text, calls = outputs.get("content") or "", list(outputs.get("tool_calls") or [])
    if fmt is not None:
        reply = fmt.parse(text, calls=has_tools).to_message()
        if calls:  # the ids the agent saw (parsing makes new ones); the calls themselves are the same
            reply["tool_calls"] = calls
        return without_nones(reply)
    echoed = following.get("messages") if isinstance(following, Mapping) else None
    if isinstance(echoed, list) and len(echoed) > len(messages) and echoed[: len(messages)] == messages:
        return dict(echoed[len(messages)])
    if not calls:
        return {"role": "assistant", "content": text}
    raise ValueError(f"{where}: the reply calls tools and the trace names no chat format (tag mtrl.chat_format) to "
                     "split its text into content and calls; traces of mtrl runs record it since warm start was "
                     "added: import the run's trajectories.db instead")


def _preview(value: Any, limit: int = 160) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["load", "trace_calls"]
