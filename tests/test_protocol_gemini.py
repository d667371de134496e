"""Gemini ``generateContent`` / ``streamGenerateContent``, served, called and redirected.

Real packages over real HTTP on loopback, as the agents tests do for the
other protocols (``test_protocols_agents``: its scripted policy, tasks and
checks): ``google-genai`` directly (``generate_content``,
``generate_content_stream``, function calling with automatic function
calling off and on) and a Google ADK ``LlmAgent`` with function tools run by
its ``Runner`` over an ``InMemorySessionService``, as ADK's quickstart
writes it. Every agent is written for Google's real endpoint with a
placeholder key; the ``rollout`` decorator redirects it. Each test runs 16
concurrent rollouts sharing one client (or one ADK agent and runner); every
turn is checked token-exact (each prompt extends the last turn's ids), its
tool calls and reasoning recorded, all its own rollout's.

Then the wire: the stream framings (server-sent events for ``alt=sse``, the
REST API's JSON array without it), bad input answered with a 400 in
Google's error shape naming the field, the key as ``x-goog-api-key`` or
``?key=``, a round trip through both translations, and a Gemini reference
model in an evaluation (mtrl's own Gemini endpoint as the reference).
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from _adapter_support import OFFSET, add, afinish_episode, key_of, lookup, specs, tasks, value_of
from mtrl_adapters import record_tool_call, rollout, rollout_scope
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.types import ChatOptions, SamplingParams
from test_protocols_agents import KEYS, N, _check, _run_all, _serve

genai = pytest.importorskip("google.genai")
types = genai.types

MODEL = "gemini-2.5-flash"
DECLARATIONS = [
    {"name": "lookup", "description": "Look a key up in the table.",
     "parameters": {"type": "OBJECT", "properties": {"key": {"type": "STRING"}}, "required": ["key"]}},
    {"name": "add", "description": "Add two integers.",
     "parameters": {"type": "OBJECT", "properties": {"a": {"type": "INTEGER"}, "b": {"type": "INTEGER"}}}},
]
FUNCTIONS = {"lookup": lookup, "add": add}


def _turns(handle, spec):
    return handle.store.get_rollout(spec.rollout_id).turns


async def test_google_genai_generate_content_and_stream(served):
    """One client, 16 rollouts, each its own tool loop (automatic function calling off): half ``generate_content``,
    half ``generate_content_stream``, the model's turn sent back as it came (thought parts included)."""
    handle = _serve(served)
    client = genai.Client(api_key="user-real-key")  # Google's endpoint, the user's key: both replaced in a rollout
    config = types.GenerateContentConfig(
        system_instruction="Use the tools.", tools=[types.Tool(function_declarations=DECLARATIONS)],
        automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True))
    chunks_seen: list[int] = []

    @rollout
    async def run(task):
        streamed = int(key_of(task.prompt)[1:]) % 2 == 1
        contents = [types.Content(role="user", parts=[types.Part(text=task.prompt)])]
        for turn in range(8):
            if streamed:
                parts: list = []
                count = 0
                async for chunk in await client.aio.models.generate_content_stream(model=MODEL, contents=contents,
                                                                                   config=config):
                    count += 1
                    parts.extend(chunk.candidates[0].content.parts or [])
                chunks_seen.append(count)
                content = types.Content(role="model", parts=_merged(parts))
            else:
                response = await client.aio.models.generate_content(model=MODEL, contents=contents, config=config)
                content = response.candidates[0].content
            contents.append(content)
            calls = [p.function_call for p in content.parts if p.function_call]
            if not calls:
                await afinish_episode(task, turn + 1)
                return "".join(p.text for p in content.parts if p.text and not p.thought)
            results = []
            for call in calls:
                value = FUNCTIONS[call.name](**call.args)
                record_tool_call(call.name, dict(call.args), result=str(value), call_id=call.id)
                results.append(types.Part(function_response=types.FunctionResponse(
                    id=call.id, name=call.name, response={"output": value})))
            contents.append(types.Content(role="user", parts=results))
        raise AssertionError("no answer in 8 turns")

    runs, answers = await _run_all(handle, run)
    for spec, answer in zip(runs, answers):
        key = key_of(spec.task.prompt)
        assert answer == f"The answer for {key} is {value_of(key) + OFFSET}. DONE"
        _check(handle, spec)
        assert _turns(handle, spec)[1].messages[-1]["content"] == str(value_of(key))  # the output, as the model saw it
    streamed_runs = sum(int(key_of(spec.task.prompt)[1:]) % 2 for spec in runs)
    assert len(chunks_seen) == 3 * streamed_runs and max(chunks_seen) >= 2  # text chunks, then the calls and the end


def _merged(parts: list) -> list:
    """A streamed turn's parts as one turn: the thought text joined, the text joined, then the calls."""
    thought = "".join(p.text for p in parts if p.text and p.thought)
    text = "".join(p.text for p in parts if p.text and not p.thought)
    merged = [types.Part(text=thought, thought=True)] if thought else []
    merged += [types.Part(text=text)] if text else []
    return merged + [p for p in parts if p.function_call]


async def test_google_genai_automatic_function_calling(served):
    """Python functions as tools, called by google-genai itself: each rollout one ``generate_content`` call."""
    handle = _serve(served)
    client = genai.Client(api_key="user-real-key")

    async def lookup_tool(key: str) -> int:
        """Look a key up in the table."""
        return lookup(key)

    async def add_tool(a: int, b: int) -> int:
        """Add two integers."""
        return add(a, b)

    lookup_tool.__name__, add_tool.__name__ = "lookup", "add"
    config = types.GenerateContentConfig(system_instruction="Use the tools.", tools=[lookup_tool, add_tool])
    histories: list[int] = []

    @rollout
    async def run(task):
        response = await client.aio.models.generate_content(model=MODEL, contents=task.prompt, config=config)
        history = response.automatic_function_calling_history
        histories.append(len(history))
        # the calls google-genai made, reported from the history it returns: each result follows its call (it
        # carries the call's name, not its id)
        calls = [p.function_call for c in history for p in c.parts if p.function_call]
        results = [p.function_response for c in history for p in c.parts if p.function_response]
        for call, result in zip(calls, results, strict=True):
            assert result.name == call.name
            record_tool_call(call.name, dict(call.args), result=str(result.response["result"]), call_id=call.id)
        await afinish_episode(task, 3)
        return response.text

    runs, answers = await _run_all(handle, run)
    for spec, answer in zip(runs, answers):
        key = key_of(spec.task.prompt)
        assert answer == f"The answer for {key} is {value_of(key) + OFFSET}. DONE"
        _check(handle, spec)
        # google-genai wraps a function's result as {"result": value}: the whole object is the output
        assert _turns(handle, spec)[1].messages[-1]["content"] == json.dumps({"result": value_of(key)},
                                                                              separators=(",", ":"))
    assert histories == [5] * N  # user, call, result, call, result


async def test_google_adk_llm_agent_with_function_tools(served, monkeypatch):
    """ADK's quickstart: an ``LlmAgent`` with Python function tools, run by a ``Runner`` over an
    ``InMemorySessionService``; one agent and runner for 16 rollouts, half with ``StreamingMode.SSE``. The tool
    calls are reported from ADK's documented ``after_tool_callback``."""
    pytest.importorskip("google.adk")
    from google.adk.agents import LlmAgent
    from google.adk.agents.run_config import RunConfig, StreamingMode
    from google.adk.runners import Runner
    from google.adk.sessions import InMemorySessionService

    monkeypatch.setenv("GOOGLE_API_KEY", "user-real-key")
    monkeypatch.setenv("GOOGLE_GENAI_USE_VERTEXAI", "FALSE")
    handle = _serve(served)

    def lookup_value(key: str) -> int:
        """Look a key up in the table."""
        return lookup(key)

    def add_numbers(a: int, b: int) -> int:
        """Add two integers."""
        return add(a, b)

    lookup_value.__name__, add_numbers.__name__ = "lookup", "add"

    def report(tool, args, tool_context, tool_response):
        record_tool_call(tool.name, args, result=str(tool_response), call_id=tool_context.function_call_id)
        return None

    agent = LlmAgent(name="table_agent", model=MODEL, instruction="Answer with the value of the key plus five. "
                     "Use the tools.", tools=[lookup_value, add_numbers], after_tool_callback=report)
    sessions = InMemorySessionService()
    runner = Runner(agent=agent, app_name="tables", session_service=sessions)
    partial_events: list[bool] = []

    @rollout
    async def run(task):
        streamed = int(key_of(task.prompt)[1:]) % 2 == 1
        session = await sessions.create_session(app_name="tables", user_id="user")
        message = types.Content(role="user", parts=[types.Part(text=task.prompt)])
        mode = StreamingMode.SSE if streamed else StreamingMode.NONE
        final = None
        async for event in runner.run_async(user_id="user", session_id=session.id, new_message=message,
                                            run_config=RunConfig(streaming_mode=mode)):
            partial_events.append(bool(event.partial))
            if event.is_final_response() and event.content and event.content.parts:
                final = "".join(p.text or "" for p in event.content.parts if not p.thought)
        await afinish_episode(task, 3)
        return final

    runs, answers = await _run_all(handle, run)
    for spec, answer in zip(runs, answers):
        key = key_of(spec.task.prompt)
        assert answer == f"The answer for {key} is {value_of(key) + OFFSET}. DONE"
        _check(handle, spec)
    assert any(partial_events)  # the SSE runs saw partial events: the answer streamed


def test_clients_outside_a_rollout_are_untouched_and_vertex_is_refused_inside(served):
    from mtrl_adapters import instrument

    instrument()
    handle = _serve(served)
    client = genai.Client(api_key="user-real-key")
    built = client._api_client._build_request("post", f"models/{MODEL}:generateContent", {"contents": []})
    google = "https://generativelanguage.googleapis.com"
    version = built.url.removeprefix(google + "/").split("/")[0]
    assert version in ("v1beta", "v1")  # google-genai 2.x calls v1beta, 3.x v1: mtrl serves both
    assert built.url == f"{google}/{version}/models/{MODEL}:generateContent"
    assert built.headers["x-goog-api-key"] == "user-real-key"
    spec, other = specs(handle, tasks(2))
    vertex = genai.Client(vertexai=True, project="p", location="us-central1")

    @rollout
    def inside(task):
        return client._api_client._build_request("post", f"models/{MODEL}:generateContent",
                                                 {"contents": [], "generationConfig": {"temperature": 0.1}})

    @rollout
    def on_vertex(task):
        return vertex._api_client._build_request("post", f"models/{MODEL}:generateContent", {"contents": []})

    with rollout_scope(spec):
        ours = inside(spec.task)
    with rollout_scope(other), pytest.raises(RuntimeError, match="Vertex AI client"):
        on_vertex(other.task)
    assert ours.url == f"{handle.url}/rollouts/{spec.rollout_id}/{version}/models/{MODEL}:generateContent"
    assert ours.headers["x-goog-api-key"] == spec.token and ours.headers["x-mtrl-rollout-id"] == spec.rollout_id
    assert "user-real-key" not in json.dumps(ours.headers)
    assert ours.data["generationConfig"]["temperature"] == spec.sampling.temperature  # the rollout's sampling


async def test_a_judge_on_gemini_passes_through_recorded_never_trained(served, tiny_tok):
    """With the policy's model named, a google-genai judge (another model, its own endpoint and key) passes through
    untouched, whole and streamed, sync and async, and each call is recorded on the rollout as a non-policy call."""
    judge_key = "judge-real-key"
    judge = served(ScriptedEngine(tiny_tok, lambda request, prompt: "VERDICT good"), MtrlConfig.from_dict(
        {"advanced": {"server": {"inference_mode": True, "api_key": judge_key}}}))
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "policy answer"))
    policy_client = genai.Client(api_key="user-real-key")
    judge_client = genai.Client(api_key=judge_key, http_options={"base_url": judge.url})
    [spec] = specs(handle, tasks(1))

    @rollout(policy_models=["policy-model"])
    async def run(task):
        answer = await policy_client.aio.models.generate_content(model="policy-model", contents=task.prompt)
        verdicts = [judge_client.models.generate_content(model="gemini-judge", contents=answer.text).text,
                    "".join(c.text or "" for c in judge_client.models.generate_content_stream(model="gemini-judge",
                                                                                             contents="again")),
                    (await judge_client.aio.models.generate_content(model="gemini-judge", contents="x")).text]
        streamed = ""
        async for chunk in await judge_client.aio.models.generate_content_stream(model="gemini-judge", contents="y"):
            streamed += chunk.text or ""
        await afinish_episode(task, 1)
        return answer.text, verdicts + [streamed]

    with rollout_scope(spec):
        answer, verdicts = await run(spec.task)
    assert answer == "policy answer" and verdicts == ["VERDICT good"] * 4
    stored = handle.store.get_rollout(spec.rollout_id)
    assert [t.completion_text for t in stored.turns] == ["policy answer"]  # only the policy's call is a turn
    calls = stored.model_calls
    assert [(c.protocol, c.model, c.stream, c.status) for c in calls] == [
        ("gemini", "gemini-judge", False, "success"), ("gemini", "gemini-judge", True, "success"),
        ("gemini", "gemini-judge", False, "success"), ("gemini", "gemini-judge", True, "success")]
    assert all(c.input_tokens and c.output_tokens for c in calls), calls


# ---------------------------------------------------------------------------------------------- the wire
@pytest.fixture
def handle(served, tiny_tok):
    from _adapter_support import policy

    return served(ScriptedEngine(tiny_tok, policy))


def _path(rollout_id: str, method: str = "generateContent") -> str:
    return f"/rollouts/{rollout_id}/v1beta/models/{MODEL}:{method}"


def _user(text: str) -> dict:
    return {"role": "user", "parts": [{"text": text}]}


TOOLS = [{"functionDeclarations": DECLARATIONS}]
BAD = [
    ({}, "contents", ["field required"]),
    ({"contents": []}, "contents", ["at least 1"]),
    ({"contents": [{"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": "AA=="}}]}]},
     "contents[0].parts[0].inlineData", ["inlineData parts are not supported"]),
    ({"contents": [_user("x"), {"role": "model", "parts": [{"text": "y"}]}]}, "contents[1].role", ["prefill"]),
    ({"contents": [_user("x")], "generationConfig": {"presencePenalty": 0.5}}, "generationConfig",
     ["presencePenalty", "0.5"]),
    ({"contents": [_user("x")], "generationConfig": {"temperature": "hot"}}, "generationConfig.temperature",
     ["'hot'"]),
    ({"contents": [_user("x")], "generationConfig": {"candidateCount": 2}}, "generationConfig.candidateCount",
     ["less than or equal to 1"]),
    ({"contents": [_user("x")], "generationConfig": {"responseMimeType": "application/json"}},
     "generationConfig.responseMimeType", ["application/json"]),
    ({"contents": [_user("x")], "tools": [{"googleSearch": {}}]}, "tools.0", ["googleSearch"]),
    ({"contents": [_user("x")], "cachedContent": "cachedContents/abc"}, "body", ["cachedContent"]),
    ({"contents": [_user("x")], "generation_config": {"temperature": 0.5}, "bogus": 1}, "bogus", ["Extra inputs"]),
    ({"contents": [_user("x"), {"role": "model", "parts": [{"functionCall": {"name": "lookup", "args": {}}}]},
                   {"role": "user", "parts": [{"functionResponse": {"name": "add", "response": {"output": 1}}}]}]},
     "contents[2].parts[0].functionResponse.name", ["'add'", "answers no call"]),
    ({"contents": [_user("x"), {"role": "model", "parts": [{"functionCall": {"name": "lookup", "args": [1]}}]},
                   _user("y")]}, "contents[1].parts[0].functionCall.args", ["expected an object"]),
    ({"contents": [_user("x")], "tools": TOOLS,
      "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["nope"]}}},
     "toolConfig.functionCallingConfig.allowedFunctionNames", ["'nope'"]),
    # stopSequences not a list (the fuzzer's body, a 500 before): the field's own type check, not a crash
    ({"contents": [_user("x")], "generationConfig": {"stopSequences": True}}, "generationConfig.stopSequences",
     ["list"]),
]


def test_bad_gemini_requests_are_400s_in_googles_shape_naming_the_field(handle):
    rollout = handle.coordinator.create_rollout(tasks(2)[1])
    for body, param, words in BAD:
        response = httpx.post(f"{handle.url}{_path(rollout.rollout_id)}", json=body,
                              headers={"x-goog-api-key": rollout.token}, timeout=30)
        assert response.status_code == 400, (body, response.text)
        error = response.json()["error"]
        assert error["code"] == 400 and error["status"] == "INVALID_ARGUMENT", error
        assert error["details"][0]["fieldViolations"][0]["field"] == param, (body, error)
        assert response.headers["x-should-retry"] == "false"
        for word in words:
            assert word in error["message"], (word, error)
    bad_alt = httpx.post(f"{handle.url}{_path(rollout.rollout_id, 'streamGenerateContent')}?alt=proto",
                         json={"contents": [_user("x")]}, headers={"x-goog-api-key": rollout.token})
    assert bad_alt.status_code == 400 and "alt" in bad_alt.json()["error"]["message"]
    assert not handle.store.get_rollout(rollout.rollout_id).turns  # nothing refused was recorded


def test_google_genai_reads_refusals(handle):
    from google.genai import errors

    rollout = handle.coordinator.create_rollout(tasks(2)[1])
    base = {"base_url": f"{handle.url}/rollouts/{rollout.rollout_id}"}
    stranger = genai.Client(api_key="not-the-token", http_options=base)
    with pytest.raises(errors.ClientError, match="token does not belong") as refused:
        stranger.models.generate_content(model=MODEL, contents="x")
    assert refused.value.code == 403 and refused.value.status == "PERMISSION_DENIED"
    client = genai.Client(api_key=rollout.token, http_options=base)
    with pytest.raises(errors.ClientError, match="presencePenalty") as bad:
        client.models.generate_content(model=MODEL, contents="x",
                                       config=types.GenerateContentConfig(presence_penalty=0.5))
    assert bad.value.code == 400 and bad.value.status == "INVALID_ARGUMENT"
    answer = client.models.generate_content(model=MODEL, contents=tasks(2)[1].prompt,
                                            config=types.GenerateContentConfig(tools=TOOLS))
    assert answer.function_calls[0].name == "lookup" and answer.function_calls[0].args == {"key": "K01"}
    assert answer.candidates[0].finish_reason == types.FinishReason.STOP
    turn = handle.store.get_rollout(rollout.rollout_id).turns[0]
    assert answer.usage_metadata.prompt_token_count == len(turn.prompt_ids)
    assert answer.usage_metadata.candidates_token_count == len(turn.completion_ids)
    assert answer.function_calls[0].id == turn.tool_calls[0]["id"]


def test_the_stream_framings(handle, served, tiny_tok):
    """``alt=sse``: one ``data:`` event per chunk, the calls and the finish reason last, the text leaving as it is
    decoded; without ``alt=sse``, a JSON array of the same chunks. Either way the text is the recorded completion's."""
    rollout = handle.coordinator.create_rollout(tasks(2)[1])
    body = {"contents": [_user(tasks(2)[1].prompt)], "tools": TOOLS}
    with httpx.stream("POST", f"{handle.url}{_path(rollout.rollout_id, 'streamGenerateContent')}?alt=sse",
                      json=body, headers={"x-goog-api-key": rollout.token}) as response:
        assert response.headers["content-type"] == "text/event-stream"
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    chunks = [json.loads(line[6:]) for line in lines]
    last = chunks[-1]["candidates"][0]
    assert last["finishReason"] == "STOP" and last["content"]["parts"][-1]["functionCall"]["args"] == {"key": "K01"}
    assert all("finishReason" not in c["candidates"][0] for c in chunks[:-1])
    turn = handle.store.get_rollout(rollout.rollout_id).turns[0]
    assert chunks[-1]["usageMetadata"]["candidatesTokenCount"] == len(turn.completion_ids)

    reply = "One two three four five six seven eight nine ten. DONE"
    slow = served(ScriptedEngine(tiny_tok, lambda request, prompt: reply, token_delay_s=0.02))
    r1, r2 = (slow.coordinator.create_rollout(t) for t in tasks(2))
    arrivals = []
    with httpx.stream("POST", f"{slow.url}{_path(r1.rollout_id, 'streamGenerateContent')}?alt=sse",
                      json={"contents": [_user("Count.")]}, headers={"x-goog-api-key": r1.token}) as response:
        for line in response.iter_lines():
            if line:
                arrivals.append((time.perf_counter(), json.loads(line[6:])))
    texts = [p.get("text", "") for _, c in arrivals for p in c["candidates"][0]["content"]["parts"]]
    assert "".join(texts) == reply == slow.store.get_rollout(r1.rollout_id).turns[0].completion_text
    assert len(arrivals) > 5 and arrivals[-1][0] - arrivals[0][0] > 0.1  # token by token, as generated
    array = httpx.post(f"{slow.url}{_path(r2.rollout_id, 'streamGenerateContent')}",
                       json={"contents": [_user("Count.")]}, headers={"x-goog-api-key": r2.token})
    assert array.headers["content-type"] == "application/json"
    chunks = array.json()
    assert len(chunks) > 5 and chunks[-1]["candidates"][0]["finishReason"] == "STOP"
    assert "".join(p.get("text", "") for c in chunks for p in c["candidates"][0]["content"]["parts"]) == reply


def test_inference_mode_takes_the_key_as_header_or_query(served, tiny_tok):
    cfg = MtrlConfig.from_dict({"advanced": {"server": {"inference_mode": True, "api_key": "sk-served"}}})
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "hello DONE"), cfg)
    url = f"{handle.url}/v1beta/models/{MODEL}:generateContent"
    for kwargs in ({"headers": {"x-goog-api-key": "sk-served"}}, {"params": {"key": "sk-served"}}):
        answer = httpx.post(url, json={"contents": [_user("hi")]}, **kwargs)
        assert answer.status_code == 200, answer.text
        assert answer.json()["candidates"][0]["content"]["parts"] == [{"text": "hello DONE"}]
    refused = httpx.post(url, json={"contents": [_user("hi")]}, params={"key": "wrong"})
    assert refused.status_code == 401 and refused.json()["error"]["status"] == "UNAUTHENTICATED"
    client = genai.Client(api_key="sk-served", http_options={"base_url": handle.url})
    assert client.models.generate_content(model=MODEL, contents="hi").text == "hello DONE"
    streamed = "".join(c.text or "" for c in client.models.generate_content_stream(model=MODEL, contents="hi"))
    assert streamed == "hello DONE"


def test_both_translations_round_trip():
    """chat -> Gemini (calling) -> chat (serving) keeps the conversation; a Gemini answer -> chat -> Gemini likewise."""
    from mtrl_runtime.wires.gemini import FINISH, GeminiWire, GenerateContentRequest, chat_messages, response_parts

    messages = [
        {"role": "system", "content": "Use the tools."},
        {"role": "user", "content": "What is K01 plus 5?"},
        {"role": "assistant", "content": None, "reasoning_content": "I need K01.",
         "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "K01"}'}},
                        {"id": "call_2", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "K02"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "10", "name": "lookup"},
        {"role": "tool", "tool_call_id": "call_2", "content": "KeyError: K02", "name": "lookup", "status": "error"},
        {"role": "assistant", "content": "It is 15."},
        {"role": "user", "content": "Thanks."},
    ]
    sampling = SamplingParams(temperature=0.5, top_p=0.9, max_tokens=64, stop=("END",), seed=7)
    wire = GeminiWire()
    body = wire.request_body(MODEL, messages, [], sampling, ChatOptions())
    assert body["generationConfig"] == {"temperature": 0.5, "maxOutputTokens": 64, "topP": 0.9,
                                        "stopSequences": ["END"], "seed": 7}
    # the reasoning is not sent back (Gemini reads thought parts only with its own signature); the first call of the
    # turn carries Google's documented signature for a history it did not write
    sent = [{k: v for k, v in m.items() if k != "reasoning_content"} for m in messages]
    assert _parsed(chat_messages(GenerateContentRequest.model_validate(body))) == _parsed(sent)
    calls = [p for p in body["contents"][1]["parts"] if "functionCall" in p]
    assert [p.get("thoughtSignature") for p in calls] == ["skip_thought_signature_validator", None]
    body["contents"][1]["parts"].append({"thoughtSignature": "c2lnbmVk"})  # a part holding only a signature
    assert _parsed(chat_messages(GenerateContentRequest.model_validate(body))) == _parsed(sent)
    for ids in (True, False):  # without ids (the Gemini API, ADK), results answer the calls in order by name
        if not ids:
            for content in body["contents"]:
                for part in content["parts"]:
                    for kind in ("functionCall", "functionResponse"):
                        part.get(kind, {}).pop("id", None)
        back = chat_messages(GenerateContentRequest.model_validate(body))
        assert [m.get("status") for m in back] == [m.get("status") for m in messages]
        assert [m["content"] for m in back] == [m["content"] for m in sent]
        assert [c["id"] for c in back[2]["tool_calls"]] == (["call_1", "call_2"] if ids else ["call_1_0", "call_1_1"])
        assert [back[3]["tool_call_id"], back[4]["tool_call_id"]] == [c["id"] for c in back[2]["tool_calls"]]
    answer = messages[2]
    payload = {"candidates": [{"content": {"role": "model", "parts": response_parts(answer)},
                               "finishReason": FINISH.to_native("tool_calls")}]}
    reply = wire.parse_reply(payload)
    assert _parsed([reply.message]) == _parsed([answer]) and reply.finish_reason == "tool_calls" and reply.reasoning == "I need K01."
    cut = wire.parse_reply({"candidates": [{"content": {"parts": [{"text": "wor"}]}, "finishReason": "MAX_TOKENS"}]})
    assert cut.finish_reason == "length" and cut.message == {"role": "assistant", "content": "wor"}
    with pytest.raises(ValueError, match="SAFETY"):
        wire.parse_reply({"promptFeedback": {"blockReason": "SAFETY"}})


def _parsed(messages: list[dict]) -> list[dict]:
    """The messages with each tool call's arguments parsed (JSON text's spacing is not the conversation)."""
    return [{**m, "tool_calls": [{**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                                 for c in m["tool_calls"]]} if m.get("tool_calls") else m for m in messages]


def test_a_gemini_reference_model(tmp_path, tiny_tok, served, monkeypatch):
    """An evaluation's reference side on the Gemini wire (mtrl's own endpoint, the key as x-goog-api-key)."""
    import _eval_agents as agents
    from test_eval_reference import KEY, KEY_ENV, TASKS, Failing, Solver, config

    from mtrl_runtime.evaluation import MultiTurnRLEvaluator, ReferenceModel

    solver = Solver()
    cfg = MtrlConfig.from_dict({"core": {"model": "solver-1"},
                                "advanced": {"server": {"inference_mode": True, "api_key": KEY}}})
    reference = served(ScriptedEngine(tiny_tok, solver), cfg)
    monkeypatch.setenv(KEY_ENV, KEY)
    evaluator = MultiTurnRLEvaluator(
        agent_env=agents.make_agent(agents.answer_score), dataset=TASKS[:2], config=config(tmp_path),
        engine=ScriptedEngine(tiny_tok, Failing()), strict_scorer=agents.strict_answer, max_samples=1, tracking=False,
        reference=ReferenceModel(url=reference.url, model="solver-1", api_key_env=KEY_ENV, protocol="gemini"),
    )
    result = evaluator.evaluate()
    assert result.reference.metrics["val/strict/success_rate"] == 1.0
    assert result.base.metrics["val/strict/success_rate"] == 0.0
    for rollout_ in result.reference.rollouts:
        assert [t.model for t in rollout_.turns] == ["solver-1", "solver-1"]
        call = rollout_.turns[0].tool_calls[0]
        assert call["function"] == {"name": "lookup", "arguments": '{"key": "A1"}'} and call["id"]
    # the reference saw the tool's result: its second call rendered it
    assert sum("<tool_response>" in prompt for _, prompt in solver.calls) == 2
