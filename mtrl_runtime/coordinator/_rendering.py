"""A call's prompt built and its completion read, in the model family's chat format.

``CallRendering`` is the part of ``CallCapture`` that knows the chat
format: the prompt a call renders to (with the prefix a forced tool call
puts in front of the completion, and the reasoning block a prompt leaves
open), the decoder a streamed call's text goes through, and the assistant
message a completion's ids parse into. It records nothing; the counters it
keeps (forced prefixes aside: ``CallCapture`` counts those) are the
completions' reasoning tokens and malformed tool calls.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

from ..chat import ChatRenderer, PromptBuilder, PromptPlan, ReplyText
from ..chat.formats import ChatFormat, opened_reasoning
from ..types import Generation, SamplingParams
from ._counters import CoordinatorCounters
from ._stream import ChatStream

OPENER_TAIL_TOKENS = 8  # prompt ids decoded to find a reasoning opener at its end (Qwen3.5's "<think>\n": 2)
_OPENER_TAILS_KEPT = 256  # distinct prompt tails whose opener ``opened_reasoning`` remembers


class CallRendering:
    """Prompts and replies of one coordinator's calls, in ``chat_format`` over ``tokenizer``."""

    def __init__(self, tokenizer: Any, chat_format: ChatFormat, history_training: str,
                 counters: CoordinatorCounters) -> None:
        self.format = chat_format
        self.renderer = ChatRenderer(tokenizer, fallback=chat_format.template, stop_tokens=chat_format.stop_tokens,
                                     history_terminators=chat_format.history_terminators)
        self.builder = PromptBuilder(self.renderer, history_training)
        self.counters = counters
        self._openers: dict[tuple[int, ...], tuple[str, str] | None] = {}  # prompt tail ids -> the opener left open

    def plan(self, state: Any, messages: Sequence[Any], tools: list, options: Any) -> tuple[PromptPlan, str, bool]:
        """The turn's prompt, the text the reply is parsed after, and whether a tool call was forced.

        The forced prefix (the format's call opener, with the tool's name when
        one is named) is prompt, not completion: the model did not choose it,
        so it is not trained; the reply is parsed from prefix + completion.
        A prompt that opened the reply's reasoning (``ChatFormat.reasoning_openers``,
        Qwen3.5's ``<think>\\n``) is parsed with that opener in front too, and
        a forced call there first closes the block empty.
        """
        plan = self.builder.build(state, messages, tools, options.template_kwargs)
        opened = self.opened_reasoning(plan.prompt_ids)
        head = opened[0] if opened else ""
        if options.tool_choice == "auto" or not tools:
            return plan, head, False
        forced = (opened[1] if opened else "") + self.format.forced_prefix(
            options.tool_name if options.tool_choice == "function" else None)
        return replace(plan, prompt_ids=plan.prompt_ids + tuple(self.renderer.encode(forced))), head + forced, True

    def opened_reasoning(self, prompt_ids: Sequence[int]) -> tuple[str, str] | None:
        """The reasoning block a prompt ending in ``prompt_ids`` leaves open (``chat.formats.opened_reasoning`` of its
        last ids' text). Remembered by those ids: nearly every prompt ends in the same generation prompt, and
        decoding its tail cost a call about 20,000 instructions; a format with no openers decodes nothing."""
        if not self.format.reasoning_openers:
            return None
        tail = tuple(prompt_ids[-OPENER_TAIL_TOKENS:])
        if tail not in self._openers:
            if len(self._openers) >= _OPENER_TAILS_KEPT:  # bounded: a pathological run of distinct tails
                self._openers.clear()
            self._openers[tail] = opened_reasoning(self.format, self.renderer.decode(tail))
        return self._openers[tail]

    def streaming(
        self, stream: ChatStream | None, prefix: str, tools: list, sampling: SamplingParams, prompt_tokens: int
    ) -> ChatStream | None:
        """``stream``, started with the decoder of this call's completion (None for a call not streamed)."""
        if stream is not None:
            stream.begin(ReplyText(self.format, self.renderer, prefix, bool(tools), sampling.stop), prompt_tokens)
        return stream

    def reply(
        self, gen: Generation, tools: list, sampling: SamplingParams, prefix: str = ""
    ) -> tuple[str, dict[str, Any], str, int, int]:
        """Decode the completion into an OpenAI assistant message; also count malformed tool calls.

        Returns the text, the message, the finish reason, the malformed calls and the reasoning's tokens.
        """
        ids = list(gen.completion_ids)
        eos = self.renderer.eos_token_ids
        while ids and ids[-1] in eos:
            ids.pop()
        text = prefix + self.renderer.decode(ids)
        for stop in sampling.stop:
            cut = text.find(stop)
            if cut >= 0:
                text = text[:cut]
        parsed = self.format.parse(text, calls=bool(tools))  # never raises: malformed calls stay text
        message = parsed.to_message()
        finish = "tool_calls" if parsed.tool_calls else gen.finish_reason
        malformed = parsed.malformed
        reasoning_tokens = 0
        if parsed.reasoning:  # counted in the endpoint's metrics (tokens as the tokenizer splits the text)
            reasoning_tokens = len(self.renderer.encode(parsed.reasoning))
            self.counters.reasoning_replies += 1
            self.counters.reasoning_tokens += reasoning_tokens
        if tools:
            self.counters.malformed_tool_calls += malformed
            self.counters.malformed_by_format[self.format.name] += malformed
        return text, message, finish, malformed, reasoning_tokens


__all__ = ["OPENER_TAIL_TOKENS", "CallRendering"]
