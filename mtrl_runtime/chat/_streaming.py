"""A completion's text while it is decoded: the content and reasoning that may be streamed so far.

``ReplyText`` takes a completion's ids as the engine samples them, decodes
them incrementally (only the last token's window is re-decoded, so a long
completion costs O(1) per token) and parses the text so far with the
format's own ``parse``, exactly as the whole completion will be parsed. What
it streams:

- reasoning, where the format marks it (``<think>``, ``[THINK]``, harmony's
  ``analysis`` channel), and content, each as long as the text so far parses
  to a longer version of what was already sent;
- nothing from the first of the format's ``call_openers`` (when the request
  has tools) or the first stop string on: the parsed calls go out at the end;
- never a tail that may still become such a marker, a tag (an unclosed
  ``<``/``[`` in the last 32 characters), an unclosed one of the format's
  ``held_headers`` (harmony's message headers), or trailing whitespace.

What to hold back is declared by each format (``ChatFormat.call_openers``,
``held_headers``), so a new format needs no edit here.

The message parsed from the whole completion stays the authority:
``remainder`` is what is left to send of it, and says whether what was
streamed is a prefix of it (a format whose parse of a partial text is not a
prefix of the final parse, such as a template that opened ``<think>`` in the
prompt, diverges; the caller counts it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ._template import ChatRenderer
from .formats import ChatFormat

_HELD_TAG_CHARS = 32  # an unclosed "<" or "[" this close to the end may be a tag being written
_BRACKETS = (("<", ">"), ("[", "]"))


@dataclass(frozen=True)
class TextDelta:
    """Text to send now: reasoning first (it was written first), then content."""

    content: str = ""
    reasoning: str = ""

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning)


class ReplyText:
    """The streamable content and reasoning of one completion (see the module docstring)."""

    def __init__(self, fmt: ChatFormat, renderer: ChatRenderer, prefix: str, calls: bool, stop: Sequence[str]) -> None:
        self._fmt = fmt
        self._renderer = renderer
        self._prefix = prefix  # a forced tool-call opener: prompt, but parsed with the completion
        self._calls = calls
        stops = tuple(s for s in stop if s)
        openers = tuple(o for o in fmt.call_openers if o) if calls else ()
        self._markers = stops + openers
        self._headers = fmt.held_headers
        self._ids: list[int] = []
        self._pending_eos: list[int] = []  # eos ids are decoded only when something follows them
        self._prefix_off = 0
        self._read_off = 0
        self._text = ""
        self._frozen = False  # a marker was seen: nothing more streams
        self.content = ""  # what was sent
        self.reasoning = ""
        self.diverged = False

    def feed(self, token_ids: Iterable[int]) -> TextDelta:
        """Take newly sampled ids; the text that may be sent now (empty when nothing new is safe)."""
        eos = self._renderer.eos_token_ids
        for token in token_ids:
            if token in eos:
                self._pending_eos.append(token)
                continue
            if self._pending_eos:
                self._ids.extend(self._pending_eos)
                self._pending_eos.clear()
            self._ids.append(token)
        self._detokenize()
        if self._frozen or self.diverged:
            return TextDelta()
        parsed = self._fmt.parse(self._visible(self._prefix + self._text), calls=self._calls)
        content = self._advance((parsed.content or "").rstrip(), self.content)
        reasoning = self._advance((parsed.reasoning or "").rstrip(), self.reasoning)
        if content is None or reasoning is None:
            self.diverged = True
            return TextDelta()
        self.content += content
        self.reasoning += reasoning
        return TextDelta(content, reasoning)

    def remainder(self, message: Mapping[str, Any]) -> tuple[TextDelta, bool]:
        """What is left to send of the final ``message``, and whether what was streamed is a prefix of it.

        When it is not, the rest of the diverged field is not sent (the client
        already holds other text; the stored turn is the ids either way).
        """
        final_content = message.get("content") or ""
        final_reasoning = message.get("reasoning_content") or ""
        content = self._advance(final_content, self.content)
        reasoning = self._advance(final_reasoning, self.reasoning)
        exact = content is not None and reasoning is not None
        return TextDelta(content or "", reasoning or ""), exact

    @staticmethod
    def _advance(now: str, sent: str) -> str | None:
        """What ``now`` adds to ``sent`` ("" when it is not longer), None when ``sent`` is not its prefix."""
        if now.startswith(sent):
            return now[len(sent):]
        if sent.startswith(now):  # a held-back tail shortened the text for now
            return ""
        return None

    def _detokenize(self) -> None:
        """Extend the text by the ids read since the last call (a partial UTF-8 character waits)."""
        if self._read_off == len(self._ids):
            return
        decode = self._renderer.decode
        before = decode(self._ids[self._prefix_off : self._read_off])
        after = decode(self._ids[self._prefix_off :])
        if after.endswith("\ufffd") or len(after) <= len(before):
            return
        self._text += after[len(before):]
        self._prefix_off, self._read_off = self._read_off, len(self._ids)

    def _visible(self, text: str) -> str:
        """``text`` up to the first marker, less a tail that may still become a marker or a tag."""
        cut = min((i for i in (text.find(m) for m in self._markers) if i >= 0), default=-1)
        if cut >= 0:
            self._frozen = True  # this call still streams what comes before the marker
            text = text[:cut]
        held = 0
        for marker in self._markers:
            for k in range(min(len(marker) - 1, len(text)), 0, -1):
                if text.endswith(marker[:k]):
                    held = max(held, k)
                    break
        for open_char, close_char in _BRACKETS:
            at = text.rfind(open_char)
            if at >= 0 and len(text) - at <= _HELD_TAG_CHARS and close_char not in text[at:]:
                held = max(held, len(text) - at)
        for opener, closer in self._headers:
            at = text.rfind(opener)
            if at >= 0 and closer not in text[at:]:
                held = max(held, len(text) - at)
        return text[: len(text) - held]


__all__ = ["ReplyText", "TextDelta"]
