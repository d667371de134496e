"""One rule for a failed tool result in every protocol (wires/_shared.py).

The model sees the result's text exactly as the agent sent it; Anthropic's
``is_error`` and Bedrock's ``status: "error"`` are kept on the stored
``tool`` message and counted per rollout (``tool_results_failed``). Real
SDKs (openai, anthropic, boto3 through the ``mtrl_adapters`` redirect with
dummy AWS credentials) and a real Strands agent whose tool raises, on
loopback; the ``aws`` fixture refuses any lookup but loopback.
"""

from __future__ import annotations

import httpx
import pytest

from _adapter_support import ERROR_KEY, TOOLS, add, lookup, specs, tasks
from mtrl_adapters import rollout, rollout_scope

boto3 = pytest.importorskip("boto3")
anthropic = pytest.importorskip("anthropic")
openai = pytest.importorskip("openai")
from test_protocol_bedrock import MODEL_ID, TOOL_CONFIG, aws, bedrock_served  # noqa: E402,F401  (fixtures)

FAILED = "Unknown tool: lookup"  # Strands' own text for a call it could not run
ARGS = {"key": "K01"}


def _chat(handle, spec) -> None:
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{spec.rollout_id}/v1", api_key=spec.token, max_retries=0)
    client.chat.completions.create(model="m", tools=TOOLS, messages=[
        {"role": "user", "content": spec.task.prompt},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "K01"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": FAILED},
    ])


def _responses(handle, spec) -> None:
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{spec.rollout_id}/v1", api_key=spec.token, max_retries=0)
    client.responses.create(model="m", tools=[{"type": "function", **t["function"]} for t in TOOLS], input=[
        {"role": "user", "content": spec.task.prompt},
        {"type": "function_call", "call_id": "t1", "name": "lookup", "arguments": '{"key": "K01"}'},
        {"type": "function_call_output", "call_id": "t1", "output": FAILED},
    ])


def _anthropic(handle, spec) -> None:
    client = anthropic.Anthropic(base_url=f"{handle.url}/rollouts/{spec.rollout_id}", api_key=spec.token, max_retries=0)
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    client.messages.create(model="m", max_tokens=256, tools=tools, messages=[
        {"role": "user", "content": spec.task.prompt},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": ARGS}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": FAILED, "is_error": True}]},
    ])


def _bedrock(handle, spec) -> None:
    client = boto3.client("bedrock-runtime", region_name="us-east-1")
    client.converse(modelId=MODEL_ID, toolConfig=TOOL_CONFIG, messages=[
        {"role": "user", "content": [{"text": spec.task.prompt}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "lookup", "input": ARGS}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "status": "error", "content": [{"text": FAILED}]}}]},
    ])


def test_a_failed_tool_result_renders_the_same_tokens_in_every_protocol_and_its_flag_is_recorded(bedrock_served, aws):
    handle = bedrock_served()
    calls = {"chat": _chat, "responses": _responses, "anthropic": _anthropic, "bedrock": _bedrock}
    runs = dict(zip(calls, specs(handle, tasks(2)[1:] * len(calls))))  # one task, a rollout per protocol
    for name, spec in runs.items():
        @rollout
        def agent(task):
            calls[name](handle, spec)

        with rollout_scope(spec):
            agent(spec.task)

    stored = {name: handle.store.get_rollout(spec.rollout_id) for name, spec in runs.items()}
    prompts = {name: r.turns[0].prompt_ids for name, r in stored.items()}
    texts = {n: handle.coordinator.renderer.decode(list(p)) for n, p in prompts.items()}
    assert len(set(prompts.values())) == 1, texts
    prompt_text = handle.coordinator.renderer.decode(list(prompts["bedrock"]))
    assert FAILED in prompt_text and "Error:" not in prompt_text  # the agent's text, nothing added
    for name, rollout_ in stored.items():
        [tool] = [m for m in rollout_.turns[0].messages if m["role"] == "tool"]
        assert tool["content"] == FAILED
        flagged = name in ("anthropic", "bedrock")  # the protocols whose wire format carries the flag
        assert tool.get("status") == ("error" if flagged else None), name
        assert rollout_.metrics.get("tool_results_failed") == (1.0 if flagged else None), (name, rollout_.metrics)
    assert handle.coordinator.counters["tool_results_failed"] == 2


def test_a_failed_result_repeated_over_turns_counts_once_and_a_bad_is_error_is_refused(bedrock_served, aws):
    handle = bedrock_served()
    [spec] = specs(handle, tasks(2)[1:])
    url = f"{handle.url}/rollouts/{spec.rollout_id}/v1/messages"
    history = [
        {"role": "user", "content": spec.task.prompt},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": ARGS}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "is_error": True,
                                      "content": [{"type": "text", "text": "Error: KeyError('K01')"}]}]},
    ]
    headers = {"x-api-key": spec.token}
    bad = httpx.post(url, headers=headers, timeout=30, json={
        "max_tokens": 64, "messages": [*history[:2], {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "x", "is_error": "yes"}]}]})
    assert bad.status_code == 400, bad.text
    assert "messages[2].content[0].is_error" in bad.json()["error"]["message"] and "'yes'" in bad.json()["error"]["message"]
    first = httpx.post(url, headers=headers, timeout=30, json={"max_tokens": 64, "messages": history})
    assert first.status_code == 200, first.text
    second = httpx.post(url, headers=headers, timeout=30, json={"max_tokens": 64, "messages": [
        *history, {"role": "assistant", "content": first.json()["content"]}, {"role": "user", "content": "go on"}]})
    assert second.status_code == 200, second.text
    with rollout_scope(spec):
        rollout(lambda task: None)(spec.task)  # the agent returns: the rollout ends
    recorded = handle.store.get_rollout(spec.rollout_id)
    assert len(recorded.turns) == 2
    assert all(m.get("status") == "error" for t in recorded.turns for m in t.messages if m["role"] == "tool")
    assert recorded.metrics["tool_results_failed"] == 1.0  # one failed call, seen by two turns


async def test_strands_tool_that_raises_reaches_the_model_as_strands_text_and_is_flagged(bedrock_served, aws):
    """Strands' BedrockModel sends a raising tool's result as ``status: error`` with its own ``Error: ...`` text."""
    strands = pytest.importorskip("strands")
    from strands.models.bedrock import BedrockModel

    from mtrl_adapters.strands import agent_factory

    handle = bedrock_served()
    [spec] = specs(handle, [t for t in tasks(5) if ERROR_KEY in t.prompt])
    model = BedrockModel(model_id=MODEL_ID, region_name="us-east-1", max_tokens=512)
    make_agent = agent_factory(lambda: strands.Agent(model=model, tools=[strands.tool(lookup), strands.tool(add)],
                                                     callback_handler=None))

    @rollout
    async def run(task):
        return str(await make_agent().invoke_async(task.prompt))

    with rollout_scope(spec):
        answer = await run(spec.task)
    assert "failed" in answer
    recorded = handle.store.get_rollout(spec.rollout_id)
    [tool] = [m for m in recorded.turns[1].messages if m["role"] == "tool"]
    assert tool["status"] == "error" and tool["content"].startswith("Error: ")  # Strands' text, unchanged
    assert not tool["content"].startswith("Error: Error:")
    assert recorded.metrics["tool_results_failed"] == 1.0
    [call] = [c for c in recorded.tool_calls if c.name == "lookup"]
    assert call.status == "error"  # the adapter's own record agrees


def test_the_flag_is_hidden_from_a_chat_template_that_would_print_it(tiny_tok):
    """A model's own template never sees ``status`` (a deployed server drops the flag), whatever it reads."""
    from mtrl_runtime.chat import ChatRenderer, normalize_messages

    renderer = ChatRenderer(tiny_tok, template="{% for m in messages %}{{ m.role }}|{{ m.content }}|"
                                               "{{ m.status | default('none') }}\n{% endfor %}")
    flagged = normalize_messages([{"role": "user", "content": "q"},
                                  {"role": "tool", "tool_call_id": "t1", "content": FAILED, "status": "error"}])
    assert flagged[1]["status"] == "error"  # kept on the canonical (stored) message
    assert renderer.render(flagged, add_generation_prompt=False) == f"user|q|none\ntool|{FAILED}|none\n"
