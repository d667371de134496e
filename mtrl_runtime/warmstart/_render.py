"""A ``Conversation`` as the token ids a live rollout of it records, with a loss mask on the model's own tokens.

The policy endpoint renders each model call with ``chat.PromptBuilder``
(sequence extension: a turn's prompt is the previous prompt + completion +
the glue and new messages). Rendering a demonstrated conversation replays
that exactly: each assistant message is one turn whose prompt is what the
endpoint would have built for the messages before it, and whose completion
is what the model would have generated to produce it: the text the chat
template writes for the message between the generation prompt and its close,
then the end token the model stops at (the close's first token when that is
an eos, e.g. ChatML's ``<|im_end|>``; a format's history terminator such as
gpt-oss ``<|call|>`` / ``<|return|>``), except after a reply the token limit
cut (``Conversation.cut``): the model wrote none, and the turn's finish
reason is ``length``, as the live rollout recorded it. The loss mask is 1
on those completion tokens only: never the system, user or tool text, the
template glue, or the generation prompt.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from ..algorithms.samples import build_samples
from ..chat import ChatRenderer, PromptBuilder, normalize_messages, normalize_tools
from ..chat.formats import ChatFormat, resolve_format
from ..types import Rollout, RolloutStatus, Sample, Turn
from ._conversation import Conversation


def conversation_renderer(
    tokenizer: Any, chat_format: str | ChatFormat | None = None, history: str = "extend"
) -> "ConversationRenderer":
    """The renderer the policy endpoint would use for ``tokenizer`` (the format named, else detected) and
    ``history`` (``advanced.history_training``)."""
    fmt = chat_format if isinstance(chat_format, ChatFormat) else resolve_format(tokenizer, chat_format)
    return ConversationRenderer(tokenizer, fmt, history)


class ConversationRenderer:
    """Renders conversations for one tokenizer and chat format, as the endpoint's ``CallCapture`` does.

    ``renderer`` is built with the same arguments as the endpoint's (the
    tokenizer's own template when it renders tools, else the format's), and
    ``history`` is ``advanced.history_training`` (``extend`` or ``deployed``).
    """

    def __init__(self, tokenizer: Any, chat_format: ChatFormat, history: str = "extend") -> None:
        self.format = chat_format
        self.renderer = ChatRenderer(tokenizer, fallback=chat_format.template, stop_tokens=chat_format.stop_tokens,
                                     history_terminators=chat_format.history_terminators)
        self.builder = PromptBuilder(self.renderer, history)
        vocab = tokenizer.get_vocab()
        # (history text the template writes, id of the token the model generates there), e.g. ("<|end|>", <|return|>)
        self._terminators = tuple((history_text, vocab[token]) for token, history_text in
                                  sorted(chat_format.history_terminators, key=lambda pair: pair[0] != pair[1])
                                  if token in vocab)
        self._eos = tokenizer.eos_token_id

    def turns(self, conversation: Conversation, rollout_id: str = "") -> list[Turn]:
        """One ``Turn`` per assistant message, with the prompt and completion ids a live rollout records.

        Logprobs are 0 (no model sampled them). Raises a ValueError naming the
        conversation's ``source`` and the message when it has no assistant
        message or the template cannot render one.
        """
        where = conversation.source or "conversation"
        try:
            messages = normalize_messages(conversation.messages)
            tools = normalize_tools(conversation.tools)
        except ValueError as exc:
            raise ValueError(f"{where}: {exc}") from None
        turns: list[Turn] = []
        state = None
        for i, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            if i == 0:
                raise ValueError(f"{where}: messages[0] is an assistant message; a turn needs a prompt before it")
            request = messages[:i]
            plan = self.builder.build(state, request, tools)
            cut = i in conversation.cut  # the token limit ended it: the model wrote no end token
            completion = self._completion_ids(where, i, request, message, tools, cut)
            finish = "length" if cut else "tool_calls" if message.get("tool_calls") else "stop"
            turns.append(Turn(
                rollout_id=rollout_id or where,
                index=len(turns),
                messages=tuple(request),
                prompt_ids=plan.prompt_ids,
                completion_ids=completion,
                logprobs=(0.0,) * len(completion),
                finish_reason=finish,
                completion_text=self.renderer.decode(completion if cut else completion[:-1]),  # no end token
                tool_calls=tuple(message.get("tool_calls") or ()),
                tools=tuple(tools),
                segment=plan.segment,
                break_reason=plan.break_reason,
                reasoning=message.get("reasoning_content"),
            ))
            state = self.builder.advance(state, plan, request, tools, completion, "length" if cut else "stop", message)
        if not turns:
            raise ValueError(f"{where}: messages has no assistant message; there is nothing to learn from")
        return turns

    def rollout(self, conversation: Conversation, rollout_id: str = "", group_id: str = "") -> Rollout:
        """The conversation as a completed ``Rollout`` of its turns (for ``algorithms.samples.build_samples``)."""
        rid = rollout_id or conversation.source or "conversation"
        return Rollout(id=rid, task_id=rid, group_id=group_id or rid, status=RolloutStatus.COMPLETED,
                       turns=tuple(self.turns(conversation, rid)))

    def samples(self, conversation: Conversation, rollout_id: str = "", group_id: str = "") -> list[Sample]:
        """Training samples of the conversation (one per sequence), as ``algorithms.samples.build_samples`` makes
        them: advantage 1 and mask 1 on each assistant message's tokens, mask 0 on an assistant message of weight 0."""
        rollout = self.rollout(conversation, rollout_id, group_id)
        weights = assistant_weights(conversation)
        out = []
        for sample in build_samples(rollout, weights):
            mask = tuple(int(m and a > 0) for m, a in zip(sample.loss_mask_T, sample.advantages_T))
            out.append(replace(sample, loss_mask_T=mask))
        return out

    def render(self, conversation: Conversation) -> tuple[list[int], list[int]]:
        """(ids, mask) of a conversation that renders as one sequence; see ``render_conversation``."""
        turns = self.turns(conversation)
        broken = next((t for t in turns if t.break_reason is not None), None)
        if broken is not None:
            raise ValueError(
                f"{conversation.source or 'conversation'}: turn {broken.index} does not extend the one before it "
                f"({broken.break_reason.value}); it renders as {turns[-1].segment + 1} sequences: use "
                "ConversationRenderer.rollout with algorithms.samples.build_samples for one sample per sequence"
            )
        last = turns[-1]
        ids = list(last.prompt_ids) + list(last.completion_ids)
        mask = [0] * len(ids)
        for turn, weight in zip(turns, assistant_weights(conversation)):
            start = len(turn.prompt_ids)
            mask[start : start + len(turn.completion_ids)] = [int(weight > 0)] * len(turn.completion_ids)
        return ids, mask

    def _completion_ids(
        self, where: str, index: int, request: Sequence[Mapping[str, Any]], message: Mapping[str, Any],
        tools: Sequence[Mapping[str, Any]], cut: bool = False,
    ) -> tuple[int, ...]:
        """The ids the model generates to write ``message`` after ``request``: its rendered text, then its end token
        (none when ``cut``: the token limit stopped the model before it)."""
        prompt = self.renderer.render(request, tools, True)
        whole = self.renderer.render([*request, message], tools, False)
        if not whole.startswith(prompt):
            raise ValueError(f"{where}: messages[{index}]: the chat template does not render this assistant message "
                             "after the generation prompt it renders for the messages before it")
        text = whole[len(prompt):]
        for history_text, token_id in self._terminators:
            if text.endswith(history_text):
                return tuple(self.renderer.encode(text[: -len(history_text)])) + (() if cut else (token_id,))
        close = self.renderer.assistant_close
        if not close or not text.endswith(close):
            raise ValueError(f"{where}: messages[{index}]: the rendered assistant message does not end with the "
                             f"template's close {close!r}; cannot tell where the model's reply ends")
        if cut:
            return tuple(self.renderer.encode(text[: -len(close)]))
        close_ids = self.renderer.encode(close)
        end = close_ids[0] if close_ids and close_ids[0] in self.renderer.eos_token_ids else self._eos
        if end is None:
            raise ValueError(f"{where}: the tokenizer has no eos token and the template's close {close!r} starts with "
                             "none; cannot tell which token ends a reply")
        return tuple(self.renderer.encode(text[: -len(close)])) + (int(end),)


def assistant_weights(conversation: Conversation) -> list[float]:
    """Each assistant message's ``weight`` (OpenAI's fine-tuning format: 0 leaves it out of the loss; default 1)."""
    weights = []
    for i, message in enumerate(conversation.messages):
        if message.get("role") != "assistant":
            continue
        weight = message.get("weight", 1)
        if isinstance(weight, bool) or weight not in (0, 1):
            raise ValueError(f"{conversation.source or 'conversation'}: messages[{i}].weight must be 0 or 1, "
                             f"got {weight!r}")
        weights.append(float(weight))
    return weights


def render_conversation(
    tokenizer_or_renderer: Any, conversation: Conversation, chat_format: str | ChatFormat | None = None
) -> tuple[list[int], list[int]]:
    """(ids, mask): ``conversation`` as the token ids a live rollout of it records, and its loss mask.

    ``tokenizer_or_renderer``: a Hugging Face tokenizer (its chat format is
    ``chat_format``, else detected from it, as the endpoint does) or a
    ``ConversationRenderer``. ``ids`` equal the last turn's prompt ids +
    completion ids that the policy endpoint records when the model writes the
    conversation's assistant messages one by one (sequence extension).
    ``mask[i]`` is 1 where the model wrote ``ids[i]`` (each assistant
    message's tokens and its end token), 0 elsewhere (system, user, tool
    text, template glue, generation prompts). Messages after the last
    assistant message are not rendered; an assistant message with
    ``"weight": 0`` is rendered with mask 0. Raises a ValueError naming the
    conversation's ``source`` and the message at fault; also when the
    template breaks sequence extension (then use
    ``ConversationRenderer.rollout`` and one sample per sequence).
    """
    renderer = (tokenizer_or_renderer if isinstance(tokenizer_or_renderer, ConversationRenderer)
                else conversation_renderer(tokenizer_or_renderer, chat_format))
    return renderer.render(conversation)


__all__ = ["ConversationRenderer", "assistant_weights", "conversation_renderer", "render_conversation"]
