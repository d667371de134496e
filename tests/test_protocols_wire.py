"""The Responses and Anthropic Messages endpoints on the wire: continuation, events, refusals naming the field.

Real HTTP on loopback against a served coordinator (scripted engine): what
``previous_response_id`` continues from and when it is unknown, ``store``,
the event streams as the SDKs parse them, and bad input answered with a 400
in each protocol's own error shape, naming the field and the value.
"""

from __future__ import annotations

import httpx
import pytest

from _adapter_support import TOOLS, policy, tasks
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.types import Task

RESPONSE_TOOLS = [{"type": "function", **t["function"]} for t in TOOLS]
ANTHROPIC_TOOLS = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]


@pytest.fixture
def handle(served, tiny_tok):
    return served(ScriptedEngine(tiny_tok, policy))


def _rollout(handle, i: int = 1):
    return handle.coordinator.create_rollout(tasks(i + 1)[i])


def _post(handle, rollout, path, body, **headers):
    auth = {"authorization": f"Bearer {rollout.token}"} if rollout is not None else {}
    url = f"{handle.url}/rollouts/{rollout.rollout_id}{path}" if rollout is not None else f"{handle.url}{path}"
    return httpx.post(url, json=body, headers={**auth, **headers}, timeout=30)


def test_previous_response_id_continues_within_its_rollout_only(handle):
    a, b = _rollout(handle, 1), _rollout(handle, 2)
    first = _post(handle, a, "/v1/responses", {"input": tasks(2)[1].prompt, "tools": RESPONSE_TOOLS, "instructions": "Be brief."})
    assert first.status_code == 200, first.text
    call = first.json()["output"][-1]
    assert call["type"] == "function_call" and call["name"] == "lookup"
    follow = {"previous_response_id": first.json()["id"], "tools": RESPONSE_TOOLS,
              "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "10"}]}
    # another rollout cannot continue from it (even with its own valid token)
    other = _post(handle, b, "/v1/responses", follow)
    assert other.status_code == 400 and other.json()["error"]["param"] == "previous_response_id"
    assert first.json()["id"] in other.json()["error"]["message"]
    second = _post(handle, a, "/v1/responses", {**follow, "instructions": "Be brief."})
    assert second.status_code == 200, second.text
    assert second.json()["output"][-1]["name"] == "add"
    recorded = handle.store.get_rollout(a.rollout_id).turns
    assert [m["role"] for m in recorded[1].messages] == ["system", "user", "assistant", "tool"]
    assert recorded[1].break_reason is None and recorded[1].segment == 0  # extended token for token
    assert recorded[1].prompt_ids[: len(recorded[0].prompt_ids)] == recorded[0].prompt_ids


def test_store_false_responses_cannot_be_continued_and_unknown_ids_are_named(handle):
    r = _rollout(handle)
    unstored = _post(handle, r, "/v1/responses", {"input": tasks(2)[1].prompt, "store": False})
    assert unstored.status_code == 200 and unstored.json()["store"] is False
    again = _post(handle, r, "/v1/responses", {"input": "more", "previous_response_id": unstored.json()["id"]})
    assert again.status_code == 400 and unstored.json()["id"] in again.json()["error"]["message"]
    unknown = _post(handle, r, "/v1/responses", {"input": "x", "previous_response_id": "resp_nope"})
    assert unknown.status_code == 400
    assert unknown.json()["error"]["param"] == "previous_response_id" and "'resp_nope'" in unknown.json()["error"]["message"]
    assert len(handle.store.get_rollout(r.rollout_id).turns) == 1  # the refused calls recorded nothing


BAD_RESPONSES = (
    [
        ({"input": 5}, "input.str", ["input", "5"]),
        ({"input": "x", "temperature": "hot"}, "temperature", ["temperature", "'hot'"]),
        ({"input": "x", "max_output_tokens": "9"}, "max_output_tokens", ["max_output_tokens", "'9'"]),
        ({"input": "x", "stream": "yes"}, "stream", ["stream", "'yes'"]),
        ({"input": "x", "tools": [{"type": "custom", "name": "patch"}]}, "tools.0.type", ["tools.0.type", "custom"]),
        ({"input": "x", "tools": [{"type": "namespace", "name": "ns", "tools": [{"type": "function"}]}]},
         "tools.0.tools.0.name", ["tools.0.tools.0.name", "required"]),
        ({"input": "x", "tool_choice": "sometimes"}, "body", ["tool_choice", "sometimes"]),
        ({"input": "x", "tool_choice": {"type": "function", "name": "nope"}, "tools": RESPONSE_TOOLS}, "tool_choice", ["nope"]),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
         "input[0].content[0].type", ["input_image", "text only"]),
        ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type", ["web_search_call"]),
        ({"input": [{"type": "function_call", "call_id": 7, "name": "f", "arguments": "{}"}]}, "input[0].call_id", ["call_id", "7"]),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type", ["item_reference", "msg_1"]),
        ({"input": "x", "background": True}, "body", ["background"]),
        ({"input": "x", "conversation": "conv_1"}, "body", ["conversation", "conv_1"]),
    ]
)


def test_bad_responses_requests_are_400s_naming_the_field(handle):
    for body, param, words in BAD_RESPONSES:
        response = _post(handle, _rollout(handle), "/v1/responses", body)
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param, error
        for word in words:
            assert word in error["message"], (word, error["message"])


BAD_MESSAGES = (
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens", ["max_tokens", "required"]),
        ({"max_tokens": 16, "messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, "temperature", ["'hot'"]),
        ({"max_tokens": 16, "messages": [{"role": "robot", "content": "x"}]}, "messages.0.role", ["robot"]),
        ({"max_tokens": 16, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
         "messages[0].content[0].type", ["image", "text only"]),
        ({"max_tokens": 16, "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The"}]},
         "messages[1].role", ["prefill"]),
        ({"max_tokens": 16, "messages": [{"role": "user", "content": "x"}], "top_k": 5}, "body", ["top_k", "5"]),
        ({"max_tokens": 16, "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
         "tools.0.input_schema", ["input_schema"]),
        ({"max_tokens": 16, "messages": [{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "image", "source": {}}]}]}]},
         "messages[0].content[0].content[0].type", ["image"]),
        ({"max_tokens": 16, "messages": [{"role": "assistant", "content": [{"type": "redacted_thinking", "data": "x"}]},
                                          {"role": "user", "content": "x"}]},
         "messages[0].content[0].type", ["redacted_thinking"]),
    ]
)


def test_bad_messages_requests_are_400s_in_anthropics_shape(handle):
    rollout = _rollout(handle)
    for body, param, words in BAD_MESSAGES:
        response = _post(handle, None, f"/rollouts/{rollout.rollout_id}/v1/messages", {"model": "m", **body},
                         **{"x-api-key": rollout.token})
        assert response.status_code == 400, response.text
        payload = response.json()
        assert payload["type"] == "error" and payload["error"]["type"] == "invalid_request_error"
        assert payload["error"]["param"] == param, payload
        for word in words:
            assert word in payload["error"]["message"], (word, payload)
        assert response.headers["x-should-retry"] == "false"
    assert not handle.store.get_rollout(rollout.rollout_id).turns  # nothing refused was recorded


def test_the_anthropic_sdk_reads_refusals_and_never_retries_them(handle):
    anthropic = pytest.importorskip("anthropic")
    rollout = _rollout(handle)
    client = anthropic.Anthropic(base_url=f"{handle.url}/rollouts/{rollout.rollout_id}", api_key="not-the-token")
    with pytest.raises(anthropic.PermissionDeniedError, match="token does not belong"):
        client.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}])
    sent: list[str] = []
    http = httpx.Client(event_hooks={"request": [lambda request: sent.append(request.url.path)]})
    good = anthropic.Anthropic(base_url=f"{handle.url}/rollouts/{rollout.rollout_id}", api_key=rollout.token,
                               max_retries=3, http_client=http)
    good.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": tasks(2)[1].prompt}])
    with pytest.raises(anthropic.BadRequestError, match="prefill"):
        good.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}])
    httpx.post(f"{handle.url}/rollouts/{rollout.rollout_id}/complete", json={"status": "completed"},
               headers={"authorization": f"Bearer {rollout.token}"}).raise_for_status()
    with pytest.raises(anthropic.ConflictError, match="has ended"):  # a 409, which the SDK retries unless told not to
        good.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}])
    assert len(sent) == 3  # one request per call: no retries
    unattributed = anthropic.Anthropic(base_url=handle.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.BadRequestError, match="no rollout named"):
        unattributed.messages.create(model="m", max_tokens=16, messages=[{"role": "user", "content": "x"}])


def test_the_event_streams_are_what_each_sdk_assembles(handle):
    openai = pytest.importorskip("openai")
    anthropic = pytest.importorskip("anthropic")
    r = _rollout(handle)
    oai = openai.OpenAI(base_url=f"{handle.url}/rollouts/{r.rollout_id}/v1", api_key=r.token, max_retries=0)
    with oai.responses.stream(model="m", input=tasks(2)[1].prompt, tools=RESPONSE_TOOLS) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    assert final.output[-1].name == "lookup" and final.output[-1].arguments == '{"key": "K01"}'
    raw = httpx.post(f"{handle.url}/rollouts/{r.rollout_id}/v1/responses", headers={"authorization": f"Bearer {r.token}"},
                     json={"input": "again", "stream": True, "previous_response_id": final.id,
                           "tools": RESPONSE_TOOLS}).text
    numbers = [int(line.split('"sequence_number":')[1].split(",")[0].rstrip("}")) for line in raw.splitlines() if line.startswith("data:")]
    assert numbers == list(range(len(numbers)))
    r2 = _rollout(handle, 2)
    ant = anthropic.Anthropic(base_url=f"{handle.url}/rollouts/{r2.rollout_id}", api_key=r2.token, max_retries=0)
    with ant.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": tasks(3)[2].prompt}],
                             tools=ANTHROPIC_TOOLS) as stream:
        kinds = [event.type for event in stream]
        message = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "input_json" in kinds
    assert message.stop_reason == "tool_use" and message.content[-1].input == {"key": "K02"}
    assert message.usage.output_tokens == len(handle.store.get_rollout(r2.rollout_id).turns[0].completion_ids)


def test_a_cut_completion_is_incomplete_and_max_tokens(served, tiny_tok):
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "word " * 50))
    r = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    cut = _post(handle, r, "/v1/responses", {"input": "q", "max_output_tokens": 4}).json()
    assert cut["status"] == "incomplete" and cut["incomplete_details"] == {"reason": "max_output_tokens"}
    events = _post(handle, r, "/v1/responses", {"input": "q", "max_output_tokens": 4, "stream": True}).text
    assert "event: response.incomplete" in events and "response.completed" not in events
    message = _post(handle, None, f"/rollouts/{r.rollout_id}/v1/messages",
                    {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "q"}]}, **{"x-api-key": r.token})
    assert message.json()["stop_reason"] == "max_tokens"
    stopped = _post(handle, None, f"/rollouts/{r.rollout_id}/v1/messages",
                    {"model": "m", "max_tokens": 64, "stop_sequences": ["zzz", " word"], "stream": True,
                     "messages": [{"role": "user", "content": "q"}]}, **{"x-api-key": r.token}).text
    assert '"stop_reason":"stop_sequence","stop_sequence":" word"' in stopped
    assert '"text_delta","text":"word"}' in stopped  # the text up to the stop sequence


def test_inference_mode_serves_both_protocols_with_the_api_key(served, tiny_tok):
    config = MtrlConfig.coerce({"advanced": {"server": {"inference_mode": True, "api_key": "sk-run"}}})
    handle = served(ScriptedEngine(tiny_tok, lambda request, prompt: "hello"), config)
    first = httpx.post(f"{handle.url}/v1/responses", json={"input": "hi"}, headers={"authorization": "Bearer sk-run"})
    assert first.status_code == 200 and first.json()["output"][0]["content"][0]["text"] == "hello"
    follow = httpx.post(f"{handle.url}/v1/responses", json={"input": "again", "previous_response_id": first.json()["id"]},
                        headers={"authorization": "Bearer sk-run"})
    assert follow.status_code == 200, follow.text
    refused = httpx.post(f"{handle.url}/v1/messages", json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
                         headers={"x-api-key": "wrong"})
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
    ok = httpx.post(f"{handle.url}/v1/messages", json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
                    headers={"x-api-key": "sk-run"})
    assert ok.status_code == 200 and ok.json()["content"] == [{"type": "text", "text": "hello"}]


def test_stored_responses_leave_with_their_rollouts(handle):
    """The history of previous_response_id is pruned of ended rollouts as it grows: memory stays bounded."""
    from mtrl_runtime.server.protocols._response_history import ResponseHistory

    live = {f"r{i}" for i in range(100)}
    history = ResponseHistory(lambda: live, per_rollout=3)
    for i in range(100):
        for j in range(5):
            history.put(f"r{i}", f"resp_{i}_{j}", ({"role": "user", "content": str(j)},))
    assert len(history) == 100 and history.get("r7", "resp_7_1") is None and history.get("r7", "resp_7_4")  # 3 kept
    live.clear()
    live.add("r99")  # the others ended; the next pruning (at twice the 64 held after the last) drops them
    sizes = []
    for i in range(100, 129):
        live.add(f"r{i}")
        history.put(f"r{i}", f"resp_{i}", ())
        sizes.append(len(history))
    assert max(sizes) == 128 and sizes[-1] == 30  # r99 and r100..r128 are live
    assert history.get("r99", "resp_99_4") and history.get("r5", "resp_5_4") is None
    assert history.get("r100", "resp_100") == ()
    history.put(None, "resp_inference", ())  # unattributed calls: their own bounded history
    assert history.get(None, "resp_inference") == () and history.get("r100", "resp_inference") is None


def test_max_output_tokens_above_the_cap_is_a_400_when_the_run_refuses_it(served, tiny_tok):
    config = MtrlConfig.from_dict({"advanced": {"server": {"max_tokens_over_cap": "refuse"}}})
    handle = served(ScriptedEngine(tiny_tok, policy), config)
    response = _post(handle, _rollout(handle), "/v1/responses", {"input": "x", "max_output_tokens": 10**6})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == "max_output_tokens"
    assert all(word in error["message"] for word in ("max_output_tokens", "1000000", "limit", "max_tokens_over_cap"))
