"""Warm start from traces: MLflow (mtrl's own, OpenAI and LangChain autologging) and OpenTelemetry GenAI spans.

Each test records real traces of a real agent: a ``@rollout`` agent (a
plain OpenAI client, or a LangChain ``ChatOpenAI`` with a bound tool) calls
``lookup`` through the served endpoint (scripted engine, tiny tokenizer),
while MLflow's autologging, mtrl's ``Tracker`` or an OpenTelemetry
instrumentation (``opentelemetry-instrumentation-openai-v2``, OpenLLMetry's
``opentelemetry-instrumentation-openai``; spans written by the SDK's OTLP
JSON ``FileSpanExporter``) records the same calls. Every imported
conversation must render to the token ids its live rollout recorded, and
carry the rollout's messages, tool-call ids and tools. The older flattened
``gen_ai.prompt.N.*`` attributes are no longer written by either installed
instrumentation: those spans are written with the OTel SDK as that
convention names them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

import pytest

from _groups import one_worker
from mtrl_runtime.algorithms.samples import build_samples
from mtrl_runtime.chat import CHAT_TEMPLATE_META, normalize_messages
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.engines.scripted import ScriptedReply
from mtrl_runtime.rollouts import collect_rollouts
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.tracking import Tracker
from mtrl_runtime.types import RolloutStatus, Task
from mtrl_runtime.warmstart import importer, render_conversation

pytestmark = one_worker(__name__)  # the migrated MLflow store, built once

LOOKUP = {"type": "function", "function": {
    "name": "lookup", "description": "The value stored under a key.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
TASKS = [Task(id="one", prompt="What is the value under A1? (one)"),
         Task(id="two", prompt="What is the value under A1? (two)")]
DEFINITIONS = json.dumps([{"type": "function", **LOOKUP["function"]}])  # semconv's flat tool definition
BASE_URL = "http://agent.invalid/v1"  # the @rollout decorator sends every call to the coordinator instead


def script() -> list[Any]:
    return [ScriptedReply.tool_call("lookup", {"key": "A1"}), "ANSWER 42"]


def collect(run_dir: Path, agent: Any, tokenizer: Any, max_turns: int = 4, tasks: list[Task] = TASKS) -> Any:
    config = MtrlConfig.from_dict({"core": {"run_dir": str(run_dir), "group_size": 1, "engine": "scripted",
                                            "max_turns": max_turns}, "advanced": {"max_concurrency": 2}})
    return asyncio.run(collect_rollouts(config, agent, tasks, engine=ScriptedEngine(tokenizer, script())))


def openai_agent(around: Callable[[Task], Any] | None = None) -> Any:
    """A plain OpenAI-client tool loop; ``around(task)``: a context manager the whole episode runs in."""
    import openai

    from mtrl_adapters import aupdate_reward, record_tool_call, rollout

    @rollout
    async def agent(task: Task) -> None:
        client = openai.AsyncOpenAI(base_url=BASE_URL, api_key="unused", max_retries=0)
        with around(task) if around is not None else contextlib.nullcontext():
            messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
            while True:
                reply = await client.chat.completions.create(model="policy", messages=messages, tools=[LOOKUP])
                message = reply.choices[0].message
                messages.append(message.model_dump(exclude_none=True))
                if not message.tool_calls:
                    break
                for call in message.tool_calls:
                    arguments = json.loads(call.function.arguments)
                    value = {"A1": "42"}.get(arguments["key"], "none")
                    record_tool_call(call.function.name, arguments, result=value, call_id=call.id)
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": value})
        await aupdate_reward(float(message.content == "ANSWER 42"))

    return agent


def langchain_agent() -> Any:
    """A LangChain chat model with a bound tool, in the tool loop LangChain's docs teach."""
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    from mtrl_adapters import aupdate_reward, rollout

    @tool
    def lookup(key: str) -> str:
        """The value stored under a key."""
        return {"A1": "42"}.get(key, "none")

    @rollout
    async def agent(task: Task) -> None:
        model = ChatOpenAI(model="policy", base_url=BASE_URL, api_key="unused", max_retries=0).bind_tools([lookup])
        messages: list[Any] = [HumanMessage(task.prompt)]
        while True:
            reply = await model.ainvoke(messages)
            messages.append(reply)
            if not reply.tool_calls:
                break
            for call in reply.tool_calls:
                messages.append(lookup.invoke(call))  # a ToolMessage; the rollout's LangChain callbacks record it
        await aupdate_reward(float(reply.content == "ANSWER 42"))

    return agent


def assert_round_trip(conversations: list[Any], rollouts: list[Any], tokenizer: Any) -> None:
    """One conversation per rollout; each renders to the ids its rollout recorded and holds its messages and tools."""
    assert len(conversations) == len(rollouts), [c.source for c in conversations]
    by_prompt = {c.messages[0]["content"]: c for c in conversations}
    prompts = {t.id: t.prompt for t in TASKS}
    for rollout in rollouts:
        conversation = by_prompt[prompts[rollout.task_id]]
        turns = sorted(rollout.turns, key=lambda t: t.index)
        ids, mask = render_conversation(tokenizer, conversation)
        assert ids == list(turns[-1].prompt_ids) + list(turns[-1].completion_ids), conversation.source
        [sample] = build_samples(rollout, [1.0] * len(turns))
        assert mask == list(sample.loss_mask_T)
        last = turns[-1]
        reply = {"role": "assistant", "content": last.completion_text, "tool_calls": list(last.tool_calls)}
        assert normalize_messages(conversation.messages) == normalize_messages([*last.messages, reply])
        assert [dict(t) for t in conversation.tools] == [dict(t) for t in last.tools]
        call = conversation.messages[1]["tool_calls"][0]  # the id, name and JSON arguments the agent saw
        assert call["id"] == turns[0].tool_calls[0]["id"] and call["function"]["name"] == "lookup"
        assert isinstance(call["function"]["arguments"], str) and json.loads(call["function"]["arguments"]) == {"key": "A1"}
        assert conversation.messages[2] == {"role": "tool", "tool_call_id": call["id"], "content": "42"}


# -- MLflow ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def empty_mlflow_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new MLflow SQLite store, copied by each test: creating one runs MLflow's migrations (seconds)."""
    from mlflow import MlflowClient

    path = tmp_path_factory.mktemp("mlflow") / "mlflow.db"
    MlflowClient(f"sqlite:///{path}").search_experiments()
    return path


def fresh_mlflow_db(empty: Path, folder: Path) -> Path:
    """A copy of ``empty`` in ``folder``, its Default experiment's artifacts in ``folder/mlartifacts``: MLflow names
    ``<working folder>/mlruns`` when it creates a store, and autologging's traces wrote their spans into the
    checkout (``traces.json`` under ``./mlruns/0/traces``) until this set it."""
    folder.mkdir(parents=True, exist_ok=True)
    path = Path(shutil.copy(empty, folder / "mlflow.db"))
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                   ((folder / "mlartifacts" / "0").resolve().as_uri(),))
    return path


@pytest.fixture
def mlflow_uri(tmp_path: Path, empty_mlflow_db: Path) -> Any:
    """MLflow's process-wide tracking URI on a SQLite file in tmp_path (traces of autologging go there)."""
    import mlflow

    previous = mlflow.get_tracking_uri() if mlflow.is_tracking_uri_set() else None
    uri = f"sqlite:///{fresh_mlflow_db(empty_mlflow_db, tmp_path)}"
    mlflow.set_tracking_uri(uri)
    mlflow.tracing.reset()
    try:
        yield uri
    finally:
        mlflow.openai.autolog(disable=True)
        mlflow.langchain.autolog(disable=True)
        mlflow.flush_trace_async_logging()
        mlflow.set_tracking_uri(previous or uri)  # not None: MLflow's default is ./mlruns, inside the checkout
        mlflow.tracing.reset()


def assert_artifacts_under(uri: str, folder: Path) -> None:
    """Every trace in ``uri`` keeps its artifacts (spans, when the store does not hold them; attachments) under
    ``folder``. MLflow writes a trace's spans into its SQL store or, where it cannot, into ``traces.json`` at the
    trace's artifact location; the location is recorded either way, so it is what is checked."""
    from mlflow import MlflowClient

    traces = MlflowClient(uri).search_traces(locations=["0"])
    assert traces, "no trace was recorded"
    places = {t.info.tags["mlflow.artifactLocation"] for t in traces}
    assert all(place.startswith(folder.resolve().as_uri() + "/") for place in places), places


def test_openai_autologged_calls_import_as_the_rollouts_conversations(mlflow_uri, tmp_path, tiny_tok, capsys):
    import mlflow
    from mlflow import MlflowClient

    mlflow.openai.autolog()
    result = collect(tmp_path / "run", openai_agent(), tiny_tok)
    mlflow.flush_trace_async_logging()
    assert {r.status.value for r in result.rollouts} == {"completed"}
    assert_artifacts_under(mlflow_uri, tmp_path)

    conversations = importer("mlflow")(mlflow_uri)  # no enclosing span: one trace per call, merged back
    assert_round_trip(conversations, result.rollouts, tiny_tok)
    assert "2 conversation(s) from 4 trace(s); 2 one-call trace(s) began a conversation" in capsys.readouterr().err

    traces = MlflowClient(mlflow_uri).search_traces(locations=["0"])  # exported: a list, and one trace per line
    (tmp_path / "traces.json").write_text(json.dumps([t.to_dict() for t in traces]))
    (tmp_path / "traces.jsonl").write_text("".join(t.to_json() + "\n" for t in traces))
    for exported in ("traces.json", "traces.jsonl"):
        assert_round_trip(importer("mlflow")(tmp_path / exported), result.rollouts, tiny_tok)
    assert_round_trip(importer("mlflow")(str(tmp_path / "mlflow.db") + "#Default"), result.rollouts, tiny_tok)


def test_langchain_autologged_calls_import_as_the_rollouts_conversations(mlflow_uri, tmp_path, tiny_tok):
    import mlflow

    mlflow.langchain.autolog()
    result = collect(tmp_path / "run", langchain_agent(), tiny_tok)
    mlflow.flush_trace_async_logging()
    assert {r.status.value for r in result.rollouts} == {"completed"}
    assert_round_trip(importer("mlflow")(mlflow_uri + "#Default"), result.rollouts, tiny_tok)
    assert_artifacts_under(mlflow_uri, tmp_path)


def as_completed(rollout: Any) -> Any:
    """``rollout`` (ended by max_turns before its agent reported) as if it had completed with reward 0."""
    return replace(rollout, status=RolloutStatus.COMPLETED, reward=0.0, reward_defaulted=False)


def test_mtrl_traces_import_and_the_last_reply_is_parsed_with_the_traced_chat_format(
        tmp_path, tiny_tok, empty_mlflow_db, capsys):
    result = collect(tmp_path / "run", openai_agent(), tiny_tok)
    ended = collect(tmp_path / "cut", openai_agent(), tiny_tok, max_turns=1, tasks=TASKS[:1])  # ends on its call
    config = MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path / "run")}})
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        chat_format = store.get_meta(CHAT_TEMPLATE_META)["chat_format"]  # what the trainer hands its Tracker
    finally:
        store.close()
    fresh_mlflow_db(empty_mlflow_db, tmp_path / "run")  # where the Tracker keeps a run's traces
    tracker = Tracker(config, chat_format=chat_format)
    [rollout] = ended.rollouts
    assert rollout.status.value == "failed"  # max_turns: its trace is left out, as --from-run leaves it out
    held_out = replace(result.rollouts[0], group_id="val-s0-g0")  # a validation pass's: its task is held out
    unrewarded = replace(result.rollouts[0], reward=0.0, reward_defaulted=True)  # the agent never reported one
    try:
        ids = [tracker.write_trace(r, 0) for r in [*result.rollouts, as_completed(rollout)]]
        tracker.write_trace(rollout, 0), tracker.write_trace(held_out, 0), tracker.write_trace(unrewarded, 0)
    finally:
        tracker.close()

    conversations = importer("mlflow")(str(tmp_path / "run") + "#mtrl")
    assert sorted(c.source.split()[2] for c in conversations) == sorted(ids)
    assert ("left out: 1 mtrl rollout(s) failed, 1 mtrl rollout(s) of validation/evaluation passes, "
            "1 mtrl rollout(s) without a reported reward" in capsys.readouterr().err)
    assert [c.reward for c in conversations] == [r.total_reward for r in [*result.rollouts, as_completed(rollout)]]
    whole = [c for c in conversations if c.messages[-1].get("content") == "ANSWER 42"]
    assert_round_trip(whole, result.rollouts, tiny_tok)
    [cut] = [c for c in conversations if c not in whole]  # the reply's calls, parsed back from its text
    [turn] = rollout.turns
    assert [m["role"] for m in cut.messages] == ["user", "assistant"]
    assert cut.messages[1]["tool_calls"][0]["id"] == turn.tool_calls[0]["id"] and not cut.messages[1].get("content")
    ids_, _ = render_conversation(tiny_tok, cut)
    assert ids_ == list(turn.prompt_ids) + list(turn.completion_ids)


def test_mtrl_traces_that_cannot_be_rebuilt_are_named(tmp_path, tiny_tok, empty_mlflow_db):
    from mlflow import MlflowClient

    ended = collect(tmp_path / "cut", openai_agent(), tiny_tok, max_turns=1, tasks=TASKS[:1])
    fresh_mlflow_db(empty_mlflow_db, tmp_path / "run")
    tracker = Tracker(MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path / "run")}}))  # no chat format given
    try:
        trace_id = tracker.write_trace(as_completed(ended.rollouts[0]), 0)
    finally:
        tracker.close()
    with pytest.raises(ValueError, match=rf"mlflow trace {trace_id} .*'llm turn 0': the reply calls tools and the "
                                         r"trace names no chat format \(tag mtrl.chat_format\)"):
        importer("mlflow")(str(tmp_path / "run" / "mlflow.db"))

    [trace] = MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}").search_traces(locations=["1"])
    exported = trace.to_dict()  # as mtrl traced tools before: names only
    for span in exported["data"]["spans"]:
        if span["name"] == "llm turn 0":
            inputs = json.loads(span["attributes"]["mlflow.spanInputs"])
            inputs["tools"] = ["lookup"]
            span["attributes"]["mlflow.spanInputs"] = json.dumps(inputs)
    (tmp_path / "old.json").write_text(json.dumps(exported))
    with pytest.raises(ValueError, match=rf"mlflow trace {trace_id} .*its tools are names only"):
        importer("mlflow")(tmp_path / "old.json")


def test_mlflow_sources_that_do_not_exist_are_named(tmp_path, mlflow_uri):
    with pytest.raises(ValueError, match=r"no experiment named 'nope'; known: Default"):
        importer("mlflow")(mlflow_uri + "#nope")
    with pytest.raises(ValueError, match=r"went through Path\(\).*pass the URI as a string"):
        importer("mlflow")(Path(mlflow_uri))
    with pytest.raises(ValueError, match=r"no such file or folder"):
        importer("mlflow")(tmp_path / "missing.json")
    (tmp_path / "x.json").write_text(json.dumps({"messages": []}))
    with pytest.raises(ValueError, match=r"x.json: trace 0: expected an exported MLflow trace"):
        importer("mlflow")(tmp_path / "x.json")


# -- OpenTelemetry --------------------------------------------------------------------------------------------


@pytest.fixture
def otel(tmp_path: Path) -> Any:
    """An SDK tracer provider whose spans go, as OTLP JSON lines, to tmp_path/spans.jsonl."""
    from opentelemetry.exporter.otlp.json.file import FileSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(tmp_path / "spans.jsonl")))
    yield provider, tmp_path / "spans.jsonl"
    provider.shutdown()


@contextlib.contextmanager
def instrumented(instrumentor: Any, provider: Any) -> Any:
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield
    finally:
        instrumentor.uninstrument()


def test_openai_v2_spans_in_an_agent_span_import_as_the_rollouts_conversations(otel, tmp_path, tiny_tok, monkeypatch):
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    provider, path = otel
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "span_only")
    tracer = provider.get_tracer("agent")

    def agent_span(task: Task) -> Any:  # the agent's own span: the tools live there (the chat spans lack them)
        return tracer.start_as_current_span("invoke_agent lookup", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.tool.definitions": DEFINITIONS})

    with instrumented(OpenAIInstrumentor(), provider):
        result = collect(tmp_path / "run", openai_agent(agent_span), tiny_tok)
    provider.force_flush()
    spans = [json.loads(line) for line in path.read_text().splitlines()]
    names = [s["name"] for d in spans for r in d["resourceSpans"] for ss in r["scopeSpans"] for s in ss["spans"]]
    assert names.count("chat policy") == 4 and names.count("invoke_agent lookup") == 2
    assert_round_trip(importer("otel")(path), result.rollouts, tiny_tok)
    assert_round_trip(importer("otel")(tmp_path), result.rollouts, tiny_tok)  # a folder of exports


def test_openllmetry_spans_import_as_the_rollouts_conversations(otel, tmp_path, tiny_tok, capsys):
    from opentelemetry.instrumentation.openai import OpenAIInstrumentor

    provider, path = otel
    with instrumented(OpenAIInstrumentor(), provider):  # records tools on each chat span; one trace per call
        result = collect(tmp_path / "run", openai_agent(), tiny_tok)
    provider.force_flush()
    assert_round_trip(importer("otel")(path), result.rollouts, tiny_tok)
    assert "2 conversation(s) from 4 trace(s)" in capsys.readouterr().err


def test_flattened_genai_attributes_rebuild_calls_results_and_tools(otel, tiny_tok):
    provider, path = otel
    tracer = provider.get_tracer("old-instrumentation")
    with tracer.start_as_current_span("openai.chat", attributes={
        "llm.request.type": "chat", "gen_ai.system": "openai",
        "gen_ai.prompt.0.role": "system", "gen_ai.prompt.0.content": "Be brief.",
        "gen_ai.prompt.1.role": "user", "gen_ai.prompt.1.content": "What is under A1?",
        "gen_ai.prompt.2.role": "assistant",
        "gen_ai.prompt.2.tool_calls.0.id": "call_7", "gen_ai.prompt.2.tool_calls.0.name": "lookup",
        "gen_ai.prompt.2.tool_calls.0.arguments": '{"key": "A1"}',
        "gen_ai.prompt.3.role": "tool", "gen_ai.prompt.3.content": "42", "gen_ai.prompt.3.tool_call_id": "call_7",
        "gen_ai.completion.0.role": "assistant", "gen_ai.completion.0.content": "ANSWER 42",
        "gen_ai.completion.0.finish_reason": "stop",
        "llm.request.functions.0.name": "lookup", "llm.request.functions.0.description": "The value stored under a key.",
        "llm.request.functions.0.parameters": json.dumps(LOOKUP["function"]["parameters"]),
    }):
        pass
    with tracer.start_as_current_span("GET /health"):  # a trace with no chat call
        pass
    provider.force_flush()
    [conversation] = importer("otel")(path)
    assert list(conversation.messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is under A1?"},
        {"role": "assistant", "tool_calls": [  # no text: no content, as OpenAI's own messages leave it
            {"type": "function", "function": {"name": "lookup", "arguments": '{"key": "A1"}'}, "id": "call_7"}]},
        {"role": "tool", "content": "42", "tool_call_id": "call_7"},
        {"role": "assistant", "content": "ANSWER 42"},
    ]
    assert list(conversation.tools) == [LOOKUP]
    render_conversation(tiny_tok, conversation)  # renders


def test_chat_spans_that_cannot_be_rebuilt_are_named_with_the_setting_that_records_them(otel, tmp_path, capsys):
    provider, path = otel
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("GET /health"):
        pass
    provider.force_flush()
    with pytest.raises(ValueError, match="holds no chat call to import"):
        importer("otel")(path)
    assert "1 trace(s) hold no chat call and were skipped" in capsys.readouterr().err

    with tracer.start_as_current_span("chat policy", attributes={"gen_ai.operation.name": "chat"}) as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.force_flush()
    with pytest.raises(ValueError, match=rf"trace {trace_id} span 'chat policy': a chat span without its input "
                                         r"messages; .*OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=span_only"):
        importer("otel")(path)

    calls = [{"role": "user", "parts": [{"type": "text", "content": "hi"}]}]
    reply = [{"role": "assistant", "parts": [{"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {}}]}]
    other = tmp_path / "calls.jsonl"
    other_provider = type(provider)()
    from opentelemetry.exporter.otlp.json.file import FileSpanExporter
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    other_provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(other)))
    with other_provider.get_tracer("app").start_as_current_span("chat m", attributes={
            "gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(calls),
            "gen_ai.output.messages": json.dumps(reply)}):
        pass
    other_provider.shutdown()
    with pytest.raises(ValueError, match=r"span 'chat m': the conversation calls tools, and neither the span nor one "
                                         r"enclosing it records their definitions"):
        importer("otel")(other)
    image = [{"role": "user", "parts": [{"type": "blob", "modality": "image", "content": "AAAA"}]}]
    (tmp_path / "image.json").write_text(json.dumps({"name": "chat m", "context": {"trace_id": "0x1", "span_id": "0x2"},
                                                     "parent_id": None, "attributes": {
        "gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(image),
        "gen_ai.output.messages": json.dumps(reply)}}, indent=4))  # the SDK's ConsoleSpanExporter shape
    with pytest.raises(ValueError, match=r"gen_ai.input.messages\[0\].parts\[0\]: a part of type 'blob' is not read"):
        importer("otel")(tmp_path / "image.json")


def console_spans(path: Path, spans: list[tuple[str, str | None, dict[str, Any]]]) -> Path:
    """Spans of one trace as the SDK's ``span.to_json()`` writes them: (name, parent span id, attributes)."""
    path.write_text(json.dumps([{"name": name, "context": {"trace_id": "0x7", "span_id": f"0x{i + 1}"},
                                 "parent_id": parent, "attributes": attributes}
                                for i, (name, parent, attributes) in enumerate(spans)]))
    return path


def semconv(*messages: tuple[str, list[dict[str, Any]]]) -> str:
    return json.dumps([{"role": role, "parts": parts} for role, parts in messages])


USER = ("user", [{"type": "text", "content": "What is under A1?"}])
CALL = ("assistant", [{"type": "tool_call", "id": "c1", "name": "lookup", "arguments": {"key": "A1"}}])
ANSWER = ("assistant", [{"type": "text", "content": "ANSWER 42"}])


def test_an_agent_span_that_carries_the_agents_input_and_answer_is_not_a_chat_call_of_its_own(tmp_path, tiny_tok):
    result = ("tool", [{"type": "tool_call_response", "id": "c1", "response": "42"}])
    path = console_spans(tmp_path / "agent.json", [
        ("invoke_agent lookup", None, {  # AG2-style: the agent's span holds its input and its final answer
            "gen_ai.operation.name": "invoke_agent", "gen_ai.tool.definitions": DEFINITIONS,
            "gen_ai.input.messages": semconv(USER), "gen_ai.output.messages": semconv(ANSWER)}),
        ("chat policy", "0x1", {"gen_ai.operation.name": "chat", "gen_ai.input.messages": semconv(USER),
                                "gen_ai.output.messages": semconv(CALL)}),
        ("chat policy", "0x1", {"gen_ai.operation.name": "chat", "gen_ai.input.messages": semconv(USER, CALL, result),
                                "gen_ai.output.messages": semconv(ANSWER)}),
    ])
    [conversation] = importer("otel")(path)  # before: a second, made-up conversation (question -> answer, no call)
    assert [m["role"] for m in conversation.messages] == ["user", "assistant", "tool", "assistant"]
    assert conversation.messages[1]["tool_calls"][0]["function"]["name"] == "lookup"
    render_conversation(tiny_tok, conversation)


def test_semconv_messages_whose_text_is_not_where_the_conventions_put_it_are_named(tmp_path):
    cases = [  # (input messages, what the error must name)
        ([{"role": "user", "content": "Q"}],
         r"gen_ai.input.messages\[0\] must be .*'content' is OpenAI's message shape"),
        ([{"role": "user", "parts": [{"type": "text", "text": "Q"}]}],
         r"gen_ai.input.messages\[0\].parts\[0\].content: a text part's content must be a string, got None"),
        ([{"role": "user", "parts": [{"type": "reasoning", "content": None}]}],
         r"gen_ai.input.messages\[0\].parts\[0\].content: a reasoning part's"),
    ]
    for i, (request, match) in enumerate(cases):  # before: an empty message, trained on as if the user said nothing
        path = console_spans(tmp_path / f"bad{i}.json", [("chat m", None, {
            "gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(request),
            "gen_ai.output.messages": semconv(ANSWER)})])
        with pytest.raises(ValueError, match=match):
            importer("otel")(path)


def test_tool_results_and_text_in_one_user_message_keep_the_results_next_to_their_calls(tmp_path):
    mixed = ("user", [{"type": "tool_call_response", "id": "c1", "response": "42"},
                      {"type": "text", "content": "Now answer."}])
    path = console_spans(tmp_path / "mixed.json", [("chat m", None, {
        "gen_ai.operation.name": "chat", "gen_ai.tool.definitions": DEFINITIONS,
        "gen_ai.input.messages": semconv(USER, CALL, mixed), "gen_ai.output.messages": semconv(ANSWER)})])
    [conversation] = importer("otel")(path)
    assert [(m["role"], m.get("content")) for m in conversation.messages[2:]] == [
        ("tool", "42"), ("user", "Now answer."), ("assistant", "ANSWER 42")]


@pytest.mark.parametrize("field, value, hint", [
    ("refusal", "I can't help with that.", "send the refusal's text as content"),
    ("function_call", {"name": "lookup", "arguments": "{}"}, "send it as tool_calls"),
])
def test_assistant_fields_the_policy_has_no_place_for_are_named_not_dropped(tmp_path, field, value, hint):
    line = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, field: value}]}
    (tmp_path / "c.jsonl").write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=rf"c.jsonl:1: .*messages\[1\]\.{field}: .* is not read .*; {hint}"):
        importer("openai")(tmp_path / "c.jsonl")
    echoed = {"role": "assistant", "content": "ok", "refusal": None, "function_call": None, "audio": None}
    assert normalize_messages([{"role": "user", "content": "q"}, echoed])[1] == {"role": "assistant", "content": "ok"}


# -- replies the token limit cut ----------------------------------------------------------------------------------

LONG = "Let me look that up for you, one moment please."


def cut_agent(around: Callable[[Task], Any] | None = None) -> Any:
    """A first reply the rollout's max_tokens (8) cuts mid-reply, then the user asks the model to go on."""
    import openai

    from mtrl_adapters import aupdate_reward, rollout

    @rollout
    async def agent(task: Task) -> None:
        client = openai.AsyncOpenAI(base_url=BASE_URL, api_key="unused", max_retries=0)
        with around(task) if around is not None else contextlib.nullcontext():
            messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
            first = await client.chat.completions.create(model="policy", messages=messages, tools=[LOOKUP])
            assert first.choices[0].finish_reason == "length"
            messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
            last = await client.chat.completions.create(model="policy", messages=messages, tools=[LOOKUP])
        await aupdate_reward(float(last.choices[0].message.content == "ANSWER 42"))

    return agent


def collect_cut(run_dir: Path, tokenizer: Any, around: Callable[[Task], Any] | None = None) -> Any:
    config = MtrlConfig.from_dict({"core": {"run_dir": str(run_dir), "group_size": 1, "engine": "scripted",
                                            "sampling_params": {"max_tokens": 8}}})
    engine = ScriptedEngine(tokenizer, [LONG, "ANSWER 42"])
    result = asyncio.run(collect_rollouts(config, cut_agent(around), TASKS[:1], engine=engine))
    [rollout] = result.rollouts
    assert rollout.status.value == "completed" and [t.finish_reason for t in rollout.turns] == ["length", "stop"]
    return rollout


def assert_cut_round_trip(conversations: list[Any], rollout: Any, tokenizer: Any) -> None:
    """The cut reply renders as the rollout recorded it: no end token, finish length, the next turn extending it."""
    from mtrl_runtime.warmstart import conversation_renderer

    [conversation] = conversations
    assert conversation.cut == frozenset({1}), conversation
    live = sorted(rollout.turns, key=lambda t: t.index)
    turns = conversation_renderer(tokenizer).turns(conversation)
    assert [t.finish_reason for t in turns] == ["length", "stop"]
    assert [t.completion_ids for t in turns] == [t.completion_ids for t in live]  # before: an end token after the cut
    assert [t.prompt_ids for t in turns] == [t.prompt_ids for t in live]
    ids, mask = render_conversation(tokenizer, conversation)
    [sample] = build_samples(rollout, [1.0, 1.0])
    assert ids == list(sample.token_ids_T) and mask == list(sample.loss_mask_T)


def test_a_reply_cut_at_the_token_limit_imports_as_recorded_from_mtrl_traces(tmp_path, tiny_tok, empty_mlflow_db,
                                                                             capsys):
    rollout = collect_cut(tmp_path / "run", tiny_tok)
    store = SQLiteStore(tmp_path / "run" / "trajectories.db")
    try:
        chat_format = store.get_meta(CHAT_TEMPLATE_META)["chat_format"]
    finally:
        store.close()
    fresh_mlflow_db(empty_mlflow_db, tmp_path / "run")
    tracker = Tracker(MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path / "run")}}), chat_format=chat_format)
    try:
        tracker.write_trace(rollout, 0)
    finally:
        tracker.close()
    assert_cut_round_trip(importer("mlflow")(tmp_path / "run"), rollout, tiny_tok)
    assert "1 repl(ies) were cut at the token limit (finish_reason length)" in capsys.readouterr().err


def test_a_reply_cut_at_the_token_limit_imports_as_recorded_from_openai_autologging(mlflow_uri, tmp_path, tiny_tok):
    import mlflow

    mlflow.openai.autolog()
    rollout = collect_cut(tmp_path / "run", tiny_tok)
    mlflow.flush_trace_async_logging()
    assert_cut_round_trip(importer("mlflow")(mlflow_uri), rollout, tiny_tok)  # the cut call's own trace says so


def test_a_reply_cut_at_the_token_limit_imports_as_recorded_from_otel_spans(otel, tmp_path, tiny_tok, monkeypatch):
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    provider, path = otel
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "gen_ai_latest_experimental")
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "span_only")
    tracer = provider.get_tracer("agent")

    def agent_span(task: Task) -> Any:
        return tracer.start_as_current_span("invoke_agent lookup", attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.tool.definitions": DEFINITIONS})

    with instrumented(OpenAIInstrumentor(), provider):
        rollout = collect_cut(tmp_path / "run", tiny_tok, agent_span)
    provider.force_flush()
    assert_cut_round_trip(importer("otel")(path), rollout, tiny_tok)


def test_a_merged_call_keeps_the_reasoning_and_the_cut_its_own_trace_recorded(tmp_path, capsys):
    thought = ("assistant", [{"type": "reasoning", "content": "The key is A1."},
                             {"type": "text", "content": "Let me"}])
    echoed = ("assistant", [{"type": "text", "content": "Let me"}])  # clients echo a reply without its reasoning
    go_on = ("user", [{"type": "text", "content": "Go on."}])
    first = {"gen_ai.operation.name": "chat", "gen_ai.tool.definitions": DEFINITIONS,
             "gen_ai.input.messages": semconv(USER), "gen_ai.output.messages": json.dumps(
                 [{"role": "assistant", "parts": thought[1], "finish_reason": "length"}])}
    second = {"gen_ai.operation.name": "chat", "gen_ai.tool.definitions": DEFINITIONS,
              "gen_ai.input.messages": semconv(USER, echoed, go_on), "gen_ai.output.messages": semconv(ANSWER)}
    path = console_spans(tmp_path / "two.json", [("invoke_agent a", None, {"gen_ai.operation.name": "invoke_agent"}),
                                                 ("chat m", "0x1", first), ("chat m", "0x1", second)])
    [conversation] = importer("otel")(path)  # before: the first call's reasoning and its cut were lost in the merge
    assert conversation.messages[1] == {"role": "assistant", "content": "Let me", "reasoning_content": "The key is A1."}
    assert conversation.cut == frozenset({1})
    assert "1 call(s) were earlier turns" in capsys.readouterr().err


def test_an_mtrl_runs_traces_need_a_reward_filter_and_other_traces_have_none(tmp_path):
    from mtrl_runtime.warmstart import Conversation, select_by_reward

    def conv(source: str, reward: float | None) -> Conversation:
        return Conversation(({"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}), (), source,
                            reward=reward)

    rollouts = [conv("t1", 1.0), conv("t2", 0.0), conv("t3", 0.5)]
    with pytest.raises(ValueError, match=r"3 of 3 conversations are an mtrl run's rollouts .*\(0 to 1\): give "
                                         r"--min-reward"):
        select_by_reward(rollouts, None)
    kept, below = select_by_reward(rollouts, 0.5)
    assert [c.source for c in kept] == ["t1", "t3"] and below == 1
    with pytest.raises(ValueError, match=r"--min-reward 1: autolog x records no reward"):
        select_by_reward([*rollouts, conv("autolog x", None)], 1.0)
    assert select_by_reward([conv("autolog x", None)], None) == ([conv("autolog x", None)], 0)


def test_an_error_in_a_rebuilt_message_names_the_span_field_it_came_from(tmp_path):
    mixed = ("user", [{"type": "tool_call_response", "id": "c1", "response": "42"},
                      {"type": "text", "content": "Now answer."}])  # one semconv message, two OpenAI ones
    stray = ("tool", [{"type": "tool_call_response", "id": "c9", "response": "?"}])
    path = console_spans(tmp_path / "stray.json", [("chat m", None, {
        "gen_ai.operation.name": "chat", "gen_ai.tool.definitions": DEFINITIONS,
        "gen_ai.input.messages": semconv(USER, CALL, mixed, stray), "gen_ai.output.messages": semconv(ANSWER)})])
    # the rebuilt list's messages[4] is the span's gen_ai.input.messages[3]: before, only the first was named
    with pytest.raises(ValueError, match=r"messages\[4\].tool_call_id 'c9' answers no tool call .* \(messages\[4\] "
                                         r"was rebuilt from gen_ai.input.messages\[3\].parts\[0\]\)"):
        importer("otel")(path)
