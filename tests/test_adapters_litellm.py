"""Strands' ``LiteLLMModel`` inside rollouts, written as Strands' docs teach it, with the model ids users pick.

* ``openai/<model>``: LiteLLM calls through the ``openai`` SDK, which mtrl
  redirects per rollout: captured token for token (one sequence per rollout),
  tool calls recorded, six concurrent rollouts on one shared model object,
  whether the user named their own ``api_base`` or left OpenAI's default.
* ``anthropic/<model>`` and ``bedrock/<model>``: LiteLLM sends those over its
  own HTTP client (and signs Bedrock's itself); mtrl refuses them at the
  first call, before any byte is sent, with an error naming the fix.

A guard refuses (and lists) every name lookup but loopback, so a call that
slipped past mtrl to a real provider would fail the test, not pass silently.
"""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any

import pytest

from _adapter_support import (
    CRASH_KEY, ERROR_KEY, OFFSET, add, afinish_episode, check_attribution, key_of, lookup, policy, refuse_network,
    specs, tasks, value_of,
)
from mtrl_adapters import UncapturedLiteLLMCall, rollout, rollout_scope
from mtrl_runtime.engines import ScriptedEngine

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm's import would fetch its cost map otherwise
pytest.importorskip("litellm")
strands = pytest.importorskip("strands")
from strands.models.litellm import LiteLLMModel  # noqa: E402

from mtrl_adapters.strands import agent_factory  # noqa: E402

USER_KEY = "sk-user-real-key"


@pytest.fixture
def offline(monkeypatch):
    """Dummy provider credentials, and a guard that refuses (and lists) any name lookup but loopback."""
    for name, value in {"AWS_ACCESS_KEY_ID": "AKIAUSERREALKEY12345", "AWS_SECRET_ACCESS_KEY": "user-real-secret",
                        "AWS_REGION_NAME": "us-east-1", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
                        "ANTHROPIC_API_KEY": USER_KEY, "OPENAI_API_KEY": USER_KEY}.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "OPENAI_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    contacted = refuse_network(monkeypatch)
    yield contacted
    assert contacted == [], f"hosts other than mtrl were contacted: {contacted}"


def _agent_fn(model: LiteLLMModel) -> Any:
    make_agent = agent_factory(lambda: strands.Agent(model=model, tools=[strands.tool(lookup), strands.tool(add)],
                                                     callback_handler=None))

    @rollout
    async def run(task):
        agent = make_agent()
        result = await agent.invoke_async(task.prompt)
        await afinish_episode(task, sum(1 for m in agent.messages if m["role"] == "assistant"))
        return str(result)

    return run


async def _run_all(run: Any, runs: list) -> list[Any]:
    async def one(spec):
        with rollout_scope(spec):
            try:
                return await run(spec.task)
            except Exception as exc:  # noqa: BLE001  (the test reads what each rollout raised)
                return exc

    return await asyncio.gather(*(one(s) for s in runs))


@pytest.mark.parametrize(("client_args", "model_id", "streaming"), [
    ({"api_key": USER_KEY}, "openai/gpt-4o-mini", True),
    ({"api_key": USER_KEY, "api_base": "https://vllm.internal.example:8000/v1"}, "openai/policy", False),
], ids=["openai-default-base-streamed", "openai-own-api-base"])
async def test_litellm_openai_model_ids_are_captured_token_exact(served, tiny_tok, offline, client_args, model_id,
                                                                 streaming):
    handle = served(ScriptedEngine(tiny_tok, policy))
    model = LiteLLMModel(client_args=client_args, model_id=model_id, stream=streaming,
                         params={"max_tokens": 1000, "temperature": 0.7})
    runs = specs(handle, tasks(6))  # K00..K05: a tool error (K03) and an agent crash (K05) among them
    answers = await _run_all(_agent_fn(model), runs)
    for spec, answer in zip(runs, answers):
        rollout_ = check_attribution(handle.store, spec)
        key = key_of(spec.task.prompt)
        if key == CRASH_KEY:
            assert "crashed on purpose" in str(answer)
            continue
        expected = "The lookup of K03 failed" if key == ERROR_KEY else f"is {value_of(key) + OFFSET}"
        assert expected in str(answer)
        turns = rollout_.turns
        assert len(turns) == (2 if key == ERROR_KEY else 3)
        for before, after in zip(turns, turns[1:]):  # one training sequence: each prompt extends the last turn
            assert after.segment == 0 and after.break_reason is None, (key, after.index, after.break_reason)
            context = before.prompt_ids + before.completion_ids
            assert after.prompt_ids[: len(context)] == context
        assert turns[0].tools and turns[0].tools[0]["function"]["name"] == "lookup"
    counters = handle.coordinator.counters
    assert counters["auth_rejected"] == 0 and counters["tool_calls_unrecorded"] == 0


@pytest.mark.parametrize("model_id", ["anthropic/claude-sonnet-4-20250514",
                                      "bedrock/us.anthropic.claude-sonnet-4-20250514-v1:0"])
@pytest.mark.parametrize("streaming", [True, False], ids=["streamed", "not-streamed"])
async def test_litellm_own_http_providers_are_refused_at_the_first_call(served, tiny_tok, offline, model_id, streaming):
    """LiteLLM's own HTTP client (Anthropic, SigV4 Bedrock) is refused before sending, naming the fix, every time."""
    handle = served(ScriptedEngine(tiny_tok, policy))
    model = LiteLLMModel(client_args={"api_key": USER_KEY}, model_id=model_id, stream=streaming,
                         params={"max_tokens": 1000})
    runs = specs(handle, tasks(4))
    errors = await _run_all(_agent_fn(model), runs)
    host = "api.anthropic.com" if model_id.startswith("anthropic/") else "bedrock-runtime.us-east-1.amazonaws.com"
    for spec, error in zip(runs, errors):
        assert isinstance(error, Exception), error
        text = str(error)
        assert f"request to {host}" in text and spec.rollout_id in text and "refused before sending" in text
        assert "'openai/<model>' model id" in text  # the fix
        rollout_ = handle.store.get_rollout(spec.rollout_id)
        assert rollout_.status.value == "failed" and "refused before sending" in rollout_.error
        assert rollout_.turns == ()  # nothing reached the policy, nothing half-recorded
    assert offline == []  # no provider host was even looked up


async def test_guard_acts_only_inside_a_rollout_and_passes_the_coordinator(served, tiny_tok, offline):
    """Outside a rollout LiteLLM's handlers run unchanged; inside one only the coordinator's URL passes."""
    from litellm.llms.custom_httpx.http_handler import AsyncHTTPHandler

    from mtrl_adapters import instrument

    instrument()
    handle = served(ScriptedEngine(tiny_tok, policy))
    http = AsyncHTTPHandler()
    health = f"{handle.url}/health"
    assert (await http.get(health)).status_code == 200  # no rollout: untouched
    [spec] = specs(handle, tasks(1))
    with rollout_scope(spec):
        assert (await http.get(health)).status_code == 200  # the coordinator itself
        for url in ("https://api.anthropic.com/v1/messages", f"{handle.url.replace('127.0.0.1', 'localhost')}/x",
                    f"http://127.0.0.1:1{handle.url.rsplit(':', 1)[1]}/v1/messages"):
            with pytest.raises(UncapturedLiteLLMCall, match="refused before sending"):
                await http.post(url, json={"model": "m", "messages": []})
    await http.close()
    assert json.dumps(offline) == "[]"


_IMPORTED_INSIDE = r'''
import asyncio, json, os, socket, sys
from types import SimpleNamespace

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
contacted = []
real = socket.getaddrinfo

def guarded(host, *args, **kwargs):
    name = host.decode() if isinstance(host, bytes) else str(host)
    if name not in ("127.0.0.1", "localhost", "::1"):
        contacted.append(name)
        raise OSError(f"test guard: no network, refused a lookup of {name}")
    return real(host, *args, **kwargs)

socket.getaddrinfo = guarded
from mtrl_adapters import rollout, rollout_scope

spec = SimpleNamespace(**json.loads(sys.argv[1]))

@rollout
async def run(task):
    import litellm  # the agent's first use of LiteLLM, inside its first rollout

    return await litellm.acompletion(model="anthropic/claude-sonnet-4-20250514", api_key="sk-user-real-key",
                                     messages=[{"role": "user", "content": task}])

async def main():
    assert "litellm" not in sys.modules
    with rollout_scope(spec):
        try:
            await run("hello")
        except Exception as exc:  # noqa: BLE001
            print(json.dumps({"error": str(exc), "contacted": contacted}))
            return
    print(json.dumps({"error": None, "contacted": contacted}))

asyncio.run(main())
'''


def test_litellm_imported_inside_the_first_rollout_is_guarded_in_that_rollout(served, tiny_tok):
    """An agent that imports LiteLLM in its rollout function: the import hook guards its client before the first call."""
    import subprocess
    import sys

    handle = served(ScriptedEngine(tiny_tok, policy))
    [spec] = specs(handle, tasks(1))
    fields = {"rollout_id": spec.rollout_id, "group_id": spec.group_id, "task": None, "token": spec.token,
              "endpoint": spec.endpoint, "model_name": spec.model_name, "max_turns": spec.max_turns,
              "timeout_s": spec.timeout_s}
    done = subprocess.run([sys.executable, "-c", _IMPORTED_INSIDE, json.dumps(fields)], capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["contacted"] == [], result
    assert result["error"] and "refused before sending" in result["error"] and "api.anthropic.com" in result["error"]
    rollout_ = handle.store.get_rollout(spec.rollout_id)
    assert rollout_.status.value == "failed" and "refused before sending" in rollout_.error
