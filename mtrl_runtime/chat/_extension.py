"""Token-in-token-out prompts with sequence extension.

A rollout's new request usually repeats the previous request, adds the reply
the endpoint sent, and appends new messages (tool results, a user turn). Then
the new prompt ids are the previous prompt ids + the previous completion ids
(exactly what the engine saw and sampled) + the ids of the text that closes
the reply and renders the new messages. The text is found by rendering the
conversation twice, with and without the new messages, and taking the
difference; only that difference is tokenized. Anything else starts a new
segment with a full render and a ``BreakReason`` saying why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from ..types import BreakReason
from ._messages import message_key, normalize_messages, normalize_tools
from ._template import ChatRenderer


@dataclass(frozen=True)
class ConversationState:
    """What one rollout's last turn leaves for the next: its request, its reply, and the ids the engine saw.

    ``context_ids`` is the last turn's prompt ids + completion ids; ``glue``
    is the text that still closes the reply's assistant turn and ``closes``
    the texts a rendering of the conversation may end the reply with (see
    ``ChatRenderer.reply_close``; empty: the template's assistant close);
    ``template_kwargs`` are the ``chat_template_kwargs`` it was rendered with
    (None when none).
    """

    messages: tuple[dict[str, Any], ...]  # canonical request messages of the last turn
    reply: dict[str, Any]  # canonical assistant message the endpoint sent back
    tools: tuple[dict[str, Any], ...]
    context_ids: tuple[int, ...]
    finish_reason: str
    segment: int
    turn_index: int
    glue: str
    template_kwargs: dict[str, Any] | None = None
    closes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PromptPlan:
    """The prompt of one turn; ``break_reason`` is set when it did not extend the previous turn."""

    prompt_ids: tuple[int, ...]
    segment: int
    break_reason: BreakReason | None
    new_token_count: int  # ids tokenized for this turn (all of them after a break)
    template_kwargs: dict[str, Any] | None = None  # the chat_template_kwargs it was rendered with


HISTORY_MODES = ("extend", "deployed")


class PromptBuilder:
    """Builds each turn's prompt ids from the rollout's ``ConversationState`` and the new request.

    ``history`` says how earlier turns are trained when the template renders
    a reply unlike what the model generated (Qwen3 and gpt-oss drop earlier
    reasoning): ``"extend"`` keeps one sequence of the generated ids (fewest
    tokens; trains contexts deployment never shows), ``"deployed"`` starts a
    new segment there (``BreakReason.REPLY_RENDERED_DIFFERENTLY``), so each
    turn is trained in the context deployment renders (more prompt tokens).
    "There" is decided on token ids: the extension (the previous prompt +
    completion ids + the new text's ids) must equal the ids of the whole
    conversation rendered and encoded as deployment does, so a reply the
    template renders differently (dropped reasoning, added call ids, gpt-oss's
    ``<|return|>`` written ``<|end|>`` in history) and one whose text
    re-encodes to other ids both start a new segment. A reply ending in one
    of the format's history terminators (``ChatFormat.history_terminators``)
    is followed by the new messages' ids alone, in either mode.
    """

    def __init__(self, renderer: ChatRenderer, history: str = "extend") -> None:
        if history not in HISTORY_MODES:
            raise ValueError(f"history must be one of {', '.join(HISTORY_MODES)}, got {history!r}")
        self.renderer = renderer
        self.history = history

    def build(
        self,
        state: ConversationState | None,
        messages: Iterable[Mapping[str, Any]],
        tools: Iterable[Mapping[str, Any]] | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> PromptPlan:
        """The prompt for ``messages``: an extension of ``state`` when possible, else a full render.

        ``template_kwargs`` (a request's ``chat_template_kwargs``) reach every render of the turn; when
        they differ from the previous turn's, the turn starts a new segment (``TEMPLATE_KWARGS_CHANGED``).
        """
        msgs = normalize_messages(messages)
        tool_list = normalize_tools(tools)
        kw = dict(template_kwargs) if template_kwargs else None
        if state is None:
            return self._full_render(msgs, tool_list, segment=0, reason=None, kw=kw)
        reason, suffix = self._extension_suffix(state, msgs, tool_list, kw)
        if reason is not None:
            return self._full_render(msgs, tool_list, segment=state.segment + 1, reason=reason, kw=kw)
        new_ids = self.renderer.encode(state.glue + suffix)
        return PromptPlan(
            prompt_ids=state.context_ids + tuple(new_ids),
            segment=state.segment,
            break_reason=None,
            new_token_count=len(new_ids),
            template_kwargs=kw,
        )

    def advance(
        self,
        state: ConversationState | None,
        plan: PromptPlan,
        messages: Iterable[Mapping[str, Any]],
        tools: Iterable[Mapping[str, Any]] | None,
        completion_ids: Sequence[int],
        finish_reason: str,
        reply_message: Mapping[str, Any],
    ) -> ConversationState:
        """The state after a turn whose prompt was ``plan`` and whose reply was ``reply_message``."""
        (reply,) = normalize_messages([reply_message])
        if reply["role"] != "assistant":
            raise ValueError(f"reply_message.role must be 'assistant', got {reply['role']!r}")
        glue, closes = self.renderer.reply_close(completion_ids)
        return ConversationState(
            messages=tuple(normalize_messages(messages)),
            reply=reply,
            tools=tuple(normalize_tools(tools)),
            context_ids=plan.prompt_ids + tuple(completion_ids),
            finish_reason=finish_reason,
            segment=plan.segment,
            turn_index=0 if state is None else state.turn_index + 1,
            glue=glue,
            template_kwargs=plan.template_kwargs,
            closes=closes,
        )

    def _full_render(
        self,
        msgs: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        segment: int,
        reason: BreakReason | None,
        kw: Mapping[str, Any] | None = None,
    ) -> PromptPlan:
        ids = tuple(self.renderer.encode(self.renderer.render(msgs, tools, True, kw)))
        return PromptPlan(prompt_ids=ids, segment=segment, break_reason=reason, new_token_count=len(ids),
                          template_kwargs=dict(kw) if kw else None)

    def _extension_suffix(
        self,
        state: ConversationState,
        msgs: list[dict[str, Any]],
        tools: list[dict[str, Any]],
        kw: Mapping[str, Any] | None = None,
    ) -> tuple[BreakReason | None, str]:
        """(None, text after the previous reply) when ``msgs`` extends ``state``, else (the reason, "")."""
        reason, msgs = _align(state, msgs, tools)
        if reason is not None:
            return reason, ""
        if (state.template_kwargs or None) != kw:
            # kwargs may change what the template writes anywhere (gpt-oss's reasoning_effort is in the system
            # message): the ids so far are not what this request renders, so extending would ignore them silently
            return BreakReason.TEMPLATE_KWARGS_CHANGED, ""
        n = len(state.messages) + 1  # previous request + its reply
        prefix = self.renderer.render(msgs[:n], tools, False, kw)
        full = self.renderer.render(msgs, tools, True, kw)
        head, whole = prefix, full
        if not full.startswith(prefix):
            # the template renders the earlier turns otherwise once new messages follow: Qwen3 and gpt-oss drop
            # the reasoning of turns before a new user message. The new messages' text is then what follows the
            # turns rendered without reasoning; the generated ids keep it (drift, reported by the drift check)
            bare = [_without_reasoning(m) for m in msgs[:n]]
            if bare != msgs[:n]:
                head = self.renderer.render(bare, tools, False, kw)
                whole = self.renderer.render([*bare, *msgs[n:]], tools, True, kw)
        if not whole.startswith(head) or not head.endswith(state.closes or (self.renderer.assistant_close,)):
            return BreakReason.TEMPLATE_NOT_PREFIX, ""
        suffix = whole[len(head) :]
        if self.history == "deployed":  # trained = deployed, id for id
            extended = state.context_ids + tuple(self.renderer.encode(state.glue + suffix))
            if tuple(self.renderer.encode(full)) != extended:
                return BreakReason.REPLY_RENDERED_DIFFERENTLY, ""
        return None, suffix


def _without_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    if "reasoning_content" not in message:
        return message
    return {k: v for k, v in message.items() if k != "reasoning_content"}


def _align(
    state: ConversationState, msgs: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> tuple[BreakReason | None, list[dict[str, Any]]]:
    """Why ``msgs`` and ``tools`` do not extend the previous request + reply (None when they do).

    Checked in order: the earlier messages, the reply, the tools. Also
    returns ``msgs`` with the previous reply at its place: an empty reply
    (no text, no tool calls) that the client left out is put back, because
    Strands drops empty assistant messages from what it sends.
    """
    n = len(state.messages)
    if len(msgs) < n or any(message_key(a) != message_key(b) for a, b in zip(msgs, state.messages)):
        return BreakReason.HISTORY_REWRITTEN, msgs
    if len(msgs) > n and msgs[n]["role"] != "assistant" and message_key(state.reply) == ("assistant", "", ()):
        msgs = [*msgs[:n], state.reply, *msgs[n:]]
    if len(msgs) == n or msgs[n]["role"] != "assistant":
        return BreakReason.REPLY_MISSING, msgs
    if message_key(msgs[n]) != message_key(state.reply):
        return BreakReason.REPLY_EDITED, msgs
    if tuple(tools) != state.tools:  # dict equality: key order does not matter
        return BreakReason.TOOLS_CHANGED, msgs
    return None, msgs


__all__ = ["HISTORY_MODES", "ConversationState", "PromptBuilder", "PromptPlan"]
