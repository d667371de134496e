"""What harness CLIs send, served as they need it: each case from a request a harness really sent.

Claude Code and opencode ask for ``max_tokens`` 32,000 (served up to the run's cap, flagged); Codex CLI declares a
``namespace`` tool (its sub-agents) and the hosted ``web_search`` on every Responses call (the namespace's functions
offered as ``<namespace>.<name>`` and read back with ``namespace``; the hosted tool accepted, not offered, flagged);
Claude Code and the Anthropic SDK append ``/v1/messages`` to their base URL (a rollout's ``base_urls`` gives each SDK
family the URL it takes as is); opencode's title call names its small model (answered as a non-policy model call,
never a turn); a harness's tools, which no adapter sees, stored from the conversation on the wire.
Real HTTP on loopback, real SDK clients, the scripted engine.
"""

from __future__ import annotations

import asyncio
import json

import anthropic
import httpx
import openai
import pytest

from _adapter_support import tasks
from _run_stop import stop_while_in_flight
from mtrl_adapters.wire import CompletionReport
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.engines.scripted import ScriptedReply
from mtrl_runtime.errors import Conflict
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.types import ChatOptions, RolloutStatus, SamplingParams

CAP = 16
CONFIG = {"core": {"sampling_params": {"max_tokens": CAP}, "val_sampling_params": {"max_tokens": CAP}}}
CODEX_TOOLS = [  # as Codex CLI 0.171 sends them (descriptions shortened)
    {"type": "function", "name": "exec_command", "description": "Runs a command.", "strict": False,
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}},
    {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents.", "tools": [
        {"type": "function", "name": "spawn_agent", "description": "Spawn one.", "strict": False,
         "parameters": {"type": "object", "properties": {"task": {"type": "string"}}}}]},
    {"type": "web_search", "external_web_access": True},
]


def _serve(served, tiny_tok, script, config=None):
    return served(ScriptedEngine(tiny_tok, script), MtrlConfig.from_dict(config or {}))


def _create(handle, i=1):
    response = httpx.post(f"{handle.url}/v1/rollouts", json={"task_id": f"t{i}", "prompt": tasks(i + 1)[i].prompt},
                          timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _complete(handle, created, **fields):
    response = httpx.post(f"{handle.url}/rollouts/{created['rollout_id']}/complete",
                          json=CompletionReport(**fields).model_dump(),
                          headers={"authorization": f"Bearer {created['token']}"}, timeout=30)
    assert response.status_code == 200, response.text
    return handle.store.get_rollout(created["rollout_id"])


def test_each_sdk_family_takes_its_base_url_as_is(served, tiny_tok):
    handle = _serve(served, tiny_tok, ["Hello there.", "Hi."])
    created = _create(handle)
    urls = created["base_urls"]
    assert urls["openai"] == created["base_url"] and urls["openai"].endswith("/v1")
    assert urls["anthropic"] == urls["bedrock"] == urls["gemini"] == created["base_url"][: -len("/v1")]
    reply = anthropic.Anthropic(base_url=urls["anthropic"], api_key=created["token"], max_retries=0).messages.create(
        model="policy", max_tokens=8, messages=[{"role": "user", "content": tasks(2)[1].prompt}])
    assert reply.content[0].text  # reached /rollouts/<id>/v1/messages, not /v1/v1/messages
    chat = openai.OpenAI(base_url=urls["openai"], api_key=created["token"], max_retries=0).chat.completions.create(
        model="policy", messages=[{"role": "user", "content": tasks(2)[1].prompt}, {"role": "assistant",
                                  "content": reply.content[0].text}, {"role": "user", "content": "again"}])
    assert chat.choices[0].message.content
    assert len(handle.store.get_rollout(created["rollout_id"]).turns) == 2


def test_max_tokens_above_the_cap_is_served_up_to_it_and_flagged(served, tiny_tok):
    long = "word " * 100
    handle = _serve(served, tiny_tok, [long, long, long], CONFIG)
    created = _create(handle)
    client = anthropic.Anthropic(base_url=created["base_urls"]["anthropic"], api_key=created["token"], max_retries=0)
    reply = client.messages.create(model="policy", max_tokens=32000, timeout=60,
                                   messages=[{"role": "user", "content": tasks(2)[1].prompt}])
    assert reply.stop_reason == "max_tokens" and reply.usage.output_tokens == CAP
    chat = openai.OpenAI(base_url=created["base_url"], api_key=created["token"], max_retries=0)
    answer = chat.chat.completions.create(model="policy", max_tokens=32000, messages=[
        {"role": "user", "content": tasks(2)[1].prompt}, {"role": "assistant", "content": reply.content[0].text},
        {"role": "user", "content": "more"}])
    assert answer.choices[0].finish_reason == "length" and answer.usage.completion_tokens == CAP
    rollout = _complete(handle, created)
    assert rollout.metrics["max_tokens_clamped"] == 2.0
    assert handle.coordinator.counters.max_tokens_clamped == 2


def test_a_namespace_tool_is_offered_and_called_by_its_namespace_and_hosted_tools_are_flagged(served, tiny_tok):
    handle = _serve(served, tiny_tok, [ScriptedReply.tool_call("multi_agent_v1.spawn_agent", {"task": "look"}),
                                       "All done."])
    created = _create(handle)
    client = openai.OpenAI(base_url=created["base_url"], api_key=created["token"], max_retries=0)
    prompt = [{"type": "message", "role": "user", "content": tasks(2)[1].prompt}]
    first = client.responses.create(model="policy", input=prompt, tools=CODEX_TOOLS)
    call = next(item for item in first.output if item.type == "function_call")
    assert (call.namespace, call.name, json.loads(call.arguments)) == ("multi_agent_v1", "spawn_agent", {"task": "look"})
    turn = handle.store.get_rollout(created["rollout_id"]).turns[0]
    offered = [t["function"]["name"] for t in turn.tools]
    assert offered == ["exec_command", "multi_agent_v1.spawn_agent"]  # web_search is not offered
    history = [*prompt, {"type": "function_call", "call_id": call.call_id, "namespace": "multi_agent_v1",
                         "name": "spawn_agent", "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "agent 7 started"}]
    second = client.responses.create(model="policy", input=history, tools=CODEX_TOOLS)
    assert second.output_text == "All done."
    turns = handle.store.get_rollout(created["rollout_id"]).turns
    assert turns[1].break_reason is None  # the namespaced call read back extends the first turn token for token
    assert turns[1].prompt_ids[: len(turns[0].prompt_ids) + len(turns[0].completion_ids)] == (
        turns[0].prompt_ids + turns[0].completion_ids)
    rollout = _complete(handle, created, tool_calls_from_wire=True)
    assert rollout.metrics["hosted_tools_unserved"] == 2.0
    assert [(c.name, c.arguments, c.result, c.turn_index) for c in rollout.tool_calls] == [
        ("multi_agent_v1.spawn_agent", {"task": "look"}, "agent 7 started", 0)]


def test_a_background_model_call_is_recorded_as_non_policy_and_never_a_turn(served, tiny_tok):
    def script(request, prompt):
        if "title generator" in prompt:
            assert request.rollout_id is None  # answered as no rollout's turn
            return "A short title"
        return [ScriptedReply.tool_call("lookup", {"key": "k"}), "Done."][request.turn_index]

    handle = _serve(served, tiny_tok, script)
    created = _create(handle)
    client = openai.OpenAI(base_url=created["base_url"], api_key=created["token"], max_retries=0)
    title = client.chat.completions.create(model="mtrl-background", messages=[
        {"role": "system", "content": "You are a title generator."}, {"role": "user", "content": tasks(2)[1].prompt}])
    assert title.choices[0].message.content
    episode = [{"role": "system", "content": "You are a coding agent."},
               {"role": "user", "content": tasks(2)[1].prompt}]
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    first = client.chat.completions.create(model="policy", messages=episode, tools=tools)
    call = first.choices[0].message.tool_calls[0]
    episode += [first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "value 42"}]
    second = client.chat.completions.create(model="policy", messages=episode, tools=tools)
    assert second.choices[0].message.content == "Done."
    rollout = _complete(handle, created, tool_calls_from_wire=True)
    assert len(rollout.turns) == 2 and all(t.break_reason is None for t in rollout.turns[1:])
    assert [(m.model, m.protocol) for m in rollout.model_calls] == [("mtrl-background", "openai")]
    assert rollout.model_calls[0].input_tokens > 0 and rollout.model_calls[0].output_tokens > 0
    assert [(c.name, c.arguments, c.result) for c in rollout.tool_calls] == [("lookup", {"key": "k"}, "value 42")]
    assert "tool_calls_unrecorded" not in rollout.metrics
    assert handle.coordinator.counters.background_calls == 1


def test_the_runs_stop_cancels_a_background_call_in_flight(tmp_path, tiny_tok):
    """A harness's background call holds no lock of its rollout, so the rollout's end never waited for it; its
    generation ran on after the run stopped. The stop now cancels it as it cancels the rollout's own call."""
    generating: list[str] = []

    def script(request, prompt):
        generating.append(prompt)
        return ScriptedReply.plain("A short title", delay_s=20.0)  # a slow engine: the stop arrives meanwhile

    store = SQLiteStore(tmp_path / "store.db")
    coordinator = Coordinator(ScriptedEngine(tiny_tok, script), store, MtrlConfig.from_dict(CONFIG))

    async def stop_while_the_title_generates() -> tuple[float, BaseException | None, str]:
        handle = coordinator.create_rollout(tasks(2)[1])
        call = coordinator.chat(handle.rollout_id, handle.token, [{"role": "user", "content": "a title, please"}],
                                None, SamplingParams(max_tokens=8), ChatOptions(model="mtrl-background"))
        took, refused = await stop_while_in_flight(coordinator, handle.rollout_id, call, lambda: bool(generating))
        return took, refused, handle.rollout_id

    try:
        took, refused, rollout_id = asyncio.run(stop_while_the_title_generates())
        stored = store.get_rollout(rollout_id)
    finally:
        store.close()
    assert took < 5.0, f"the background call generated on for {took:.1f} s after the run stopped"
    assert isinstance(refused, Conflict) and "the run stopped" in str(refused), repr(refused)
    assert stored.status is RolloutStatus.INTERRUPTED and stored.turns == () and stored.model_calls == ()
    assert coordinator.counters.background_calls == 0


def test_without_the_wire_mark_a_harness_rollout_still_says_its_tools_went_unrecorded(served, tiny_tok):
    handle = _serve(served, tiny_tok, [ScriptedReply.tool_call("lookup", {"key": "k"}), "Done."])
    created = _create(handle)
    client = openai.OpenAI(base_url=created["base_url"], api_key=created["token"], max_retries=0)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    episode = [{"role": "user", "content": tasks(2)[1].prompt}]
    first = client.chat.completions.create(model="policy", messages=episode, tools=tools)
    call = first.choices[0].message.tool_calls[0]
    episode += [first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": call.id, "content": "value 42"}]
    client.chat.completions.create(model="policy", messages=episode, tools=tools)
    rollout = _complete(handle, created)
    assert rollout.tool_calls == () and rollout.metrics["tool_calls_unrecorded"] == 1.0


@pytest.mark.parametrize("value", ["sometimes", 3])
def test_bad_max_tokens_over_cap_and_background_models_fail_at_load_naming_the_field(value):
    with pytest.raises(ValueError, match="max_tokens_over_cap"):
        MtrlConfig.from_dict({"advanced": {"server": {"max_tokens_over_cap": value}}})
    with pytest.raises(ValueError, match="background_models"):
        MtrlConfig.from_dict({"advanced": {"server": {"background_models": value}}})
