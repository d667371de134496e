"""Real token streaming: SSE events leave as tokens are decoded, the turn recorded is the non-streamed one.

Real HTTP on loopback with the openai SDK's streaming client (and httpx for
the hang-up); the scripted engine with a per-token delay makes timing
deterministic; a tiny hf model checks greedy streams against whole answers.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import openai
import pytest

from mtrl_runtime.engines import ScriptedEngine, ScriptedReply
from mtrl_runtime.engines.hf import HFEngine
from mtrl_runtime.types import StreamingEngine, Task

TOOLS = [{
    "type": "function",
    "function": {"name": "lookup", "description": "Look a key up.",
                 "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}},
}]
LONG = "Sure, here is a longer answer with quite a few words in it, so that it takes many tokens to write out."


def _client(handle: Any, rollout: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{handle.url}/rollouts/{rollout.rollout_id}/v1", api_key=rollout.token, max_retries=0)


def _timed_stream(client: openai.OpenAI, **kwargs: Any) -> tuple[list[tuple[float, Any]], float]:
    """Every chunk with the seconds since the request was sent, and the total."""
    started = time.perf_counter()
    chunks = [(time.perf_counter() - started, c) for c in client.chat.completions.create(model="m", stream=True, **kwargs)]
    return chunks, time.perf_counter() - started


def test_the_engines_that_stream_declare_it(tiny_tok: Any) -> None:
    from mtrl_runtime.testing import tiny_model

    assert isinstance(ScriptedEngine(tiny_tok, ["x"]), StreamingEngine)
    assert isinstance(HFEngine.from_objects(tiny_model(tiny_tok), tiny_tok), StreamingEngine)


def test_the_first_delta_arrives_one_decode_step_after_the_call_not_after_the_whole_completion(served, tiny_tok) -> None:
    step = 0.05
    engine = ScriptedEngine(tiny_tok, lambda request, prompt: LONG, token_delay_s=step)
    n_tokens = len(tiny_tok.encode(LONG, add_special_tokens=False)) + 1
    handle = served(engine)
    client = _client(handle, handle.coordinator.create_rollout(Task(id="t", prompt="q")))

    started = time.perf_counter()  # the same reply not streamed (and the client warmed up): the whole answer at once
    reply = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "go"}])
    assert reply.choices[0].message.content == LONG and time.perf_counter() - started >= n_tokens * step

    chunks, total = _timed_stream(client, messages=[{"role": "user", "content": "go"}])
    content = [(t, c.choices[0].delta.content) for t, c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(text for _, text in content) == LONG
    assert total >= n_tokens * step  # the engine really took one step per token
    first, last = content[0][0], content[-1][0]
    # one decode step plus the endpoint's overhead, where the burst waited for all ~n_tokens steps
    assert first < step + 0.3 < total / 5, (first, total)
    assert len(content) >= n_tokens // 3  # deltas, not one burst
    assert last - first > (n_tokens - 8) * step  # they left while the reply was being generated


def test_streamed_and_whole_turns_store_the_same_ids_and_logprobs(served, tiny_tok) -> None:
    reply = ScriptedReply.tool_call("lookup", {"key": "A1"}, text="<think>plan it</think>Sure, I will look. ")
    engine = ScriptedEngine(tiny_tok, lambda request, prompt: reply, token_delay_s=0.002)
    handle = served(engine)
    streamed, whole = (handle.coordinator.create_rollout(Task(id="t", prompt="q")) for _ in range(2))
    messages = [{"role": "user", "content": "look A1 up"}]

    chunks, _ = _timed_stream(_client(handle, streamed), messages=messages, tools=TOOLS,
                              extra_body={"return_token_ids": True})
    answer = _client(handle, whole).chat.completions.create(model="m", messages=messages, tools=TOOLS)

    deltas = [c.choices[0].delta for _, c in chunks if c.choices]
    reasoning = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    calls = [tc for d in deltas for tc in d.tool_calls or []]
    assert reasoning == "plan it" == answer.choices[0].message.model_dump()["reasoning_content"]
    assert content == "Sure, I will look." == answer.choices[0].message.content
    assert "<" not in content  # no piece of a tag or of the call went out as content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [("lookup", {"key": "A1"})]
    assert chunks[-1][1].choices[0].finish_reason == "tool_calls"

    a, b = (handle.store.get_rollout(r.rollout_id).turns[0] for r in (streamed, whole))
    assert a.prompt_ids == b.prompt_ids and a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    assert a.completion_text == b.completion_text and a.reasoning == b.reasoning == "plan it"
    assert [c["function"]["name"] for c in a.tool_calls] == ["lookup"]
    assert chunks[-1][1].choices[0].model_dump()["token_ids"] == list(a.completion_ids)


@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7}], ids=["greedy", "seeded"])
def test_a_tiny_hf_model_streams_the_tokens_it_generates_whole(served, tiny_tok, sampling) -> None:
    from mtrl_runtime.testing import tiny_model

    handle = served(HFEngine.from_objects(tiny_model(tiny_tok), tiny_tok))
    streamed, whole = (handle.coordinator.create_rollout(Task(id="t", prompt="q")) for _ in range(2))
    ask = dict(messages=[{"role": "user", "content": "Say something."}], max_tokens=24, **sampling,
               extra_body={"return_token_ids": True})

    chunks, _ = _timed_stream(_client(handle, streamed), **ask)
    answer = _client(handle, whole).chat.completions.create(model="m", **ask)

    text_chunks = [c.choices[0].delta.content for _, c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(text_chunks) == (answer.choices[0].message.content or "")
    if sampling["temperature"] > 0:  # the random tiny model's greedy text is all newlines (held back to the end)
        assert len(text_chunks) > 1  # it arrived in pieces
    final = chunks[-1][1].choices[0].model_dump()
    assert final["token_ids"] == answer.choices[0].model_dump()["token_ids"]
    a, b = (handle.store.get_rollout(r.rollout_id).turns[0] for r in (streamed, whole))
    assert a.completion_ids == b.completion_ids and len(a.completion_ids) == 24
    assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)


def test_a_hang_up_mid_stream_stops_the_generation_and_keeps_the_committed_turns(served, tiny_tok) -> None:
    from mtrl_runtime.testing import tiny_model

    engine = HFEngine.from_objects(tiny_model(tiny_tok), tiny_tok)
    handle = served(engine)
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    client = _client(handle, rollout)
    first = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": first.choices[0].message.content},
               {"role": "user", "content": "go on"}]

    url = f"{handle.url}/rollouts/{rollout.rollout_id}/v1/chat/completions"
    body = {"model": "m", "messages": history, "max_tokens": 4000, "temperature": 0, "stream": True}
    with httpx.stream("POST", url, json=body, headers={"authorization": f"Bearer {rollout.token}"}, timeout=30) as r:
        assert r.status_code == 200
        next(r.iter_bytes())  # the first events: generation is under way; then hang up
    deadline = time.monotonic() + 10
    while handle.coordinator.counters["streams_closed"] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert handle.coordinator.counters["streams_closed"] == 1
    time.sleep(0.2)  # a step already running when the hang-up came may finish
    passes = engine.stats.decode_passes
    time.sleep(0.3)
    assert engine.stats.decode_passes == passes < 500  # the row left the batch long before its 4000 tokens
    assert engine.stats.generations == 1 and engine.stats.tokens < 4000 + 4  # only the first turn finished

    stored = handle.store.get_rollout(rollout.rollout_id)
    assert stored.status.value == "running" and [t.index for t in stored.turns] == [0]  # the committed turn stays
    again = client.chat.completions.create(model="m", messages=history, max_tokens=3)  # the agent may retry
    assert again.choices[0].finish_reason in {"stop", "length"}
    assert [t.index for t in handle.store.get_rollout(rollout.rollout_id).turns] == [0, 1]


def test_a_call_refused_or_failed_before_its_first_token_is_an_ordinary_error(served, tiny_tok) -> None:
    engine = ScriptedEngine(tiny_tok, [LONG, ScriptedReply.fail("boom")], token_delay_s=0.001)
    handle = served(engine)
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    client = _client(handle, rollout)
    with pytest.raises(openai.PermissionDeniedError):
        openai.OpenAI(base_url=f"{handle.url}/rollouts/{rollout.rollout_id}/v1", api_key="wrong", max_retries=0
                      ).chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
    with pytest.raises(openai.BadRequestError, match="tool_choice"):  # refused by the coordinator, before any event
        _timed_stream(client, messages=[{"role": "user", "content": "x"}], tool_choice="required")
    assert "".join(c.choices[0].delta.content or "" for _, c in _timed_stream(
        client, messages=[{"role": "user", "content": "x"}])[0] if c.choices) == LONG
    with pytest.raises(openai.APIStatusError, match="boom") as failed:  # the engine fails before its first token
        _timed_stream(client, messages=[{"role": "user", "content": "x"}])
    assert failed.value.status_code == 502
    assert [t.index for t in handle.store.get_rollout(rollout.rollout_id).turns] == [0]


def test_an_anthropic_messages_stream_leaves_as_tokens_are_decoded_and_records_the_same_turn(served, tiny_tok) -> None:
    anthropic = pytest.importorskip("anthropic")
    step = 0.04
    reply = ScriptedReply.tool_call("lookup", {"key": "A1"}, text="<think>plan it</think>" + LONG + " ")
    engine = ScriptedEngine(tiny_tok, lambda request, prompt: reply)  # the whole answer, to compare with: at once
    handle = served(engine)
    streamed, whole = (handle.coordinator.create_rollout(Task(id="t", prompt="q")) for _ in range(2))
    tools = [{"name": "lookup", "description": "Look a key up.",
              "input_schema": {"type": "object", "properties": {"key": {"type": "string"}}}}]
    ask = dict(model="m", max_tokens=400, messages=[{"role": "user", "content": "look A1 up"}], tools=tools)

    answer = anthropic.Anthropic(base_url=f"{handle.url}/rollouts/{whole.rollout_id}", api_key=whole.token,
                                 max_retries=0).messages.create(**ask)
    engine.token_delay_s = step  # the streamed call: one token every step
    client = anthropic.Anthropic(base_url=f"{handle.url}/rollouts/{streamed.rollout_id}", api_key=streamed.token,
                                 max_retries=0)
    started = time.perf_counter()
    times: dict[str, float] = {}
    with client.messages.stream(**ask) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                times.setdefault(event.delta.type, time.perf_counter() - started)
        message = stream.get_final_message()
    total = time.perf_counter() - started
    assert times["thinking_delta"] < 8 * step + 0.3 < total / 5  # "<think>" is 6 tokens of the tiny tokenizer
    assert times["text_delta"] < total / 2  # the text streamed long before the call closed the reply
    def blocks(content: list) -> list[tuple]:
        return [(b.type, getattr(b, "thinking", None), getattr(b, "signature", None), getattr(b, "text", None),
                 getattr(b, "name", None), getattr(b, "input", None)) for b in content]

    assert blocks(message.content) == blocks(answer.content)
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.stop_reason == "tool_use" and message.usage.input_tokens == answer.usage.input_tokens
    a, b = (handle.store.get_rollout(r.rollout_id).turns[0] for r in (streamed, whole))
    assert a.prompt_ids == b.prompt_ids and a.completion_ids == b.completion_ids and a.logprobs == b.logprobs


def test_a_responses_stream_leaves_as_tokens_are_decoded_and_records_the_same_turn(served, tiny_tok) -> None:
    step = 0.04
    reply = ScriptedReply.tool_call("lookup", {"key": "A1"}, text="<think>plan it</think>" + LONG + " ")
    engine = ScriptedEngine(tiny_tok, lambda request, prompt: reply)  # the whole answer, to compare with: at once
    handle = served(engine)
    streamed, whole = (handle.coordinator.create_rollout(Task(id="t", prompt="q")) for _ in range(2))
    tools = [{"type": "function", "name": "lookup", "description": "Look a key up.",
              "parameters": {"type": "object", "properties": {"key": {"type": "string"}}}}]
    answer = _client(handle, whole).responses.create(model="m", input="look A1 up", tools=tools)
    engine.token_delay_s = step  # the streamed call: one token every step

    started = time.perf_counter()
    times: dict[str, float] = {}
    with _client(handle, streamed).responses.stream(model="m", input="look A1 up", tools=tools) as stream:
        for event in stream:
            times.setdefault(event.type, time.perf_counter() - started)
        final = stream.get_final_response()
    total = time.perf_counter() - started
    assert times["response.reasoning_text.delta"] < 8 * step + 0.3 < total / 5
    assert times["response.output_text.delta"] < total / 2
    assert times["response.function_call_arguments.done"] > times["response.output_text.delta"]

    def items(response: Any) -> list[tuple]:
        return [(i.type, getattr(i, "name", None), getattr(i, "arguments", None),
                 [getattr(c, "text", None) for c in getattr(i, "content", None) or []]) for i in response.output]

    assert items(final) == items(answer)
    assert [i.type for i in final.output] == ["reasoning", "message", "function_call"]
    a, b = (handle.store.get_rollout(r.rollout_id).turns[0] for r in (streamed, whole))
    assert a.prompt_ids == b.prompt_ids and a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    engine.token_delay_s = 0
    follow = _client(handle, streamed).responses.create(  # the streamed response can be continued from
        model="m", previous_response_id=final.id, tools=tools,
        input=[{"type": "function_call_output", "call_id": final.output[2].call_id, "output": "42"}])
    assert follow.output and handle.store.count_turns(streamed.rollout_id) == 2


class _WholeOnly:
    """A PolicyEngine that is not a StreamingEngine (as vllm): the scripted engine's answers, whole."""

    name = "whole-only"

    def __init__(self, inner: ScriptedEngine) -> None:
        self.inner, self.tokenizer, self.policy_version, self.context_length = inner, inner.tokenizer, 0, None

    async def generate(self, request: Any) -> Any:
        return await self.inner.generate(request)

    async def load_adapter(self, path: str, version: int) -> None: ...

    async def close(self) -> None: ...


class _FailsMidStream(ScriptedEngine):
    """Streams three tokens of its reply, then fails as an engine can (a worker error, a lost server)."""

    async def generate_stream(self, request: Any) -> Any:
        sent = 0
        async for item in super().generate_stream(request):
            if sent == 3:
                raise RuntimeError("the decode step failed")
            yield item
            sent += 1


def test_an_engine_that_does_not_stream_answers_in_one_burst_with_the_same_events(served, tiny_tok) -> None:
    engine = _WholeOnly(ScriptedEngine(tiny_tok, lambda request, prompt: LONG, token_delay_s=0.01))
    assert not isinstance(engine, StreamingEngine)
    handle = served(engine)
    client = _client(handle, handle.coordinator.create_rollout(Task(id="t", prompt="q")))
    chunks, total = _timed_stream(client, messages=[{"role": "user", "content": "go"}])
    content = [(t, c.choices[0].delta.content) for t, c in chunks if c.choices and c.choices[0].delta.content]
    assert "".join(text for _, text in content) == LONG and len(content) == 1  # the burst: one content chunk
    assert chunks[-1][1].choices[0].finish_reason == "stop"


def test_an_engine_failure_after_the_first_tokens_is_an_error_event_and_records_nothing(served, tiny_tok) -> None:
    handle = served(_FailsMidStream(tiny_tok, lambda request, prompt: LONG, token_delay_s=0.01))
    rollout = handle.coordinator.create_rollout(Task(id="t", prompt="q"))
    received: list[str] = []
    with pytest.raises(openai.APIError, match="the policy engine failed"):
        for chunk in _client(handle, rollout).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "go"}], stream=True):
            received.append(chunk.choices[0].delta.content or "")
    assert "".join(received) and LONG.startswith("".join(received))  # the text before the failure had left
    assert handle.store.count_turns(rollout.rollout_id) == 0 and handle.coordinator.counters["engine_failures"] == 1
