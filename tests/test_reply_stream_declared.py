"""``chat.ReplyText`` holds back what the format declares (``call_openers``, ``held_headers``), nothing of its own.

A format written here (Hermes with one more call opener and one header
span of its own) streams through ``ReplyText`` with no edit to the streaming
code; the same text under plain Hermes streams those markers as text.
"""

from __future__ import annotations

from mtrl_runtime.chat import ChatRenderer, ReplyText
from mtrl_runtime.chat.formats import CHAT_FORMATS, ChatFormat
from mtrl_runtime.chat.formats.hermes import HermesFormat
from mtrl_runtime.testing_formats import family_tokenizer

TEXT = "The gauge reads {{meta: unit=psi}} forty two. @@call lookup A1"


class _DeclaringFormat(HermesFormat):
    name = "declaring"
    call_openers = (HermesFormat.tool_call_opener, "@@call")
    held_headers = (("{{meta", "}}"),)


def _stream(fmt: ChatFormat) -> tuple[list[str], str]:
    tokenizer = family_tokenizer("hermes")
    renderer = ChatRenderer(tokenizer, fallback=fmt.template, stop_tokens=fmt.stop_tokens)
    reply = ReplyText(fmt, renderer, "", True, ())
    sent: list[str] = []  # the content sent so far, after each token
    for token in renderer.encode(TEXT):
        reply.feed([token])
        sent.append(reply.content)
    return sent, reply.content


def test_a_format_declares_its_own_call_openers_and_held_headers() -> None:
    fmt = _DeclaringFormat()
    assert isinstance(fmt, ChatFormat)
    sent, content = _stream(fmt)
    assert content == "The gauge reads {{meta: unit=psi}} forty two."  # nothing from the declared opener on
    for text in sent:  # an opened header never went out unclosed
        assert "{{meta" not in text or "}}" in text[text.rfind("{{meta"):]
    assert any(text.endswith("The gauge reads") for text in sent)  # text before the header streamed on its own


def test_without_the_declarations_the_same_markers_stream_as_text() -> None:
    sent, content = _stream(CHAT_FORMATS.get("hermes"))
    assert "@@call lookup" in content
    assert any("{{meta: unit" in text and "}}" not in text for text in sent)  # the unclosed header went out
