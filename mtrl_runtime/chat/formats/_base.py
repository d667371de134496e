"""What every chat format shares: the ``ChatFormat`` protocol and the small pieces its parsers reuse.

The protocol lives here, in the chat package, rather than in ``types.py``:
its signatures speak of ``ParsedReply`` and tokenizers, which only the chat
package and the capture path above it use; engines stay token-in-token-out
and never see a format.
"""

from __future__ import annotations

import json
import secrets
from enum import Enum
from typing import Any, Collection, Mapping, Protocol, runtime_checkable

from .._toolparse import ParsedReply


class ReasoningHistory(str, Enum):
    """How a family's template renders the reasoning of earlier assistant turns."""

    KEPT = "kept"  # rendered again in history, as generated
    DROPPED = "dropped"  # left out of earlier turns (Qwen3 before the last user turn, gpt-oss, DeepSeek R1)
    NONE = "none"  # the family has no reasoning text


@runtime_checkable
class ChatFormat(Protocol):
    """One model family's chat format: its template, how it writes tool calls and reasoning, how to read them.

    ``template`` is the project's template of the family, written from the
    format's public documentation; the tokenizer's own template is used
    instead wherever it renders tools. ``tool_call_opener`` is the text that
    starts a call (forced as a generation prefix when a tool call is
    required); ``stop_tokens`` end a reply besides the tokenizer's eos;
    ``vllm_tool_parser`` is the ``--tool-call-parser`` vLLM serves the family with.

    What a streamed reply holds back (``chat.ReplyText``): ``call_openers``
    are every text that starts a call (``tool_call_opener`` and any other the
    family writes, such as Llama's ``<|python_tag|>``), nothing is streamed
    from the first one on when the request has tools; ``held_headers`` are
    (opener, closer) pairs of markup whose inside is never text (harmony's
    message headers), held back while the last opener is unclosed.

    ``history_terminators`` are (generated token, history text) pairs for the
    tokens that end a reply but that the template does not write right after
    the reply's text in the way it closes a plain assistant message: what the
    message ends with when the template renders it as history. gpt-oss ends a
    call with ``<|call|>`` (history keeps it) and a final answer with
    ``<|return|>`` (history writes ``<|end|>``). Sequence extension adds no
    text after such a token (``ChatRenderer.reply_close``): the generated
    token stays, and where history writes another one, that is drift
    (``mtrl check template``) and, under ``history_training: deployed``, a new
    segment. Tokens not listed close as the template's assistant close does.

    ``reasoning_openers`` are (opener, closer) pairs: a generation prompt
    ending with the opener (Qwen3.5's ``<think>\n``) has opened the
    reasoning block the reply continues, so the reply is parsed and streamed
    as if it began with the opener (``opened_reasoning``); a tool call forced
    there (``forced_prefix``) comes after the closer, which ends the block
    empty as the template renders a turn without reasoning.
    """

    name: str
    template: str
    reasoning_history: ReasoningHistory
    tool_call_opener: str
    call_openers: tuple[str, ...]
    held_headers: tuple[tuple[str, str], ...]
    stop_tokens: tuple[str, ...]
    history_terminators: tuple[tuple[str, str], ...]
    reasoning_openers: tuple[tuple[str, str], ...]
    vllm_tool_parser: str

    def detect(self, tokenizer: Any) -> bool:
        """Whether ``tokenizer`` (its special tokens or its template) belongs to this family."""
        ...

    def forced_prefix(self, tool_name: str | None) -> str:
        """The text that makes the reply a tool call (of ``tool_name`` when given), put at the end of the prompt."""
        ...

    def parse(self, text: str, tool_names: Collection[str] | None = None, *, calls: bool = True) -> ParsedReply:
        """``text`` (a completion, special tokens kept) as content, reasoning and, when ``calls``, tool calls.

        Never raises: a malformed call stays in the content as written and is counted.
        """
        ...


class FormatDefaults:
    """What a family's format has unless it says otherwise (a ``ChatFormat``'s fields, see there).

    A call starts with ``tool_call_opener`` only, nothing in a streamed reply
    is held back but its calls, the tokenizer's eos is the only stop token, a
    reply is closed in history as the template closes it, and no generation
    prompt opens a reasoning block. A forced call (``forced_prefix``) is the
    opener alone when no tool is named (the model picks the tool), else
    ``named_call``: the opener, the tool's name and ``name_end`` (what the
    family writes between a called tool's name and its arguments); the
    families that write the name as a JSON string define their own.
    """

    tool_call_opener: str
    name_end: str
    held_headers: tuple[tuple[str, str], ...] = ()
    stop_tokens: tuple[str, ...] = ()
    history_terminators: tuple[tuple[str, str], ...] = ()
    reasoning_openers: tuple[tuple[str, str], ...] = ()

    @property
    def call_openers(self) -> tuple[str, ...]:
        """``tool_call_opener`` alone: the family starts every call the same way."""
        return (self.tool_call_opener,)

    def forced_prefix(self, tool_name: str | None) -> str:
        return self.tool_call_opener if tool_name is None else self.named_call(tool_name)

    def named_call(self, tool_name: str) -> str:
        """A call of ``tool_name`` written up to where its arguments begin."""
        return self.tool_call_opener + tool_name + self.name_end


def tool_call(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """An OpenAI tool call with a fresh id; arguments serialized as JSON (unicode kept)."""
    return {
        "id": "call_" + secrets.token_hex(12),
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }


def call_from_json(data: Any, args_key: str = "arguments") -> dict[str, Any] | None:
    """The tool call a decoded JSON object describes (``name`` + an object of arguments), else None."""
    if not isinstance(data, dict):
        return None
    name = data.get("name")
    arguments = data.get(args_key, data.get("arguments", {}) if args_key != "arguments" else {})
    if isinstance(arguments, str):  # some families double-encode arguments
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return tool_call(name, arguments)


def split_reasoning(text: str, open_tag: str = "<think>", close_tag: str = "</think>") -> tuple[str | None, str]:
    """(reasoning, the rest) of a completion that thinks in ``open_tag``...``close_tag``.

    The open tag may be in the prompt (a template that opens thinking for the
    model), so a close tag alone marks reasoning too. A completion cut while
    still thinking (open tag, no close) is all reasoning.
    """
    end = text.find(close_tag)
    if end >= 0:
        head = text[:end]
        start = head.find(open_tag)
        if start >= 0 and not head[:start].strip():
            head = head[start + len(open_tag) :]
        return head.strip(), text[end + len(close_tag) :].lstrip("\n")
    stripped = text.lstrip()
    if stripped.startswith(open_tag):
        return stripped[len(open_tag) :].strip(), ""
    return None, text


def reply(
    content: str,
    calls: list[dict[str, Any]],
    malformed: int,
    reasoning: str | None,
    tool_names: Collection[str] | None,
) -> ParsedReply:
    """A ``ParsedReply`` with stripped content (None when empty) and unknown tools counted."""
    text = content.strip()
    unknown = 0 if tool_names is None else sum(c["function"]["name"] not in tool_names for c in calls)
    return ParsedReply(
        content=text or None, tool_calls=calls, malformed=malformed, unknown_tools=unknown, reasoning=reasoning or None
    )


def opened_reasoning(fmt: ChatFormat, prompt_tail: str) -> tuple[str, str] | None:
    """The (opener, closer) of ``fmt.reasoning_openers`` a prompt ending in ``prompt_tail`` leaves open, else None."""
    return next(((o, c) for o, c in fmt.reasoning_openers if prompt_tail.endswith(o)), None)


def vocab_has(tokenizer: Any, *tokens: str) -> bool:
    """Whether any of ``tokens`` is one token of ``tokenizer`` (special or added)."""
    vocab = tokenizer.get_vocab()
    return any(t in vocab for t in tokens)


def template_text(tokenizer: Any) -> str:
    """The tokenizer's chat template(s) as one string ("" when it has none)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):
        return "\n".join(str(v) for v in template.values())
    return template if isinstance(template, str) else ""


__all__ = ["ChatFormat", "ReasoningHistory", "call_from_json", "opened_reasoning", "reply", "split_reasoning", "template_text", "tool_call", "vocab_has"]
