"""Real Strands and LangGraph agents, and a plain OpenAI-SDK loop, completing tool-using rollouts in every chat format.

The scripted engine writes what a model of each family writes (its call
syntax, its reasoning); the served endpoint parses it with the family's
format. Each rollout calls ``lookup`` then ``add`` and answers; the checks
of ``_adapter_support.check_attribution`` apply unchanged.
"""

from __future__ import annotations

import asyncio
import warnings

import httpx
import pytest

from _adapter_support import OFFSET, TOOLS, add, afinish_episode, check_attribution, key_of, lookup, specs, tasks, value_of
from mtrl_adapters import rollout, rollout_scope
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.testing_formats import FAMILY_TOKENS, answer_text, call_text, family_tokenizer

FORMATS = sorted(FAMILY_TOKENS)


def format_policy(name: str):
    """lookup(key) → add(value, OFFSET) → the answer, each written in format ``name``; checks the prompt saw each result."""

    def policy(request, prompt: str) -> str:
        key = key_of(prompt)
        tail = prompt[-300:]
        if request.turn_index == 0:
            return call_text(name, [("lookup", {"key": key})])
        if request.turn_index == 1:
            if str(value_of(key)) not in tail:
                return f"The lookup result is not in my prompt ({tail!r}). DONE"
            return call_text(name, [("add", {"a": value_of(key), "b": OFFSET})], content="")
        total = value_of(key) + OFFSET
        if str(total) not in tail:
            return f"The add result is not in my prompt ({tail!r}). DONE"
        return answer_text(name, f"The answer for {key} is {total}. DONE", reasoning=f"{value_of(key)} plus {OFFSET}.")

    return policy


def _serve(served, name):
    tok = family_tokenizer(name)
    return served(ScriptedEngine(tok, format_policy(name)), MtrlConfig.coerce({"advanced": {"chat_format": name}}))


def _check(handle, runs, name):
    for spec in runs:
        recorded = check_attribution(handle.store, spec, crash_ok=False)
        assert [len(t.tool_calls) for t in recorded.turns] == [1, 1, 0]
        assert not any(t.malformed_tool_call for t in recorded.turns)
    assert handle.coordinator.counters[f"malformed_tool_calls/{name}"] == 0


@pytest.mark.parametrize("name", FORMATS)
async def test_strands_agent_in_each_format(served, name):
    pytest.importorskip("strands")
    from strands import Agent, tool
    from strands.models.openai import OpenAIModel

    from mtrl_adapters.strands import agent_factory

    handle = _serve(served, name)
    model = OpenAIModel(client_args={"api_key": "sk-user", "base_url": "https://api.openai.com/v1"}, model_id="gpt-4o-mini")
    make_agent = agent_factory(lambda: Agent(model=model, tools=[tool(lookup), tool(add)], callback_handler=None))

    @rollout
    async def run(task):
        agent = make_agent()
        result = await agent.invoke_async(task.prompt)
        await afinish_episode(task, sum(1 for m in agent.messages if m["role"] == "assistant"))
        return str(result)

    async def one(spec):
        with rollout_scope(spec):
            return await run(spec.task)

    runs = specs(handle, tasks(3)[1:])
    answers = await asyncio.gather(*(one(s) for s in runs))
    assert all("DONE" in a for a in answers), answers
    _check(handle, runs, name)


async def test_langgraph_agent_in_each_format(served):
    """A real LangGraph agent completes tool-using rollouts in every format."""
    pytest.importorskip("langgraph")
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import ToolNode

    import mtrl_adapters.langgraph  # noqa: F401  (as the LangGraph adapter tests import it)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from langgraph.prebuilt import create_react_agent

        # an HTTP client of this event loop: langchain-openai otherwise reuses one cached per process,
        # bound to whichever (by now closed) loop an earlier test created it on
        http = httpx.AsyncClient()
        llm = ChatOpenAI(model="gpt-4o-mini", api_key="sk-user", base_url="https://api.openai.com/v1", max_retries=0,
                         http_async_client=http)
        graph = create_react_agent(llm, ToolNode([tool(lookup), tool(add)], handle_tool_errors=True))

    @rollout
    async def run(task):
        state = await graph.ainvoke({"messages": [("user", task.prompt)]})
        await afinish_episode(task, sum(1 for m in state["messages"] if m.type == "ai"))
        return state["messages"][-1].content

    async def one(spec):
        with rollout_scope(spec):
            return await run(spec.task)

    try:
        for name in FORMATS:
            handle = _serve(served, name)
            runs = specs(handle, tasks(3)[1:])
            answers = await asyncio.gather(*(one(s) for s in runs))
            assert all("DONE" in a for a in answers), (name, answers)
            _check(handle, runs, name)
    finally:
        await http.aclose()


@pytest.mark.parametrize("name", FORMATS)
def test_openai_sdk_loop_gets_reasoning_content_and_tool_calls(served, name):
    """A plain OpenAI client: tool calls parsed, reasoning returned in ``reasoning_content`` and echoed back."""
    import openai

    handle = _serve(served, name)
    [spec] = specs(handle, tasks(2)[1:])
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{spec.rollout_id}/v1", api_key=spec.token, max_retries=0)
    messages = [{"role": "user", "content": spec.task.prompt}]
    replies = []
    for _ in range(3):
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        replies.append(message)
        messages.append(message.model_dump(exclude_none=True))  # reasoning_content included, as clients echo it
        for call in message.tool_calls or ():
            args = __import__("json").loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                             "content": str({"lookup": lookup, "add": add}[call.function.name](**args))})
    assert [m.tool_calls[0].function.name for m in replies[:2]] == ["lookup", "add"]
    last = replies[-1]
    assert last.content == f"The answer for K01 is {value_of('K01') + OFFSET}. DONE" and not last.tool_calls
    reasoning = (last.model_extra or {}).get("reasoning_content")
    assert reasoning == (None if name == "llama3_json" else f"10 plus {OFFSET}.")
    counters = handle.coordinator.counters
    expected_tokens = 0 if name == "llama3_json" else len(handle.coordinator.renderer.encode(reasoning))
    assert counters["reasoning_tokens"] == expected_tokens > 0 or name == "llama3_json"
    assert counters["reasoning_replies"] == (0 if name == "llama3_json" else 1)
    # stored per turn as its own field, and counted in the training and evaluation metrics
    from mtrl_runtime.evaluation import eval_metrics, record_of
    from mtrl_runtime.training import rollout_metrics

    recorded = handle.store.get_rollout(spec.rollout_id)
    assert [t.reasoning for t in recorded.turns] == [None, None, reasoning]
    assert [t.reasoning_tokens for t in recorded.turns] == [0, 0, expected_tokens]
    generated = sum(len(t.completion_ids) for t in recorded.turns)
    train = rollout_metrics([recorded])
    assert train["rollout/tokens/reasoning_mean"] == expected_tokens
    assert train["rollout/tokens/reasoning_frac"] == pytest.approx(expected_tokens / generated)
    val = eval_metrics([record_of(recorded, 0.5)], ks=[1])
    assert val["val/tokens/reasoning_mean"] == expected_tokens
    assert val["val/tokens/reasoning_frac"] == pytest.approx(expected_tokens / generated)


def test_streamed_reply_carries_reasoning_content_before_the_content(served):
    import openai

    handle = _serve(served, "hermes")
    [spec] = specs(handle, tasks(2)[1:])
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{spec.rollout_id}/v1", api_key=spec.token, max_retries=0)
    messages = [{"role": "user", "content": spec.task.prompt}]
    for _ in range(2):  # lookup, add (non-streamed)
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        call = message.tool_calls[0]
        args = __import__("json").loads(call.function.arguments)
        messages.append({"role": "tool", "tool_call_id": call.id,
                         "content": str({"lookup": lookup, "add": add}[call.function.name](**args))})
    deltas = [c.choices[0].delta for c in client.chat.completions.create(
        model="policy", messages=messages, tools=TOOLS, stream=True) if c.choices]
    fields = [(d.model_extra or {}).get("reasoning_content") or d.content for d in deltas if
              (d.model_extra or {}).get("reasoning_content") or d.content]
    assert fields == [f"10 plus {OFFSET}.", f"The answer for K01 is {10 + OFFSET}. DONE"]
    [turn] = handle.store.get_rollout(spec.rollout_id).turns[2:]
    assert "<think>" in turn.completion_text  # the turn keeps what the model generated, reasoning included


@pytest.mark.parametrize("name", FORMATS)
def test_tool_choice_required_and_named_force_the_format_call_opener(served, name):
    """The scripted model only calls a tool when the prompt already opens the call: tool_choice must put it there."""
    import httpx

    from mtrl_runtime.chat.formats import CHAT_FORMATS

    fmt = CHAT_FORMATS.get(name)
    full = call_text(name, [("add", {"a": 1, "b": 2})]).removeprefix("<|python_tag|>")  # Llama writes either
    full = full[full.index(fmt.forced_prefix(None)):]  # Qwen3.5 closes its (empty) reasoning first: forced, that is prompt

    def policy(request, prompt):
        for tool_name in ("add", None):
            prefix = fmt.forced_prefix(tool_name)
            if prompt.endswith(prefix):
                return full[len(prefix):]
        return answer_text(name, "I would rather not call anything.")  # Qwen3.5 closes the prompt's <think> first

    handle = served(ScriptedEngine(family_tokenizer(name), policy), MtrlConfig.coerce({"advanced": {"chat_format": name}}))
    [spec] = specs(handle, tasks(2)[1:])
    url = f"{handle.url}/rollouts/{spec.rollout_id}/v1/chat/completions"
    auth = {"Authorization": f"Bearer {spec.token}"}
    base = {"model": "policy", "messages": [{"role": "user", "content": spec.task.prompt}], "tools": TOOLS}

    def ask(**extra):
        return httpx.post(url, json={**base, **extra}, headers=auth, timeout=30)

    assert ask().json()["choices"][0]["message"]["content"] == "I would rather not call anything."  # auto
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        reply = ask(tool_choice=choice).json()["choices"][0]
        assert reply["finish_reason"] == "tool_calls", reply
        [call] = reply["message"]["tool_calls"]
        assert call["function"]["name"] == "add" and __import__("json").loads(call["function"]["arguments"]) == {"a": 1, "b": 2}
    none = ask(tool_choice="none").json()["choices"][0]["message"]
    assert "tool_calls" not in none
    bad = ask(tool_choice={"type": "function", "function": {"name": "delete_everything"}})
    assert bad.status_code == 400 and "delete_everything" in bad.text and "tool_choice" in bad.text
    turns = handle.store.get_rollout(spec.rollout_id).turns
    forced = [t for t in turns if t.tool_calls]
    assert len(forced) == 2
    prefix_ids = handle.coordinator.renderer.encode(fmt.forced_prefix("add"))
    assert tuple(forced[1].prompt_ids[-len(prefix_ids):]) == tuple(prefix_ids)  # the opener is prompt, not trained


@pytest.mark.parametrize("name", FORMATS)
def test_six_turn_rollout_extends_one_sequence_or_breaks_where_the_template_rewrites_history(served, name):
    import openai

    def policy(request, prompt):
        if request.turn_index < 5:
            return call_text(name, [("lookup", {"key": f"K1{request.turn_index}"})])
        return answer_text(name, "All looked up. DONE", reasoning="enough")

    handle = served(ScriptedEngine(family_tokenizer(name), policy), MtrlConfig.coerce(
        {"advanced": {"chat_format": name, "history_training": "deployed"}}))
    [spec] = specs(handle, tasks(2)[1:])
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{spec.rollout_id}/v1", api_key=spec.token, max_retries=0)
    messages = [{"role": "user", "content": spec.task.prompt}]
    for _ in range(6):
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "name": "lookup",
                             "content": str(lookup(**__import__("json").loads(call.function.arguments)))})
    assert not message.tool_calls and message.content == "All looked up. DONE"
    turns = handle.store.get_rollout(spec.rollout_id).turns
    assert len(turns) == 6
    for prev, turn in zip(turns, turns[1:]):
        context = prev.prompt_ids + prev.completion_ids
        if turn.break_reason is None:  # extended: the engine's own ids, then only the new messages
            assert turn.prompt_ids[: len(context)] == context and turn.segment == prev.segment
        else:
            assert turn.segment == prev.segment + 1
    reasons = [None if t.break_reason is None else t.break_reason.value for t in turns]
    if name == "gemma4":
        # Gemma 4's generation prompt holds an empty thought block ("<|channel>thought\n<channel|>") that history never
        # renders: the second turn starts a segment; after it the calls and results are one model turn, extended
        assert reasons == [None, "reply_rendered_differently", None, None, None, None]
    elif name in ("harmony", "llama3_json", "mistral"):
        # Llama writes <|python_tag|> before a call and its JSON tool template renders the call without it; Mistral's
        # template adds the call ids the model never wrote; gpt-oss writes a call's channel before its recipient and
        # deployment (openai-harmony, as vLLM hands it the history) renders the recipient first. Trained as deployed,
        # each turn after a call starts where deployment renders the history differently
        assert reasons == [None] + ["reply_rendered_differently"] * 5
        assert handle.coordinator.counters["prefix_break/template_not_prefix"] == 0
    else:
        assert reasons == [None] * 6 and {t.segment for t in turns} == {0}


@pytest.mark.parametrize("history", ["deployed", "extend"])
def test_history_training_setting_breaks_where_the_template_drops_reasoning_or_keeps_one_sequence(served, history):
    """Qwen3-style thinking the client does not echo: 'deployed' trains each turn as deployment renders it."""
    import openai

    def policy(request, prompt):
        if request.turn_index < 3:
            return answer_text("hermes", "", f"think {request.turn_index}") + call_text("hermes", [("lookup", {"key": "K11"})])
        return answer_text("hermes", "Done. DONE", "last thought")

    config = MtrlConfig.coerce({"advanced": {"chat_format": "hermes", "history_training": history}})
    handle = served(ScriptedEngine(family_tokenizer("hermes"), policy), config)
    [spec] = specs(handle, tasks(2)[1:])
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{spec.rollout_id}/v1", api_key=spec.token, max_retries=0)
    messages = [{"role": "user", "content": spec.task.prompt}]
    for _ in range(4):
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        messages.append({"role": "assistant", "content": message.content,  # as Strands / LangGraph echo it
                         "tool_calls": [c.model_dump() for c in message.tool_calls or ()] or None})
        for call in message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "110"})
    turns = handle.store.get_rollout(spec.rollout_id).turns
    reasons = [None if t.break_reason is None else t.break_reason.value for t in turns]
    if history == "extend":
        assert reasons == [None] * 4 and {t.segment for t in turns} == {0}
        assert all("<think>" in handle.coordinator.renderer.decode(t.prompt_ids) for t in turns[1:])
    else:
        assert reasons == [None] + ["reply_rendered_differently"] * 3 and [t.segment for t in turns] == [0, 1, 2, 3]
        # each turn's prompt is what deployment renders: no earlier thinking in it
        assert all("think " not in handle.coordinator.renderer.decode(t.prompt_ids) for t in turns)


def test_history_training_unknown_value_is_a_config_error():
    with pytest.raises(ValueError, match="history_training"):
        MtrlConfig.coerce({"advanced": {"history_training": "sometimes"}})
