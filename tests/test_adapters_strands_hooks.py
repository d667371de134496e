"""Strands Agents built inside the user's own function, as Strands' docs teach: their tool calls are recorded.

An existing ``main()`` that builds its ``Agent(model=..., tools=[...])`` and
calls it, decorated with ``@rollout`` and nothing else: mtrl attaches its
hooks to every Agent built inside a rollout (``instrument_strands`` wraps
``Agent.__init__``), so every tool call is recorded, with Strands'
``OpenAIModel`` and with its ``BedrockModel``, on the scripted policy
served on loopback. The 16 tasks make 31 tool calls: two per task, one for
K03 (its ``lookup`` raises; the model reads the error and answers).
Hooks that arrive more than once (the user's own ``MtrlHooks``, ``attach``,
the factory, the wrapper) record each call once. What the wrapper cannot
reach, an Agent built before the rollout opened, is flagged (the existing
tests in test_adapters_strands.py), and shown on ``mtrl collect``'s line.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from _adapter_support import (
    CRASH_KEY,
    ERROR_KEY,
    add,
    check_attribution,
    finish_episode,
    key_of,
    lookup,
    specs,
    tasks,
)
from mtrl_adapters import current_rollout, rollout, rollout_scope

strands = pytest.importorskip("strands")
pytest.importorskip("boto3")
from strands import Agent, tool  # noqa: E402
from strands.models.bedrock import BedrockModel  # noqa: E402
from strands.models.openai import OpenAIModel  # noqa: E402
from test_protocol_bedrock import MODEL_ID, aws, bedrock_served  # noqa: E402,F401  (fixtures)

from mtrl_adapters.strands import MtrlHooks, agent_factory, attach, instrument_strands, uninstall_strands  # noqa: E402

lookup_tool = tool(lookup)
add_tool = tool(add)


def _model(provider: str):
    """The user's own model object, built once, configured for the real provider (mtrl redirects its calls)."""
    if provider == "bedrock":
        return BedrockModel(model_id=MODEL_ID, region_name="us-east-1", max_tokens=512)
    return OpenAIModel(client_args={"api_key": "sk-user-real-key", "base_url": "https://api.openai.com/v1"},
                       model_id="gpt-4o-mini")


def _turns(agent: Agent) -> int:
    return sum(1 for m in agent.messages if m["role"] == "assistant")


@pytest.mark.parametrize("provider", ["openai", "bedrock"])
async def test_an_agent_built_in_the_users_function_records_all_31_tool_calls(bedrock_served, aws, provider):
    handle = bedrock_served()
    model = _model(provider)

    @rollout
    async def main(task):  # the user's code as it was, plus the decorator
        agent = Agent(model=model, tools=[lookup_tool, add_tool], callback_handler=None)
        result = await agent.invoke_async(task.prompt)
        finish_episode(task, _turns(agent))
        return str(result)

    async def one(spec):
        with rollout_scope(spec):
            try:
                return await main(spec.task)
            except RuntimeError as exc:
                assert "crashed on purpose" in str(exc) and CRASH_KEY in spec.task.prompt
                return str(exc)

    runs = specs(handle, tasks(16))
    await asyncio.gather(*(one(s) for s in runs))
    recorded = [check_attribution(handle.store, spec) for spec in runs]  # each call on its own rollout and turn
    asked = sum(len(t.tool_calls) for r in recorded for t in r.turns)
    assert asked == 31 and sum(len(r.tool_calls) for r in recorded) == 31
    assert handle.coordinator.counters["tool_calls_unrecorded"] == 0
    [failed] = [c for r in recorded for c in r.tool_calls if c.status == "error"]
    assert failed.error == "KeyError: 'unknown key K03'"
    assert failed.result == "Error: KeyError - 'unknown key K03'"  # the text Strands gave the model


def test_a_sync_agent_built_in_the_function_records_its_calls(bedrock_served, aws):
    """Strands' quickstart form, ``agent(prompt)`` from a plain ``def``: Strands runs its loop on a thread."""
    handle = bedrock_served()
    model = _model("openai")

    @rollout
    def main(task):
        agent = Agent(model=model, tools=[lookup_tool, add_tool], callback_handler=None)
        agent(task.prompt)
        finish_episode(task, _turns(agent))

    [spec] = specs(handle, tasks(3)[2:])
    with rollout_scope(spec):
        main(spec.task)
    assert len(check_attribution(handle.store, spec).tool_calls) == 2


@pytest.mark.parametrize("how", ["hooks=[MtrlHooks()]", "attach", "add_hook", "factory", "two MtrlHooks"])
async def test_hooks_that_arrive_more_than_once_record_each_call_once(bedrock_served, aws, how):
    handle = bedrock_served()
    model = _model("openai")
    kwargs = dict(model=model, tools=[lookup_tool, add_tool], callback_handler=None)
    build = {
        "hooks=[MtrlHooks()]": lambda: Agent(**kwargs, hooks=[MtrlHooks()]),
        "attach": lambda: attach(attach(Agent(**kwargs))),
        "add_hook": lambda: _added(Agent(**kwargs, hooks=[MtrlHooks()])),
        "factory": agent_factory(lambda: Agent(**kwargs)),
        "two MtrlHooks": lambda: Agent(**kwargs, hooks=[MtrlHooks(), MtrlHooks()]),
    }[how]

    @rollout
    async def main(task):
        agent = build()
        await agent.invoke_async(task.prompt)
        finish_episode(task, _turns(agent))

    runs = specs(handle, [t for t in tasks(4) if CRASH_KEY not in t.prompt])
    for spec in runs:
        with rollout_scope(spec):
            await main(spec.task)
    for spec in runs:
        rollout_ = check_attribution(handle.store, spec)  # exactly the calls the model asked for, once each
        expected = 1 if key_of(spec.task.prompt) == ERROR_KEY else 2
        assert len(rollout_.tool_calls) == expected, rollout_.tool_calls


def _added(agent: Agent) -> Agent:
    agent.hooks.add_hook(MtrlHooks())  # the user adds mtrl's hooks again, after Strands built the Agent
    return agent


async def test_an_agent_built_before_the_rollout_is_not_changed_and_is_flagged(bedrock_served, aws, caplog):
    """The wrapper acts only inside a rollout: an Agent built at import keeps its own hooks, runs as before, and
    its unreported calls are flagged with the fix (build it in the function, or with agent_factory)."""
    handle = bedrock_served()
    assert current_rollout() is None
    agent = Agent(model=_model("openai"), tools=[lookup_tool, add_tool], callback_handler=None)  # at import

    @rollout
    async def main(task):
        await agent.invoke_async(task.prompt)
        finish_episode(task, _turns(agent))

    [spec] = specs(handle, tasks(1))
    with caplog.at_level("WARNING", logger="mtrl.coordinator"):
        with rollout_scope(spec):
            await main(spec.task)
    stored = handle.store.get_rollout(spec.rollout_id)
    assert stored.tool_calls == () and stored.metrics["tool_calls_unrecorded"] == 2.0
    assert "build the Agent inside the decorated function" in caplog.text and "agent_factory" in caplog.text


def test_the_wrapper_installs_once_keeps_the_original_and_uninstalls():
    instrument_strands()  # installed now, or by an earlier rollout of this process
    wrapper = Agent.__init__
    original = wrapper.__mtrl_original__
    assert instrument_strands() is False and Agent.__init__ is wrapper  # once
    assert uninstall_strands() is True and Agent.__init__ is original  # Strands' own, back
    assert uninstall_strands() is False
    assert instrument_strands() is True and Agent.__init__.__mtrl_original__ is original


def test_what_strands_counts_as_a_failed_tool(served, tiny_tok):
    """The Strands column of docs/tool-calls.md: a tool that raises, that returns Strands' error result, or whose
    arguments fail its schema is recorded ``error``, with the text the model read as its result; a tool that
    returns an ``Error: ...`` string succeeded, as far as Strands knows."""
    from mtrl_runtime.engines import ScriptedEngine, ScriptedReply

    @tool
    def fetch(key: str) -> Any:
        """Fetch a key."""
        if key == "raise":
            raise KeyError(f"no key {key}")
        if key == "status":
            return {"status": "error", "content": [{"text": f"no key {key}"}]}
        return f"Error: no key {key}"

    calls = [{"key": "raise"}, {"key": "status"}, {"key": "quiet"}, {"name": "bad"}]
    handle = served(ScriptedEngine(tiny_tok, [ScriptedReply.tool_call("fetch", a) for a in calls] + ["None."]))

    @rollout
    def main(task):
        Agent(model=_model("openai"), tools=[fetch], callback_handler=None)(task.prompt)

    [spec] = specs(handle, tasks(1))
    with rollout_scope(spec):
        main(spec.task)
    stored = handle.store.get_rollout(spec.rollout_id)
    raised, status, returned, refused = stored.tool_calls
    assert (raised.status, raised.error, raised.result) == ("error", "KeyError: 'no key raise'",
                                                             "Error: KeyError - 'no key raise'")
    assert (status.status, status.error, status.result) == ("error", "no key status", "no key status")
    assert (returned.status, returned.error, returned.result) == ("success", None, "Error: no key quiet")
    assert refused.status == "error" and refused.error.startswith("ValueError: Validation failed for input")
    assert refused.result.startswith("Error: Validation failed for input parameters")
    read = [m["content"] for m in stored.turns[-1].messages if m["role"] == "tool"]
    assert read == [c.result for c in stored.tool_calls]  # what was stored is what the model read
    assert stored.metrics.get("tool_results_failed") is None  # chat completions carry no failure flag


def test_a_strands_without_the_batch_events_is_refused_naming_the_version():
    """The decorator imports this adapter whenever Strands is loaded: a Strands too old for it says what to install."""
    import subprocess
    import sys

    code = "import strands.hooks as h; del h.BeforeToolsEvent; import mtrl_adapters.strands"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "pip install 'strands-agents>=1.51'" in done.stderr, done.stderr
