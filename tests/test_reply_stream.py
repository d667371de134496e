"""``chat.ReplyText`` on every chat format: what streams is a prefix of the final parse, and no markup leaks.

Each family's tiny tokenizer (``testing_formats``) encodes the text its
model writes (an answer after reasoning; content then a tool call); the ids
are fed one at a time, as an engine samples them.
"""

from __future__ import annotations

import pytest

from mtrl_runtime.chat import ChatRenderer, ReplyText
from mtrl_runtime.chat.formats import CHAT_FORMATS, opened_reasoning
from mtrl_runtime.testing_formats import FAMILY_TOKENS, answer_text, call_text, family_tokenizer

CONTENT = "The gauge reads forty two, which is inside the limits we were given."
REASONING = "First check the manual, then compare the reading."


def _stream(name: str, text: str, calls: bool) -> tuple[list, dict, ReplyText, list[int]]:
    tokenizer = family_tokenizer(name)
    fmt = CHAT_FORMATS.get(name)
    renderer = ChatRenderer(tokenizer, fallback=fmt.template, stop_tokens=fmt.stop_tokens)
    ids = renderer.encode(text) + [tokenizer.eos_token_id]
    # a generation prompt that opened the reply's reasoning (Qwen3.5's "<think>\n") is parsed with it, as the capture does
    opened = opened_reasoning(fmt, renderer.render([{"role": "user", "content": "hi"}], None, True))
    prefix = opened[0] if opened else ""
    reply = ReplyText(fmt, renderer, prefix, calls, ())
    deltas = [reply.feed([token]) for token in ids]
    final = fmt.parse(prefix + renderer.decode(ids[:-1]), calls=calls).to_message()  # as the capture parses it
    return deltas, final, reply, ids


@pytest.mark.parametrize("name", sorted(FAMILY_TOKENS))
def test_an_answer_after_reasoning_streams_both_and_ends_exactly_on_the_final_parse(name: str) -> None:
    deltas, final, reply, ids = _stream(name, answer_text(name, CONTENT, REASONING), calls=False)
    rest, exact = reply.remainder(final)
    assert exact
    assert "".join(d.content for d in deltas) + rest.content == final["content"] == CONTENT
    assert "".join(d.reasoning for d in deltas) + rest.reasoning == (final.get("reasoning_content") or "")
    streamed = [d for d in deltas if d]
    assert len(streamed) > len(ids) // 4  # token by token, not at the end
    assert len(rest.content) <= 1  # everything but a held-back tail had been sent
    for d in streamed:  # no markup of the format went out as text
        assert not any(marker in d.content + d.reasoning for marker in ("<|", "[THINK", "[/THINK", "<think", "</think"))


@pytest.mark.parametrize("name", sorted(FAMILY_TOKENS))
def test_content_before_a_tool_call_streams_and_the_call_text_never_does(name: str) -> None:
    deltas, final, reply, _ = _stream(name, call_text(name, [("lookup", {"key": "A1"})], CONTENT), calls=True)
    fmt = CHAT_FORMATS.get(name)
    streamed = "".join(d.content for d in deltas)
    assert fmt.tool_call_opener not in streamed and "lookup" not in streamed and "A1" not in streamed
    assert [c["function"]["name"] for c in final["tool_calls"]] == ["lookup"]
    rest, exact = reply.remainder(final)
    assert exact and streamed + rest.content == (final["content"] or "")
    if final["content"]:  # the families that write content before a call stream it before the call ends
        assert streamed and final["content"].startswith(streamed)
