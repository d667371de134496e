"""A real Strands agent with two tools, 16 concurrent rollouts against the served scripted policy.

The 16 Agents come from one factory (Strands Agents are not re-entrant) and
share one OpenAIModel object; the agent code is unchanged apart from the
decorator and the factory wrapper.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars

import pytest

from _adapter_support import (
    CRASH_KEY,
    ERROR_KEY,
    add,
    calling_first,
    check_attribution,
    finish_episode,
    lookup,
    policy,
    specs,
    tasks,
    value_of,
)
from mtrl_adapters import rollout, rollout_scope
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.types import BreakReason

strands = pytest.importorskip("strands")
from strands import Agent, tool  # noqa: E402
from strands.hooks import BeforeToolsEvent, HookProvider  # noqa: E402
from strands.models.openai import OpenAIModel  # noqa: E402

from mtrl_adapters.strands import MtrlHooks, agent_factory  # noqa: E402

lookup_tool = tool(lookup)
add_tool = tool(add)


def _model() -> OpenAIModel:
    # the user's own configuration: a real provider URL and key, untouched by mtrl
    return OpenAIModel(client_args={"api_key": "sk-user-real-key", "base_url": "https://api.openai.com/v1"},
                       model_id="gpt-4o-mini")


def _turns(agent: Agent) -> int:
    return sum(1 for m in agent.messages if m["role"] == "assistant")


async def test_strands_16_concurrent_rollouts_one_shared_model(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, policy))
    model = _model()
    make_agent = agent_factory(lambda: Agent(model=model, tools=[lookup_tool, add_tool], callback_handler=None))

    @rollout
    async def run(task):
        agent = make_agent()
        result = await agent.invoke_async(task.prompt)
        finish_episode(task, _turns(agent))
        return str(result)

    async def one(spec):
        with rollout_scope(spec) as ctx:
            try:
                await run(spec.task)
            except RuntimeError as exc:
                assert "crashed on purpose" in str(exc)
        return ctx

    runs = specs(handle, tasks(16))
    contexts = await asyncio.gather(*(one(s) for s in runs))
    for spec in runs:
        check_attribution(handle.store, spec)
    statuses = sorted(c.outcome.status for c in contexts)
    assert statuses.count("failed") == 1 and statuses.count("completed") == 15
    error_rollout = next(r for r in runs if ERROR_KEY in r.task.prompt)
    [call] = handle.store.get_rollout(error_rollout.rollout_id).tool_calls
    assert call.error == "KeyError: 'unknown key K03'"  # the exception, as Strands gave it to the model
    assert handle.coordinator.counters["auth_rejected"] == 0
    assert handle.coordinator.counters["tool_calls_unrecorded"] == 0  # the factory's hooks reported every call


def test_strands_sync_agents_on_threads(served, tiny_tok):
    """The sync entrypoint (``agent(prompt)``) runs Strands' own loop on a thread: attribution holds."""
    handle = served(ScriptedEngine(tiny_tok, policy))
    model = _model()

    @rollout
    def run(task):
        agent = Agent(model=model, tools=[lookup_tool, add_tool], callback_handler=None, hooks=[MtrlHooks()])
        agent(task.prompt)
        finish_episode(task, _turns(agent))

    def one(spec):
        with rollout_scope(spec):
            try:
                run(spec.task)
            except RuntimeError:
                pass

    runs = specs(handle, tasks(8))
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda s: contextvars.copy_context().run(one, s), runs))
    for spec in runs:
        check_attribution(handle.store, spec)
    assert any(CRASH_KEY in r.task.prompt for r in runs)


async def test_agent_built_without_hooks_is_flagged_not_silent(served, tiny_tok, caplog):
    """Agents built before their rollouts opened (no mtrl hooks: only an Agent built inside a rollout gets them by
    itself), run by a decorated ``main()``: the tool calls they ran and did not report are flagged on each
    rollout, counted, and the fix is logged once, naming agent_factory."""
    handle = served(ScriptedEngine(tiny_tok, policy))
    model = _model()
    runs = [s for s in specs(handle, tasks(6)) if CRASH_KEY not in s.task.prompt and ERROR_KEY not in s.task.prompt]
    agents = {s.task.id: Agent(model=model, tools=[lookup_tool, add_tool], callback_handler=None) for s in runs}

    @rollout
    async def main(task):
        agent = agents[task.id]
        await agent.invoke_async(task.prompt)
        finish_episode(task, _turns(agent))

    with caplog.at_level("WARNING", logger="mtrl.coordinator"):
        for spec in runs:
            with rollout_scope(spec):
                await main(spec.task)
    flagged = []
    for spec in runs:
        stored = handle.store.get_rollout(spec.rollout_id)
        assert stored.tool_calls == ()  # nothing reported: the hooks were never attached
        asked = sum(len(t.tool_calls) for t in stored.turns)
        assert asked > 0
        flagged.append(stored.metrics.get("tool_calls_unrecorded"))
    assert all(f is not None and f > 0 for f in flagged), flagged
    assert handle.coordinator.counters["tool_calls_unrecorded"] == sum(flagged)
    warnings = [r for r in caplog.records if "tool call(s) unrecorded" in r.getMessage()]
    assert len(warnings) == 1 and "agent_factory" in warnings[0].getMessage()


@pytest.mark.parametrize("hooks", ["factory", "built in the function", "none"])
async def test_refused_tool_name_is_recorded_not_flagged_unrecorded(served, tiny_tok, caplog, hooks):
    """Strands answers a call to an invalid tool name with an error result and fires no per-tool hook. With
    the hooks, the batch events record it (an error naming Strands' refusal, the name the model wrote); either
    way the coordinator counts it as undeclared, never as a tool call the agent ran and did not report.
    ``none``: an Agent built before the rollout opened, which nothing gave mtrl's hooks."""
    handle = served(ScriptedEngine(tiny_tok, calling_first("look up")))
    model = _model()
    build = lambda: Agent(model=model, tools=[lookup_tool, add_tool], callback_handler=None)  # noqa: E731
    built_before = build()
    make_agent = {"factory": agent_factory(build), "built in the function": build, "none": lambda: built_before}[hooks]

    @rollout
    async def run(task):
        await make_agent().invoke_async(task.prompt)
        finish_episode(task, 3)

    [spec] = specs(handle, tasks(1))
    with caplog.at_level("WARNING", logger="mtrl.coordinator"):
        with rollout_scope(spec):
            await run(spec.task)
    stored = handle.store.get_rollout(spec.rollout_id)
    asked = [call["function"]["name"] for turn in stored.turns for call in turn.tool_calls]
    assert asked == ["look up", "lookup"]
    refusal = next(m for m in stored.turns[1].messages if m["role"] == "tool")
    assert "invalid tool name" in refusal["content"]  # what the model read
    assert stored.metrics["tool_calls_undeclared"] == 1.0
    assert handle.coordinator.counters["tool_calls_undeclared"] == 1
    # Strands sends the refused call back renamed INVALID_TOOL_NAME: the next turn cannot extend the tokens the
    # model generated, so it opens a new segment, said (break reason and counter), never glued on silently
    [echoed] = [m for m in stored.turns[1].messages if m["role"] == "assistant"]
    assert echoed["tool_calls"][0]["function"]["name"] == "INVALID_TOOL_NAME"
    assert [t.break_reason for t in stored.turns] == [None, BreakReason.REPLY_EDITED, None]
    assert handle.coordinator.counters["prefix_break/reply_edited"] == 1
    if hooks != "none":
        assert "tool_calls_unrecorded" not in stored.metrics
        refused, ran = stored.tool_calls
        assert (refused.name, refused.arguments, refused.status) == ("look up", {"key": "K00"}, "error")
        assert "invalid tool name" in refused.error and refused.turn_index == 0
        assert (ran.name, ran.status, ran.result, ran.turn_index) == ("lookup", "success", str(value_of("K00")), 1)
        assert "unrecorded" not in caplog.text
    else:  # the valid call ran unreported: that one (only) is flagged, with the fix
        assert stored.tool_calls == ()
        assert stored.metrics["tool_calls_unrecorded"] == 1.0
        assert "agent_factory" in caplog.text


async def test_batch_cancelled_by_a_hook_is_recorded(served, tiny_tok):
    """A user's own hook cancels the batch (BeforeToolsEvent.cancel): no tool runs, no per-tool hook fires; the
    cancelled call is recorded as an error carrying the hook's message, and nothing is flagged unrecorded."""
    handle = served(ScriptedEngine(tiny_tok, policy))

    class NoTools(HookProvider):
        def register_hooks(self, registry, **kwargs):
            registry.add_callback(BeforeToolsEvent, self.deny)

        def deny(self, event):
            event.cancel = "tools are switched off for this episode"

    make_agent = agent_factory(
        lambda: Agent(model=_model(), tools=[lookup_tool, add_tool], hooks=[NoTools()], callback_handler=None))

    @rollout
    async def run(task):
        await make_agent().invoke_async(task.prompt)
        finish_episode(task, 2)

    [spec] = specs(handle, tasks(1))
    with rollout_scope(spec):
        await run(spec.task)
    stored = handle.store.get_rollout(spec.rollout_id)
    [call] = stored.tool_calls
    assert (call.name, call.status, call.turn_index) == ("lookup", "error", 0)
    assert call.error == "tools are switched off for this episode"
    assert "tool_calls_unrecorded" not in stored.metrics and "tool_calls_undeclared" not in stored.metrics
