"""What coding harnesses send that mtrl once refused (issue 46, item 1), each now served as the harness needs.

Each request below was a 400 or a 404 with the harness as it ships: a system message inside Anthropic ``messages``
(Claude Code's reminders), ``max_tokens`` 32,000/64,000 above the cap, an Anthropic client given the rollout's base
URL, Codex CLI's ``namespace`` and ``web_search`` tools. Against a coordinator served on loopback (scripted engine).
"""

from __future__ import annotations

import httpx
import pytest

from _adapter_support import TOOLS, policy, tasks
from mtrl_adapters.wire import rollout_base_urls
from mtrl_runtime.engines import ScriptedEngine

RESPONSE_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
                    "input_schema": t["function"]["parameters"]} for t in TOOLS]


@pytest.fixture
def handle(served, tiny_tok):
    return served(ScriptedEngine(tiny_tok, policy))


def _rollout(handle, i: int = 1):
    return handle.coordinator.create_rollout(tasks(i + 1)[i])


def _post(handle, rollout, path, body):
    return httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}{path}", json=body,
                      headers={"authorization": f"Bearer {rollout.token}"}, timeout=30)


def test_anthropic_messages_keep_a_system_message_inside_messages_in_place(handle):
    r = _rollout(handle)
    prompt = tasks(2)[1].prompt
    body = {"model": "claude-sonnet-4-5", "max_tokens": 256, "system": "You are a coding agent.", "tools": ANTHROPIC_TOOLS,
            "messages": [{"role": "user", "content": prompt},
                         {"role": "system", "content": "<system-reminder>Answer with the tools.</system-reminder>"},
                         {"role": "user", "content": "Go on."}]}
    response = _post(handle, r, "/v1/messages", body)
    assert response.status_code == 200, response.text
    [turn] = handle.store.get_rollout(r.rollout_id).turns
    assert [m["role"] for m in turn.messages] == ["system", "user", "system", "user"]  # kept where it was sent
    assert "Answer with the tools." in turn.messages[2]["content"]


@pytest.mark.parametrize("max_tokens", [32000, 64000])
def test_anthropic_messages_max_tokens_above_the_cap_is_served(handle, max_tokens):
    r = _rollout(handle)
    body = {"model": "claude-sonnet-4-5", "max_tokens": max_tokens, "tools": ANTHROPIC_TOOLS,
            "messages": [{"role": "user", "content": tasks(2)[1].prompt}]}
    response = _post(handle, r, "/v1/messages", body)
    assert response.status_code == 200, response.text
    assert response.json()["stop_reason"] in ("tool_use", "end_turn", "max_tokens"), response.json()
    assert len(handle.store.get_rollout(r.rollout_id).turns) == 1


def test_an_anthropic_client_accepts_the_rollout_base_url_as_is(handle):
    anthropic = pytest.importorskip("anthropic")
    r = _rollout(handle)
    client = anthropic.Anthropic(base_url=rollout_base_urls(handle.url, r.rollout_id)["anthropic"], api_key=r.token,
                                 max_retries=0)
    reply = client.messages.create(model="claude-sonnet-4-5", max_tokens=256, tools=ANTHROPIC_TOOLS,
                                   messages=[{"role": "user", "content": tasks(2)[1].prompt}])
    assert reply.content and reply.content[-1].type == "tool_use" and reply.content[-1].name == "lookup"
    assert len(handle.store.get_rollout(r.rollout_id).turns) == 1


CODEX_TOOLS = [
    *RESPONSE_TOOLS,
    {"type": "web_search"},  # hosted: Codex sends it; the model may not call it against mtrl
    {"type": "namespace", "name": "collaboration", "description": "Sub-agents.", "tools": [
        {"type": "function", "name": "spawn_agent", "description": "Spawn an agent.",
         "parameters": {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}}]},
]


def test_responses_accept_namespace_and_web_search_tools_beside_functions(handle):
    r = _rollout(handle)
    response = _post(handle, r, "/v1/responses", {"model": "gpt-5-codex", "input": tasks(2)[1].prompt,
                                                    "instructions": "You are Codex.", "tools": CODEX_TOOLS})
    assert response.status_code == 200, response.text
    call = response.json()["output"][-1]
    assert call["type"] == "function_call" and call["name"] == "lookup", call
    [turn] = handle.store.get_rollout(r.rollout_id).turns
    names = [t.get("function", t).get("name") for t in turn.tools]
    assert "lookup" in names and any("spawn_agent" in (n or "") for n in names), names  # the namespace's tool offered
