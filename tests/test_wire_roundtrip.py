"""Each wire protocol's two directions undo each other (``mtrl_runtime/wires/<protocol>/``).

Requests: a native request read by the serving side (native -> chat messages,
tools, sampling, options), normalized as the coordinator normalizes every
call, and written by the calling side (chat -> native, what a reference
model or judge is sent) is the request we started from. Responses: a native
reply read by the calling side (native -> ``ReferenceReply``) and written by
the serving side (``ChatResult`` -> native) is the reply we started from;
streamed, its events read back as each protocol's SDK accumulates them give
that reply too.

Cases: plain text, tool calls, tool results (a failed one too), reasoning,
streaming, every tool choice a protocol has. Where a protocol cannot carry something both ways the test says
what and why ("within what the protocol allows"):

- reasoning sent back in a request: Anthropic's ``thinking`` and Bedrock's
  ``reasoningContent`` need the provider's signature, which chat messages do
  not carry, so the calling side leaves them out; OpenAI chat completions
  has no request field for it;
- a thinking block's signature is mtrl's fixed marker (mtrl signs nothing);
- several system or text blocks of one message are joined into one (the
  chat message they become holds one text);
- OpenAI chat completions and Responses have no failure flag on a tool
  result: its text is the result (``wires._shared``);
- Responses' ``instructions`` and leading system messages are one thing to
  the chat side (the system message), and a ``developer`` message is a
  ``system`` one (``chat.normalize_messages``);
- a ``none`` tool choice never reaches the calling side: the serving route
  drops the tools (``types.ChatOptions``), so a request without tools is what
  a reference is sent; the tool-choice maps carry ``none`` both ways.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

import orjson
import pytest

from mtrl_runtime.chat import TextDelta, normalize_messages
from mtrl_runtime.types import ChatResult, Generation, SamplingParams
from mtrl_runtime.wires import WIRES, ReferenceReply
from mtrl_runtime.wires import anthropic_messages as anthropic
from mtrl_runtime.wires import bedrock_converse as bedrock
from mtrl_runtime.wires import gemini
from mtrl_runtime.wires import openai_chat
from mtrl_runtime.wires import openai_responses as responses

SCHEMA = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}


def _result(reply: ReferenceReply, prompt_tokens: int, completion_ids: tuple[int, ...]) -> ChatResult:
    """The ``ChatResult`` a reply becomes on the serving side (ids: what the usage counts)."""
    generation = Generation(completion_ids, (0.0,) * len(completion_ids), reply.finish_reason)
    return ChatResult(reply.message, reply.finish_reason, tuple(range(prompt_tokens)), generation, reply.completion_text)


def _ids(n: int) -> tuple[int, ...]:
    return tuple(range(100, 100 + n))


def _deltas(message: dict[str, Any]) -> list[TextDelta]:
    """The message's reasoning and content as the decoder hands them over: in pieces, reasoning first."""
    reasoning, content = message.get("reasoning_content") or "", message.get("content") or ""
    pieces = [TextDelta(reasoning=reasoning[i:i + 5]) for i in range(0, len(reasoning), 5)]
    return pieces + [TextDelta(content=content[i:i + 4]) for i in range(0, len(content), 4)]


def _stream(events: Any, result: ChatResult) -> bytes:
    """One streamed answer's bytes, written as ``server._streaming.stream_answer`` writes them."""
    return (events.opening(len(result.prompt_ids)) + b"".join(events.text(d) for d in _deltas(result.message))
            + events.closing(result))


def _sse(raw: bytes) -> list[tuple[str | None, str]]:
    """``(event type, data)`` of each server-sent event."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        kind, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                kind = line.removeprefix("event: ")
            elif line.startswith("data: "):
                data.append(line.removeprefix("data: "))
        out.append((kind, "\n".join(data)))
    return out


def test_every_protocol_is_registered_once_with_its_request_schema():
    assert WIRES.names() == ["anthropic_messages", "bedrock_converse", "gemini", "openai_chat", "openai_responses"]
    for name in WIRES:
        wire = WIRES.get(name)
        assert wire.name == name and hasattr(wire.request, "model_validate")
    assert {WIRES.get(n).reference_name for n in WIRES if WIRES.get(n).calling} == {"openai", "responses", "anthropic",
                                                                                        "bedrock", "gemini"}


@pytest.mark.parametrize("wire, pairs", [
    (anthropic.FINISH, {"end_turn": "stop", "max_tokens": "length", "tool_use": "tool_calls", "refusal": "content_filter"}),
    (bedrock.FINISH, {"end_turn": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                      "content_filtered": "content_filter"}),
])
def test_a_finish_reason_map_is_read_and_written_from_one_table(wire, pairs):
    for native, chat in pairs.items():
        assert wire.to_chat(native) == chat and wire.to_native(chat) == native
    assert wire.to_chat("stop_sequence") == "stop"  # written back only when the request's stop sequence ended the turn
    assert wire.to_chat(None) == "stop" and wire.to_chat("new_reason", has_calls=True) == "tool_calls"
    assert wire.to_native("unheard_of") == "end_turn"


@pytest.mark.parametrize("choices, natives", [
    (openai_chat.TOOL_CHOICE, {"auto": "auto", "none": "none", "required": "required",
                               "function": {"type": "function", "function": {"name": "lookup"}}}),
    (responses.TOOL_CHOICE, {"auto": "auto", "none": "none", "required": "required",
                             "function": {"type": "function", "name": "lookup"}}),
    (anthropic.TOOL_CHOICE, {"auto": {"type": "auto"}, "none": {"type": "none"}, "required": {"type": "any"},
                             "function": {"type": "tool", "name": "lookup"}}),
    (bedrock.TOOL_CHOICE, {"auto": {"auto": {}}, "required": {"any": {}}, "function": {"tool": {"name": "lookup"}}}),
    (gemini.TOOL_CHOICE, {"auto": {"mode": "AUTO"}, "none": {"mode": "NONE"}, "required": {"mode": "ANY"},
                          "function": {"mode": "ANY", "allowedFunctionNames": ["lookup"]}}),
], ids=["openai_chat", "openai_responses", "anthropic_messages", "bedrock_converse", "gemini"])
def test_a_tool_choice_map_is_read_and_written_from_one_table(choices, natives):
    for chat, native in natives.items():
        name = "lookup" if chat == "function" else None
        assert choices.to_native(chat, name) == native
        assert choices.to_chat(copy.deepcopy(native)) == (chat, name)
    assert choices.to_chat(None) == ("auto", None)  # no tool choice sent: the model's choice
    for chat in {"auto", "none", "required", "function"} - set(natives):  # Converse has no "none"
        with pytest.raises(ValueError, match=repr(chat)):
            choices.to_native(chat)


def test_gemini_reads_any_of_several_functions_as_a_required_call_and_other_modes_as_auto():
    """ANY names the one function it allows, or several (the tools are narrowed to them, ``chat_tools``)."""
    assert gemini.TOOL_CHOICE.to_chat({"mode": "ANY", "allowedFunctionNames": ["a", "b"]}) == ("required", None)
    for auto in ({"mode": "VALIDATED"}, {"mode": "MODE_UNSPECIFIED"}, {"allowedFunctionNames": ["a"]},
                 {"mode": "AUTO", "allowedFunctionNames": ["a"]}):
        assert gemini.TOOL_CHOICE.to_chat(auto) == ("auto", None)


# -- OpenAI chat completions ---------------------------------------------------------------------

OPENAI_TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look up a record.",
                                                  "parameters": SCHEMA}}]


def _openai_call(arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": json.dumps(arguments)}}


OPENAI_REQUESTS = {
    "plain text": {"model": "ref", "messages": [{"role": "system", "content": "Answer briefly."},
                                                {"role": "user", "content": "Hi there."}],
                   "temperature": 0.5, "top_p": 0.9, "max_tokens": 64},
    "tool calls and results": {
        "model": "ref",
        "messages": [
            {"role": "user", "content": "Find N1 and N2."},
            {"role": "assistant", "content": None,
             "tool_calls": [_openai_call({"key": "N1"}, "call_1"), _openai_call({"key": "N2"}, "call_2")]},
            {"role": "tool", "tool_call_id": "call_1", "content": "N1: found"},
            {"role": "tool", "tool_call_id": "call_2", "content": "ConnectionError: the registry is down"},
        ],
        "temperature": 0.0, "top_p": 1.0, "max_tokens": 32, "seed": 7, "stop": ["END"], "tools": OPENAI_TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "lookup"}},
    },
    "tools, the model's choice": {"model": "ref", "messages": [{"role": "user", "content": "Look up N1."}],
                                  "temperature": 1.0, "top_p": 1.0, "max_tokens": 16, "tools": OPENAI_TOOLS,
                                  "tool_choice": "auto"},
    "a required call": {"model": "ref", "messages": [{"role": "user", "content": "Look up N1."}],
                        "temperature": 1.0, "top_p": 1.0, "max_tokens": 16, "tools": OPENAI_TOOLS,
                        "tool_choice": "required"},
}


def _openai_request_round_trip(original: dict[str, Any]) -> dict[str, Any]:
    body = openai_chat.ChatCompletionRequest.model_validate(original)  # serving: the body, as the route reads it
    messages = normalize_messages(original["messages"])  # the coordinator's canonical copies
    tools = [t.model_dump(exclude_none=True) for t in body.tools or ()]
    sampling = body.sampling(SamplingParams(), 4096)
    return openai_chat.WIRE.calling.request_body(original["model"], messages, tools, sampling, body.options())


@pytest.mark.parametrize("case", sorted(OPENAI_REQUESTS))
def test_openai_chat_requests_round_trip(case):
    original = OPENAI_REQUESTS[case]
    assert _openai_request_round_trip(copy.deepcopy(original)) == original


def test_openai_chat_request_reasoning_is_not_sent_back():
    """Chat completions has no request field for reasoning: the calling side sends the reply without it."""
    original = copy.deepcopy(OPENAI_REQUESTS["plain text"])
    original["messages"] += [{"role": "assistant", "content": "Hello.", "reasoning_content": "They greeted me."},
                             {"role": "user", "content": "Again."}]
    expected = copy.deepcopy(original)
    del expected["messages"][2]["reasoning_content"]
    assert _openai_request_round_trip(original) == expected


OPENAI_MESSAGES = {
    "plain text": ({"role": "assistant", "content": "Hello there."}, "stop"),
    "tool calls": ({"role": "assistant", "content": None,
                    "tool_calls": [_openai_call({"key": "N1"}, "call_1"), _openai_call({"key": "N2"}, "call_2")]},
                   "tool_calls"),
    "reasoning": ({"role": "assistant", "content": "It is 4.", "reasoning_content": "2 and 2 make 4."}, "stop"),
    "cut short": ({"role": "assistant", "content": "It is"}, "length"),
}


def _openai_response(case: str) -> dict[str, Any]:
    message, finish = OPENAI_MESSAGES[case]
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 1700000000, "model": "ref",
            "choices": [{"index": 0, "message": copy.deepcopy(message), "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 6, "total_tokens": 15}}


_PLAIN_CHAT_BODY = openai_chat.ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "x"}]})


@pytest.mark.parametrize("case", sorted(OPENAI_MESSAGES))
def test_openai_chat_responses_round_trip(case):
    original = _openai_response(case)
    result = _result(openai_chat.WIRE.calling.parse_reply(copy.deepcopy(original)), 9, _ids(6))
    written = orjson.loads(openai_chat.completion_json("chatcmpl-1", "ref", None, _PLAIN_CHAT_BODY, result))
    assert written == {**original, "created": written["created"]}


def _openai_accumulate(raw: bytes) -> dict[str, Any]:
    """A streamed completion read back as the OpenAI SDK's stream helper assembles it."""
    message: dict[str, Any] = {}
    finish = None
    events = [data for _, data in _sse(raw)]
    assert events[-1] == "[DONE]"
    for data in events[:-1]:
        chunk = json.loads(data)
        choice = chunk["choices"][0]
        delta = choice["delta"]
        for key in ("role",):
            if key in delta:
                message[key] = delta[key]
        for key in ("content", "reasoning_content"):
            if delta.get(key) is not None:
                message[key] = message.get(key, "") + delta[key]
        for call in delta.get("tool_calls") or ():
            calls = message.setdefault("tool_calls", [])
            index = call.pop("index")
            if index == len(calls):
                calls.append(call)
            else:
                calls[index]["function"]["arguments"] += call["function"]["arguments"]
        finish = choice["finish_reason"] or finish
    return {"message": message, "finish_reason": finish}


@pytest.mark.parametrize("case", sorted(OPENAI_MESSAGES))
def test_openai_chat_streams_round_trip(case):
    original = _openai_response(case)
    result = _result(openai_chat.WIRE.calling.parse_reply(copy.deepcopy(original)), 9, _ids(6))
    events = openai_chat.ChunkEvents("chatcmpl-1", "ref", None, _PLAIN_CHAT_BODY)
    streamed = _openai_accumulate(_stream(events, result))
    expected = original["choices"][0]["message"]
    # the stream opens with an empty content delta, as OpenAI's does: a reply of calls alone reads as ""
    assert streamed["message"] == {**expected, "content": expected["content"] or ""}
    assert streamed["finish_reason"] == original["choices"][0]["finish_reason"]


# -- Anthropic Messages --------------------------------------------------------------------------

ANTHROPIC_TOOLS = [{"name": "lookup", "description": "Look up a record.", "input_schema": SCHEMA}]

ANTHROPIC_REQUESTS = {
    "plain text": {"model": "claude-x", "max_tokens": 64, "temperature": 0.5,
                   "system": "Answer briefly.",
                   "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi there."}]}]},
    "tool calls and results, one failed": {
        "model": "claude-x", "max_tokens": 32, "temperature": 0.0, "top_p": 0.9, "stop_sequences": ["END"],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Find N1 and N2."}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Looking them up."},
                {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"key": "N1"}},
                {"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {"key": "N2"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "N1: found"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "ConnectionError: the registry is down",
                 "is_error": True}]},
        ],
        "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "any"},
    },
    "a named tool": {
        "model": "claude-x", "max_tokens": 16, "temperature": 1.0,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Look up N1."}]}],
        "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "tool", "name": "lookup"},
    },
    "tools, the model's choice": {
        "model": "claude-x", "max_tokens": 16, "temperature": 1.0,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Look up N1."}]}],
        "tools": ANTHROPIC_TOOLS, "tool_choice": {"type": "auto"},
    },
}


def _anthropic_request_round_trip(original: dict[str, Any]) -> dict[str, Any]:
    body = anthropic.MessagesRequest.model_validate(original)
    messages = normalize_messages(anthropic.chat_messages(body))
    tools = [t.chat_tool() for t in body.tools or ()]
    sampling = SamplingParams(temperature=body.temperature, top_p=body.top_p or 1.0, max_tokens=body.max_tokens,
                              stop=tuple(body.stop_sequences or ()))
    return anthropic.WIRE.calling.request_body(body.model, messages, tools, sampling, body.options())


@pytest.mark.parametrize("case", sorted(ANTHROPIC_REQUESTS))
def test_anthropic_messages_requests_round_trip(case):
    original = ANTHROPIC_REQUESTS[case]
    assert _anthropic_request_round_trip(copy.deepcopy(original)) == original


def test_anthropic_messages_failed_tool_result_keeps_its_flag_and_text_in_chat():
    body = anthropic.MessagesRequest.model_validate(ANTHROPIC_REQUESTS["tool calls and results, one failed"])
    failed = anthropic.chat_messages(body)[-1]
    assert failed == {"role": "tool", "tool_call_id": "toolu_2", "content": "ConnectionError: the registry is down",
                      "status": "error"}


def test_anthropic_messages_request_thinking_is_not_sent_back():
    """A thinking block needs its signature, which chat messages do not carry: the calling side leaves it out."""
    original = copy.deepcopy(ANTHROPIC_REQUESTS["plain text"])
    original["messages"] += [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "A greeting.", "signature": "sig"},
                                          {"type": "text", "text": "Hello."}]},
        {"role": "user", "content": [{"type": "text", "text": "Again."}]},
    ]
    expected = copy.deepcopy(original)
    expected["messages"][1]["content"] = [{"type": "text", "text": "Hello."}]
    assert _anthropic_request_round_trip(original) == expected


ANTHROPIC_CONTENT = {
    "plain text": ([{"type": "text", "text": "Hello there."}], "end_turn", None),
    "tool calls": ([{"type": "text", "text": "Looking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"key": "N1"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "lookup", "input": {"key": "N2"}}], "tool_use", None),
    "tool call alone": ([{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}], "tool_use", None),
    "reasoning": ([{"type": "thinking", "thinking": "2 and 2 make 4.", "signature": anthropic.SIGNATURE},
                   {"type": "text", "text": "It is 4."}], "end_turn", None),
    "stop sequence": ([{"type": "text", "text": "Done"}], "stop_sequence", "END"),
    "cut short": ([{"type": "text", "text": "It is"}], "max_tokens", None),
    "refusal": ([{"type": "text", "text": "I can't help with that."}], "refusal", None),
}


def _anthropic_response(case: str) -> dict[str, Any]:
    content, stop, sequence = ANTHROPIC_CONTENT[case]
    return {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x", "content": copy.deepcopy(content),
            "stop_reason": stop, "stop_sequence": sequence,
            "usage": {"input_tokens": 9, "output_tokens": 6, "cache_creation_input_tokens": 0,
                      "cache_read_input_tokens": 0}}


def _anthropic_result(original: dict[str, Any]) -> ChatResult:
    return _result(anthropic.WIRE.calling.parse_reply(copy.deepcopy(original)), 9, _ids(6))


@pytest.mark.parametrize("case", sorted(ANTHROPIC_CONTENT))
def test_anthropic_messages_responses_round_trip(case):
    original = _anthropic_response(case)
    written = anthropic.message_object("msg_1", "claude-x", _anthropic_result(original), original["stop_sequence"])
    assert written == original


def _anthropic_accumulate(raw: bytes) -> dict[str, Any]:
    """A streamed message read back as the Anthropic SDK's ``MessageStream`` accumulates it."""
    message: dict[str, Any] = {}
    partial: dict[int, str] = {}
    for kind, data in _sse(raw):
        event = json.loads(data)
        assert event["type"] == kind
        if kind == "message_start":
            message = event["message"]
        elif kind == "content_block_start":
            assert event["index"] == len(message["content"])
            message["content"].append(event["content_block"])
        elif kind == "content_block_delta":
            block, delta = message["content"][event["index"]], event["delta"]
            if delta["type"] == "text_delta":
                block["text"] += delta["text"]
            elif delta["type"] == "thinking_delta":
                block["thinking"] += delta["thinking"]
            elif delta["type"] == "signature_delta":
                block["signature"] = delta["signature"]
            else:
                assert delta["type"] == "input_json_delta"
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
        elif kind == "content_block_stop":
            if event["index"] in partial:
                message["content"][event["index"]]["input"] = json.loads(partial.pop(event["index"]))
        elif kind == "message_delta":
            message.update(event["delta"])
            message["usage"].update(event["usage"])
        else:
            assert kind == "message_stop"
    return message


@pytest.mark.parametrize("case", sorted(ANTHROPIC_CONTENT))
def test_anthropic_messages_streams_round_trip(case):
    original = _anthropic_response(case)

    def finish(result: ChatResult) -> dict[str, Any]:
        return anthropic.message_object("msg_1", "claude-x", result, original["stop_sequence"])

    raw = _stream(anthropic.MessagesEvents("msg_1", "claude-x", finish), _anthropic_result(original))
    assert _anthropic_accumulate(raw) == original


# -- Bedrock Converse ----------------------------------------------------------------------------

BEDROCK_TOOLS = {"tools": [{"toolSpec": {"name": "lookup", "description": "Look up a record.",
                                         "inputSchema": {"json": SCHEMA}}}]}

BEDROCK_REQUESTS = {
    "plain text": {"system": [{"text": "Answer briefly."}],
                   "messages": [{"role": "user", "content": [{"text": "Hi there."}]}],
                   "inferenceConfig": {"maxTokens": 64, "temperature": 0.5}},
    "tool calls and results, one failed": {
        "messages": [
            {"role": "user", "content": [{"text": "Find N1 and N2."}]},
            {"role": "assistant", "content": [
                {"text": "Looking them up."},
                {"toolUse": {"toolUseId": "tooluse_1", "name": "lookup", "input": {"key": "N1"}}},
                {"toolUse": {"toolUseId": "tooluse_2", "name": "lookup", "input": {"key": "N2"}}}]},
            {"role": "user", "content": [
                {"toolResult": {"toolUseId": "tooluse_1", "content": [{"text": "N1: found"}]}},
                {"toolResult": {"toolUseId": "tooluse_2", "content": [{"text": "ConnectionError: the registry is down"}],
                                "status": "error"}}]},
        ],
        "inferenceConfig": {"maxTokens": 32, "temperature": 0.0, "topP": 0.9, "stopSequences": ["END"]},
        "toolConfig": {**BEDROCK_TOOLS, "toolChoice": {"any": {}}},
    },
    "a named tool": {
        "messages": [{"role": "user", "content": [{"text": "Look up N1."}]}],
        "inferenceConfig": {"maxTokens": 16, "temperature": 1.0},
        "toolConfig": {**BEDROCK_TOOLS, "toolChoice": {"tool": {"name": "lookup"}}},
    },
    "tools, the model's choice": {
        "messages": [{"role": "user", "content": [{"text": "Look up N1."}]}],
        "inferenceConfig": {"maxTokens": 16, "temperature": 1.0},
        "toolConfig": {**BEDROCK_TOOLS, "toolChoice": {"auto": {}}},
    },
}


def _bedrock_request_round_trip(original: dict[str, Any]) -> dict[str, Any]:
    body = bedrock.ConverseRequest.model_validate(original)
    messages = normalize_messages(bedrock.chat_messages(body))
    tools, options = bedrock.chat_tools(body)
    config = body.inferenceConfig
    sampling = SamplingParams(temperature=config.temperature, top_p=config.topP or 1.0, max_tokens=config.maxTokens,
                              stop=tuple(config.stopSequences or ()))
    return bedrock.WIRE.calling.request_body("model-x", messages, tools or [], sampling, options)


@pytest.mark.parametrize("case", sorted(BEDROCK_REQUESTS))
def test_bedrock_converse_requests_round_trip(case):
    original = BEDROCK_REQUESTS[case]
    assert _bedrock_request_round_trip(copy.deepcopy(original)) == original


def test_bedrock_converse_failed_tool_result_keeps_its_flag_and_text_in_chat():
    body = bedrock.ConverseRequest.model_validate(BEDROCK_REQUESTS["tool calls and results, one failed"])
    failed = bedrock.chat_messages(body)[-1]
    assert failed == {"role": "tool", "tool_call_id": "tooluse_2", "content": "ConnectionError: the registry is down",
                      "name": "lookup", "status": "error"}


def test_bedrock_converse_request_reasoning_is_not_sent_back():
    """``reasoningContent`` needs its signature, which chat messages do not carry: the calling side leaves it out."""
    original = copy.deepcopy(BEDROCK_REQUESTS["plain text"])
    original["messages"] += [
        {"role": "assistant", "content": [{"reasoningContent": {"reasoningText": {"text": "A greeting."}}},
                                          {"text": "Hello."}]},
        {"role": "user", "content": [{"text": "Again."}]},
    ]
    expected = copy.deepcopy(original)
    expected["messages"][1]["content"] = [{"text": "Hello."}]
    assert _bedrock_request_round_trip(original) == expected


BEDROCK_CONTENT = {
    "plain text": ([{"text": "Hello there."}], "end_turn"),
    "tool calls": ([{"text": "Looking."},
                    {"toolUse": {"toolUseId": "tooluse_1", "name": "lookup", "input": {"key": "N1"}}},
                    {"toolUse": {"toolUseId": "tooluse_2", "name": "lookup", "input": {"key": "N2"}}}], "tool_use"),
    "tool call alone": ([{"toolUse": {"toolUseId": "tooluse_1", "name": "lookup", "input": {}}}], "tool_use"),
    "reasoning": ([{"reasoningContent": {"reasoningText": {"text": "2 and 2 make 4."}}}, {"text": "It is 4."}],
                  "end_turn"),
    "cut short": ([{"text": "It is"}], "max_tokens"),
    "filtered": ([{"text": "I can't help with that."}], "content_filtered"),
}
_NO_STOPS = bedrock.ConverseRequest.model_validate({"messages": [{"role": "user", "content": [{"text": "x"}]}]})


def _bedrock_response(case: str) -> dict[str, Any]:
    content, stop = BEDROCK_CONTENT[case]
    return {"output": {"message": {"role": "assistant", "content": copy.deepcopy(content)}}, "stopReason": stop,
            "usage": {"inputTokens": 9, "outputTokens": 6, "totalTokens": 15}, "metrics": {"latencyMs": 120}}


def _bedrock_result(original: dict[str, Any]) -> ChatResult:
    return _result(bedrock.WIRE.calling.parse_reply(copy.deepcopy(original)), 9, _ids(6))


@pytest.mark.parametrize("case", sorted(BEDROCK_CONTENT))
def test_bedrock_converse_responses_round_trip(case):
    original = _bedrock_response(case)
    result = _bedrock_result(original)
    written = bedrock.converse_json(result, bedrock.stop_reason(result, _NO_STOPS, None), 120)
    assert orjson.loads(written) == original


def test_bedrock_converse_stop_sequence_round_trips(tiny_tok):
    """``stop_sequence`` is read as ``stop`` and written back when the request's stop sequence is in the text."""
    original = {"output": {"message": {"role": "assistant", "content": [{"text": "Done END"}]}},
                "stopReason": "stop_sequence", "metrics": {"latencyMs": 5}}
    reply = bedrock.WIRE.calling.parse_reply(copy.deepcopy(original))
    ids = tuple(tiny_tok.encode("Done END", add_special_tokens=False))
    result = _result(reply, 3, ids)
    stops = bedrock.ConverseRequest.model_validate({**_NO_STOPS.model_dump(exclude_none=True),
                                                    "inferenceConfig": {"stopSequences": ["END"]}})
    written = orjson.loads(bedrock.converse_json(result, bedrock.stop_reason(result, stops, tiny_tok), 5))
    assert written == {**original, "usage": {"inputTokens": 3, "outputTokens": len(ids), "totalTokens": 3 + len(ids)}}


def _bedrock_accumulate(raw: bytes) -> dict[str, Any]:
    """A converse-stream answer read back with botocore's event-stream parser, as boto3's stream is assembled."""
    from botocore.eventstream import EventStreamBuffer

    buffer = EventStreamBuffer()
    buffer.add_data(raw)
    content: list[dict[str, Any]] = []
    response: dict[str, Any] = {}
    open_index = None
    for message in buffer:
        headers = message.headers
        assert headers[":message-type"] == "event"
        kind, event = headers[":event-type"], json.loads(message.payload)
        if kind == "messageStart":
            response["role"] = event["role"]
        elif kind == "contentBlockStart":
            assert event["contentBlockIndex"] == len(content)
            content.append({"toolUse": {**event["start"]["toolUse"], "input": ""}})
        elif kind == "contentBlockDelta":
            index, delta = event["contentBlockIndex"], event["delta"]
            if index == len(content):
                content.append({"reasoningContent": {"reasoningText": {"text": ""}}} if "reasoningContent" in delta
                               else {"text": ""})
            block = content[index]
            if "text" in delta:
                block["text"] += delta["text"]
            elif "reasoningContent" in delta:
                block["reasoningContent"]["reasoningText"]["text"] += delta["reasoningContent"]["text"]
            else:
                block["toolUse"]["input"] += delta["toolUse"]["input"]
            open_index = index
        elif kind == "contentBlockStop":
            block = content[event["contentBlockIndex"]]
            if "toolUse" in block:
                block["toolUse"]["input"] = json.loads(block["toolUse"]["input"])
            open_index = None
        elif kind == "messageStop":
            response["stopReason"] = event["stopReason"]
        else:
            assert kind == "metadata"
            response["usage"], response["metrics"] = event["usage"], event["metrics"]
    assert open_index is None
    return {"output": {"message": {"role": response["role"], "content": content}}, "stopReason": response["stopReason"],
            "usage": response["usage"], "metrics": response["metrics"]}


@pytest.mark.parametrize("case", sorted(BEDROCK_CONTENT))
def test_bedrock_converse_streams_round_trip(case):
    original = _bedrock_response(case)
    result = _bedrock_result(original)
    stop: Callable[[ChatResult], str] = lambda r: bedrock.stop_reason(r, _NO_STOPS, None)  # noqa: E731
    streamed = _bedrock_accumulate(_stream(bedrock.ConverseEvents(stop, 0.0), result))
    assert streamed == {**original, "metrics": streamed["metrics"]}  # the latency is the stream's own


# -- OpenAI Responses ----------------------------------------------------------------------------

RESPONSES_TOOLS = [{"type": "function", "name": "lookup", "description": "Look up a record.", "parameters": SCHEMA}]


def _function_call(arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": "lookup", "arguments": json.dumps(arguments)}


RESPONSES_REQUESTS = {
    "plain text": {"model": "ref", "input": [{"type": "message", "role": "user", "content": "Hi there."}],
                   "max_output_tokens": 64, "temperature": 0.5, "top_p": 1.0, "store": False,
                   "instructions": "Answer briefly."},
    "tool calls and results": {
        "model": "ref",
        "input": [
            {"type": "message", "role": "user", "content": "Find N1 and N2."},
            {"type": "message", "role": "assistant", "content": "Looking them up."},
            _function_call({"key": "N1"}, "call_1"), _function_call({"key": "N2"}, "call_2"),
            {"type": "function_call_output", "call_id": "call_1", "output": "N1: found"},
            {"type": "function_call_output", "call_id": "call_2", "output": "ConnectionError: the registry is down"},
            {"type": "message", "role": "system", "content": "Be brief."},
        ],
        "max_output_tokens": 32, "temperature": 0.0, "top_p": 0.9, "store": False,
        "tools": RESPONSES_TOOLS, "tool_choice": "required",
    },
    "a named tool": {"model": "ref", "input": [{"type": "message", "role": "user", "content": "Look up N1."}],
                     "max_output_tokens": 16, "temperature": 1.0, "top_p": 1.0, "store": False,
                     "tools": RESPONSES_TOOLS, "tool_choice": {"type": "function", "name": "lookup"}},
    "a namespace tool and its call": {
        "model": "ref",
        "input": [{"type": "message", "role": "user", "content": "Ask the helper."},
                  {"type": "function_call", "call_id": "call_1", "namespace": "agents", "name": "spawn",
                   "arguments": json.dumps({"task": "N1"})},
                  {"type": "function_call_output", "call_id": "call_1", "output": "spawned"}],
        "max_output_tokens": 16, "temperature": 1.0, "top_p": 1.0, "store": False,
        "tools": [*RESPONSES_TOOLS, {"type": "namespace", "name": "agents", "tools": [
            {"type": "function", "name": "spawn", "description": "Start a helper.", "parameters": SCHEMA},
            {"type": "function", "name": "wait", "parameters": {"type": "object", "properties": {}}}]}],
        "tool_choice": "auto",
    },
}


def _responses_request_round_trip(original: dict[str, Any]) -> dict[str, Any]:
    body = responses.ResponsesRequest.model_validate(original)
    system = [{"role": "system", "content": body.instructions}] if body.instructions else []
    messages = normalize_messages(system + responses.input_messages(body.input))
    tools = body.chat_tools() or []
    sampling = SamplingParams(temperature=body.temperature, top_p=body.top_p, max_tokens=body.max_output_tokens)
    return responses.WIRE.calling.request_body(body.model, messages, tools, sampling, body.options())


@pytest.mark.parametrize("case", sorted(RESPONSES_REQUESTS))
def test_openai_responses_requests_round_trip(case):
    original = RESPONSES_REQUESTS[case]
    assert _responses_request_round_trip(copy.deepcopy(original)) == original


def test_openai_responses_request_reasoning_is_not_sent_back():
    """A reasoning item needs its id and encrypted content, which chat messages do not keep: left out."""
    original = copy.deepcopy(RESPONSES_REQUESTS["plain text"])
    original["input"] += [
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "A greeting."}]},
        {"type": "message", "role": "assistant", "content": "Hello."},
        {"type": "message", "role": "user", "content": "Again."},
    ]
    expected = copy.deepcopy(original)
    del expected["input"][1]
    assert _responses_request_round_trip(original) == expected


def test_openai_responses_instructions_are_the_system_messages_before_the_first_item():
    """The calling side's ``instructions``: the system messages before the first input item, joined by a blank
    line, empty ones left out; an assistant turn with neither text nor calls writes no item, so a system message
    after it is still one of them; one after an item stays an input message."""
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "system", "content": ""},
                {"role": "assistant", "content": None}, {"role": "system", "content": "Use the tools."},
                {"role": "user", "content": "Hi."}, {"role": "system", "content": "Be polite."}]
    body = responses.WIRE.calling.request_body("ref", messages, [], SamplingParams(), responses.TOOL_CHOICE.options(None))
    assert body["instructions"] == "Answer briefly.\n\nUse the tools."
    assert body["input"] == [{"type": "message", "role": "user", "content": "Hi."},
                             {"type": "message", "role": "system", "content": "Be polite."}]
    empty = responses.WIRE.calling.request_body("ref", [{"role": "system", "content": ""}, *messages[4:5]], [],
                                                SamplingParams(), responses.TOOL_CHOICE.options(None))
    assert "instructions" not in empty


def _message_item(text: str) -> dict[str, Any]:
    return {"type": "message", "id": "msg_abc", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def _call_item(i: int, arguments: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {**_function_call(arguments, call_id), "id": f"fc_abc_{i}", "status": "completed"}


RESPONSES_OUTPUT = {
    "plain text": ([_message_item("Hello there.")], None),
    "tool calls": ([_message_item("Looking."), _call_item(0, {"key": "N1"}, "call_1"),
                    _call_item(1, {"key": "N2"}, "call_2")], None),
    "tool call alone": ([_call_item(0, {}, "call_1")], None),
    "a namespace's call": ([{**_call_item(0, {"task": "N1"}, "call_1"), "namespace": "agents", "name": "spawn"}], None),
    "reasoning": ([{"type": "reasoning", "id": "rs_abc", "summary": [],
                    "content": [{"type": "reasoning_text", "text": "2 and 2 make 4."}], "status": "completed"},
                   _message_item("It is 4.")], None),
    "cut short": ([_message_item("It is")], "max_output_tokens"),
    "filtered": ([_message_item("I can't")], "content_filter"),
}
_PLAIN_RESPONSES_BODY = responses.ResponsesRequest.model_validate({"input": "x"})


def _responses_response(case: str) -> dict[str, Any]:
    output, incomplete = RESPONSES_OUTPUT[case]
    return {
        "id": "resp_abc", "object": "response", "created_at": 1700000000,
        "status": "incomplete" if incomplete else "completed", "background": False, "error": None,
        "incomplete_details": {"reason": incomplete} if incomplete else None, "instructions": None,
        "max_output_tokens": None, "metadata": {}, "model": "ref", "output": copy.deepcopy(output),
        "parallel_tool_calls": True, "previous_response_id": None, "reasoning": {"effort": None, "summary": None},
        "store": True, "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto", "tools": [],
        "top_p": 1.0, "truncation": "disabled",
        "usage": {"input_tokens": 9, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 6,
                  "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 15},
        "user": None,
    }


def _responses_written(result: ChatResult) -> dict[str, Any]:
    return responses.response_object("resp_abc", "ref", _PLAIN_RESPONSES_BODY, SamplingParams(), result, True, [], 2)


@pytest.mark.parametrize("case", sorted(RESPONSES_OUTPUT))
def test_openai_responses_responses_round_trip(case):
    original = _responses_response(case)
    result = _result(responses.WIRE.calling.parse_reply(copy.deepcopy(original)), 9, _ids(6))
    written = _responses_written(result)
    assert written == {**original, "created_at": written["created_at"]}


def _responses_accumulate(raw: bytes) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A streamed response's output items rebuilt from its events, as the OpenAI SDK's stream does, and the
    response its last event carries."""
    items: list[dict[str, Any]] = []
    final: dict[str, Any] = {}
    for number, (kind, data) in enumerate(_sse(raw)):
        event = json.loads(data)
        assert event["type"] == kind and event["sequence_number"] == number
        if kind == "response.output_item.added":
            assert event["output_index"] == len(items)
            items.append(event["item"])
        elif kind == "response.content_part.added":
            items[event["output_index"]]["content"].append(event["part"])
        elif kind == "response.output_text.delta":
            items[event["output_index"]]["content"][event["content_index"]]["text"] += event["delta"]
        elif kind == "response.reasoning_text.delta":
            item = items[event["output_index"]]
            if not item["content"]:
                item["content"].append({"type": "reasoning_text", "text": ""})
            item["content"][event["content_index"]]["text"] += event["delta"]
        elif kind == "response.function_call_arguments.delta":
            items[event["output_index"]]["arguments"] += event["delta"]
        elif kind == "response.output_item.done":
            item = items[event["output_index"]]
            item["status"] = event["item"]["status"]
            assert item == event["item"], (item, event["item"])  # the deltas spelled the finished item
        elif kind in ("response.completed", "response.incomplete"):
            final = event["response"]
    return items, final


@pytest.mark.parametrize("case", sorted(RESPONSES_OUTPUT))
def test_openai_responses_streams_round_trip(case):
    original = _responses_response(case)
    result = _result(responses.WIRE.calling.parse_reply(copy.deepcopy(original)), 9, _ids(6))
    none = ChatResult({"role": "assistant", "content": None}, "stop", (), Generation((), (), "stop"), "")
    pending = {**_responses_written(none), "status": "in_progress", "output": [], "usage": None,
               "incomplete_details": None}
    items, final = _responses_accumulate(_stream(responses.ResponsesEvents(pending, _responses_written), result))
    assert items == original["output"]
    assert final == {**original, "created_at": final["created_at"]}


# -- Gemini (the conversation's round trip: test_protocol_gemini) ---------------------------------

GEMINI_TOOLS = [{"functionDeclarations": [{"name": "lookup", "description": "Look up a record.",
                                           "parametersJsonSchema": SCHEMA}]}]


def _gemini_request(**fields: Any) -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [{"text": "Look up N1."}]}],
            "generationConfig": {"maxOutputTokens": 16, "temperature": 1.0}, "tools": GEMINI_TOOLS, **fields}


GEMINI_REQUESTS = {  # the model's choice is Gemini's default: no toolConfig
    "tools, the model's choice": _gemini_request(),
    "a required call": _gemini_request(toolConfig={"functionCallingConfig": {"mode": "ANY"}}),
    "a named tool": _gemini_request(toolConfig={"functionCallingConfig": {"mode": "ANY",
                                                                          "allowedFunctionNames": ["lookup"]}}),
}


@pytest.mark.parametrize("case", sorted(GEMINI_REQUESTS))
def test_gemini_tool_choices_round_trip(case):
    original = GEMINI_REQUESTS[case]
    body = gemini.GenerateContentRequest.model_validate(copy.deepcopy(original))
    messages = normalize_messages(gemini.chat_messages(body))
    config = body.config
    sampling = SamplingParams(temperature=config.temperature, top_p=config.topP or 1.0,
                              max_tokens=config.maxOutputTokens)
    sent = gemini.WIRE.calling.request_body("gemini-x", messages, body.chat_tools() or [], sampling, body.options())
    assert sent == original
