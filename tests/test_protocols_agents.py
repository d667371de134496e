"""Agents on the Responses and Anthropic Messages protocols, recorded token-in-token-out like chat completions.

Real packages over real HTTP on loopback: an ``openai-agents`` Agent with
function tools (``Runner.run`` and ``Runner.run_streamed``), the ``anthropic``
SDK (``messages.create`` and ``messages.stream``), LangChain's
``ChatAnthropic`` inside LangChain v1 ``create_agent``, and Strands'
``AnthropicModel``. Each agent is written with its vendor's real endpoint and
a placeholder key; the ``rollout`` decorator redirects it. Every test runs 16
concurrent rollouts sharing one client or model object; the scripted policy
(hermes format) thinks, calls ``lookup`` then ``add`` with what each tool
returned (read back from its own prompt), and answers, so a turn landing on
the wrong rollout shows up as a key that does not match.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from _adapter_support import OFFSET, add, afinish_episode, key_of, lookup, per_turn_rewards, specs, tasks, value_of
from mtrl_adapters import record_tool_call, rollout, rollout_scope
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.testing_formats import answer_text, call_text, family_tokenizer
from mtrl_runtime.types import RolloutStatus

N = 16
# K03 (lookup raises) and K05 (the agent crashes) are the adapter suite's error cases; these tests keep to plain episodes
KEYS = [t for t in tasks(N + 2) if key_of(t.prompt) not in ("K03", "K05")][:N]


def thinking_policy(request, prompt: str) -> str:
    """Think, then lookup(key); add(value, OFFSET); think, then answer. Checks the prompt saw each result."""
    key = key_of(prompt)
    tail = prompt[-300:]
    if request.turn_index == 0:
        return f"<think>\nI need the value of {key}.\n</think>\n\n" + call_text("hermes", [("lookup", {"key": key})])
    if request.turn_index == 1:
        if str(value_of(key)) not in tail:
            return f"The lookup result is not in my prompt ({tail!r}). DONE"
        return call_text("hermes", [("add", {"a": value_of(key), "b": OFFSET})])
    total = value_of(key) + OFFSET
    if str(total) not in tail:
        return f"The add result is not in my prompt ({tail!r}). DONE"
    return answer_text("hermes", f"The answer for {key} is {total}. DONE", reasoning=f"{value_of(key)} plus {OFFSET}.")


def _serve(served):
    engine = ScriptedEngine(family_tokenizer("hermes"), thinking_policy)
    return served(engine, MtrlConfig.coerce({"advanced": {"chat_format": "hermes"}}))


def _check(handle, spec, *, reasoning_echoed: bool = True):
    """Turns token-exact (one segment, each prompt extends the last), tool calls and reasoning recorded, all its own."""
    rollout_ = handle.store.get_rollout(spec.rollout_id)
    key = key_of(spec.task.prompt)
    assert rollout_.status is RolloutStatus.COMPLETED, (key, rollout_.status, rollout_.error)
    turns = rollout_.turns
    assert [[c["function"]["name"] for c in t.tool_calls] for t in turns] == [["lookup"], ["add"], []], key
    assert json.loads(turns[0].tool_calls[0]["function"]["arguments"]) == {"key": key}
    assert json.loads(turns[1].tool_calls[0]["function"]["arguments"]) == {"a": value_of(key), "b": OFFSET}
    for turn in turns:
        user = [m for m in turn.messages if m["role"] == "user"]
        assert key in str(user[0]["content"]), (key, turn.index)
    for before, after in zip(turns, turns[1:]):  # sequence extension: the next prompt starts with this turn's ids
        assert after.segment == 0 and after.break_reason is None, (key, after.index, after.break_reason)
        assert after.prompt_ids[: len(before.prompt_ids) + len(before.completion_ids)] == before.prompt_ids + before.completion_ids
    assert "<think>" in turns[0].completion_text and "<think>" in turns[2].completion_text
    assert f"is {value_of(key) + OFFSET}. DONE" in turns[2].completion_text
    if reasoning_echoed:  # the client sent the reasoning back; it reached the recorded messages as reasoning_content
        assistant = [m for m in turns[1].messages if m["role"] == "assistant"]
        assert assistant and f"value of {key}" in assistant[0].get("reasoning_content", ""), assistant
    calls = {c.name: c for c in rollout_.tool_calls}
    assert set(calls) == {"lookup", "add"}, (key, rollout_.tool_calls)
    assert str(calls["lookup"].result) == str(value_of(key)) and calls["lookup"].turn_index == 0
    assert str(calls["add"].result) == str(value_of(key) + OFFSET) and calls["add"].turn_index == 1
    assert rollout_.turn_rewards == tuple(per_turn_rewards(3))


def _keep(sent: list):
    async def hook(request: httpx.Request) -> None:
        sent.append(request)

    return hook


def _check_sent(sent: list, handle, path: str) -> None:
    """Every model call went to its rollout's path on mtrl, with the rollout's token; the user's key never left."""
    assert len(sent) == 3 * N
    for request in sent:
        assert str(request.url).startswith(f"{handle.url}/rollouts/") and request.url.path.endswith(path), request.url
        rollout_id = request.url.path.split("/")[2]
        assert request.headers["x-mtrl-rollout-id"] == rollout_id
        assert not any("real-key" in value for value in request.headers.values()), dict(request.headers)


async def _run_all(handle, agent):
    runs = specs(handle, KEYS)

    async def one(spec):
        with rollout_scope(spec):
            return await agent(spec.task)

    answers = await asyncio.gather(*(one(s) for s in runs))
    return runs, answers


@pytest.mark.parametrize("client_kind", ["default", "explicit"])
async def test_openai_agents_sdk_run_and_run_streamed(served, monkeypatch, client_kind):
    """One Agent over one shared client, 16 rollouts: half ``Runner.run``, half ``Runner.run_streamed``.

    ``default``: the Agent as the SDK's docs write it (no model named, ``OPENAI_API_KEY`` in the
    environment: the default provider's ``AsyncOpenAI`` and the Responses API). ``explicit``: an
    ``OpenAIResponsesModel`` over the user's own ``AsyncOpenAI``, whose requests the test sees.
    """
    pytest.importorskip("agents")
    import openai
    from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool

    from mtrl_adapters.openai_agents import MtrlRunHooks

    handle = _serve(served)
    sent: list = []
    http = httpx.AsyncClient(event_hooks={"request": [_keep(sent)]})
    extra = {}
    if client_kind == "explicit":
        client = openai.AsyncOpenAI(api_key="sk-user-real-key", base_url="https://api.openai.com/v1", max_retries=0,
                                    http_client=http)
        extra["model"] = OpenAIResponsesModel(model="gpt-4o-mini", openai_client=client)
    else:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-user-real-key")
    agent = Agent(
        name="lookup-agent",
        instructions="Answer with the value of the key plus five. Use the tools.",
        tools=[function_tool(lookup), function_tool(add)],
        **extra,
    )
    config = RunConfig(tracing_disabled=True)  # one provider, so one default client, for every run
    streamed_events: list[str] = []

    @rollout
    async def run(task):
        if int(key_of(task.prompt)[1:]) % 2:
            result = Runner.run_streamed(agent, task.prompt, hooks=MtrlRunHooks(), run_config=config)
            async for event in result.stream_events():
                streamed_events.append(event.type)
        else:
            result = await Runner.run(agent, task.prompt, hooks=MtrlRunHooks(), run_config=config)
        await afinish_episode(task, 3)
        return result.final_output

    runs, answers = await _run_all(handle, run)
    for spec, answer in zip(runs, answers):
        key = key_of(spec.task.prompt)
        assert answer == f"The answer for {key} is {value_of(key) + OFFSET}. DONE"
        _check(handle, spec)
    assert "raw_response_event" in streamed_events and "run_item_stream_event" in streamed_events
    if client_kind == "explicit":
        _check_sent(sent, handle, "/v1/responses")
    await http.aclose()


async def test_anthropic_sdk_create_and_stream(served):
    """One AsyncAnthropic client, 16 rollouts, each with its own tool loop: ``messages.create`` or ``messages.stream``."""
    anthropic = pytest.importorskip("anthropic")
    handle = _serve(served)
    sent: list = []
    http = httpx.AsyncClient(event_hooks={"request": [_keep(sent)]})
    client = anthropic.AsyncAnthropic(api_key="sk-ant-user-real-key", max_retries=0, http_client=http)
    tools = [
        {"name": "lookup", "description": "Look a key up in the table.",
         "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}},
        {"name": "add", "description": "Add two integers.",
         "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}},
    ]
    thinking_seen: list[str] = []

    @rollout
    async def run(task):
        streamed = int(key_of(task.prompt)[1:]) % 2 == 1
        messages = [{"role": "user", "content": task.prompt}]
        for turn in range(8):
            kwargs = dict(model="claude-sonnet-4-5", max_tokens=256, system="Use the tools.", messages=messages, tools=tools)
            if streamed:
                async with client.messages.stream(**kwargs) as stream:
                    reply = await stream.get_final_message()
            else:
                reply = await client.messages.create(**kwargs)
            thinking_seen.extend(b.thinking for b in reply.content if b.type == "thinking")
            messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]})
            if reply.stop_reason != "tool_use":
                await afinish_episode(task, turn + 1)
                return "".join(b.text for b in reply.content if b.type == "text")
            results = []
            for block in reply.content:
                if block.type == "tool_use":
                    value = {"lookup": lookup, "add": add}[block.name](**block.input)
                    record_tool_call(block.name, block.input, result=str(value), call_id=block.id)
                    results.append({"type": "tool_result", "tool_use_id": block.id, "content": str(value)})
            messages.append({"role": "user", "content": results})
        raise AssertionError("no answer in 8 turns")

    runs, answers = await _run_all(handle, run)
    for spec, answer in zip(runs, answers):
        key = key_of(spec.task.prompt)
        assert answer == f"The answer for {key} is {value_of(key) + OFFSET}. DONE"
        _check(handle, spec)
    assert len(thinking_seen) == 2 * N  # turn 0's and turn 2's reasoning came back as thinking blocks
    _check_sent(sent, handle, "/v1/messages")
    await http.aclose()


async def test_langchain_chat_anthropic_in_create_agent(served):
    """LangChain v1 ``create_agent`` over one shared ``ChatAnthropic``; LangChain's tool calls recorded by the adapter."""
    pytest.importorskip("langchain_anthropic")
    from langchain.agents import create_agent
    from langchain_anthropic import ChatAnthropic
    from langchain_core.tools import tool

    import mtrl_adapters.langgraph  # noqa: F401  (the LangChain tool-call callbacks)

    handle = _serve(served)
    llm = ChatAnthropic(model="claude-sonnet-4-5", api_key="sk-ant-user-real-key", max_retries=0, max_tokens=256)
    graph = create_agent(llm, tools=[tool(lookup), tool(add)], system_prompt="Use the tools.")

    @rollout
    async def run(task):
        state = await graph.ainvoke({"messages": [{"role": "user", "content": task.prompt}]})
        await afinish_episode(task, sum(1 for m in state["messages"] if m.type == "ai"))
        return state["messages"][-1].text

    runs, answers = await _run_all(handle, run)
    for spec, answer in zip(runs, answers):
        key = key_of(spec.task.prompt)
        assert answer == f"The answer for {key} is {value_of(key) + OFFSET}. DONE"
        _check(handle, spec)


async def test_strands_anthropic_model(served):
    """Strands ``AnthropicModel`` (one shared model object), an Agent per rollout with mtrl's hooks."""
    pytest.importorskip("strands")
    pytest.importorskip("anthropic")
    from strands import Agent, tool
    from strands.models.anthropic import AnthropicModel

    from mtrl_adapters.strands import agent_factory

    handle = _serve(served)
    model = AnthropicModel(client_args={"api_key": "sk-ant-user-real-key", "max_retries": 0},
                           model_id="claude-sonnet-4-5", max_tokens=256)
    make_agent = agent_factory(lambda: Agent(model=model, tools=[tool(lookup), tool(add)], callback_handler=None))

    @rollout
    async def run(task):
        agent = make_agent()
        result = await agent.invoke_async(task.prompt)
        await afinish_episode(task, sum(1 for m in agent.messages if m["role"] == "assistant"))
        return str(result).strip()

    runs, answers = await _run_all(handle, run)
    for spec, answer in zip(runs, answers):
        key = key_of(spec.task.prompt)
        assert answer == f"The answer for {key} is {value_of(key) + OFFSET}. DONE"
        _check(handle, spec)


def test_anthropic_clients_outside_a_rollout_are_untouched(served):
    """The same client object: outside a rollout its calls go where the user sent them, with the user's key."""
    anthropic = pytest.importorskip("anthropic")
    from mtrl_adapters import instrument

    instrument()
    seen: list[httpx.Request] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                                         "content": [{"type": "text", "text": "upstream"}], "stop_reason": "end_turn",
                                         "stop_sequence": None, "usage": {"input_tokens": 1, "output_tokens": 1}})

    client = anthropic.Anthropic(api_key="sk-ant-user-real-key", http_client=httpx.Client(transport=httpx.MockTransport(upstream)))
    ask = dict(model="claude-sonnet-4-5", max_tokens=16, messages=[{"role": "user", "content": KEYS[0].prompt}])
    assert client.messages.create(**ask).content[0].text == "upstream"
    assert seen[0].url.host == "api.anthropic.com" and seen[0].headers["x-api-key"] == "sk-ant-user-real-key"
    assert "x-mtrl-rollout-id" not in seen[0].headers
    handle = _serve(served)
    [spec] = specs(handle, KEYS[:1])
    redirected = anthropic.Anthropic(api_key="sk-ant-user-real-key", max_retries=0)
    with rollout_scope(spec):
        reply = redirected.messages.create(**ask, tools=[{"name": "lookup", "input_schema": {"type": "object"}}])
    assert reply.content[-1].type == "tool_use" and reply.content[-1].input == {"key": key_of(KEYS[0].prompt)}
    assert len(seen) == 1 and len(handle.store.get_rollout(spec.rollout_id).turns) == 1
