"""What every wire protocol shares: the calling side's seam, tool results, finish-reason and tool-choice tables, event framing.

Calling a real endpoint of a protocol (a reference model, a judge): the
conversation arrives as normalized OpenAI chat messages (tool-call arguments
parsed), whatever protocol the agent spoke, and leaves in the endpoint's own
shape through the protocol's ``CallingWire``; its reply comes back as a
``ReferenceReply`` (an OpenAI assistant message).

Tool results follow one rule in every protocol: the text reaches the model
unchanged; a failure flag is recorded.

A protocol may flag a tool result as failed: Anthropic Messages'
``tool_result.is_error: true``, Bedrock Converse's ``toolResult.status:
"error"``. OpenAI chat completions (``tool`` messages) and Responses
(``function_call_output``) have no such flag: their result is its text.

The prompt gets the result's text exactly as the agent sent it, with no
marker added, because that is what a deployed server of each protocol puts
in front of the models mtrl trains:

- Anthropic's tool-use docs ("Handle tool calls") put the error itself in
  the result's ``content`` ("ConnectionError: the weather service API is
  not available (HTTP 500)") and ``is_error`` beside it; vLLM's
  ``/v1/messages`` server, which serves open models on this protocol, turns
  a ``tool_result`` into a ``tool`` message of its text and drops
  ``is_error``.
- Bedrock's API reference says ``ToolResultBlock.status`` "is only
  supported by Amazon Nova and Anthropic Claude 3 and 4 models": for the
  open-weight models mtrl trains the model sees the content alone.
- The frameworks already write the failure into the text (Strands:
  ``"Error: <exception>"``, ``"Unknown tool: <name>"``; LangChain's
  ``ToolMessage`` the error text), so one agent's failed tool renders the
  same tokens whichever protocol its model client speaks. (An earlier rule
  prefixed ``Error:`` to Bedrock's failed results only: Strands'
  ``"Unknown tool: x"`` then read differently on Bedrock than on OpenAI,
  and differently from what deployment shows.)

The flag is never dropped: the canonical ``tool`` message keeps
``"status": "error"`` (``chat.normalize_messages``; ``ChatRenderer.render``
hides it from the template), so the stored turn's messages (and its MLflow
span) show which results failed, and a rollout
that saw failed results ends with the metric ``tool_results_failed`` (each
failed call counted once, however many turns repeat it) and the
coordinator counter of that name. A tool call an adapter reported keeps its
own ``ToolCall.status``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol

import orjson
from pydantic import BaseModel

from ..errors import BadRequest, EngineFailure
from ..types import ChatOptions, SamplingParams

EVENTS = b"text/event-stream"


@dataclass(frozen=True)
class ReferenceReply:
    """One answer of the reference endpoint, as the OpenAI assistant message sent back to the agent."""

    message: dict[str, Any]
    finish_reason: str
    completion_text: str
    reasoning: str | None


class CallingWire(Protocol):
    """How to call a real endpoint of one protocol; ``base`` is the endpoint's URL without its trailing slash."""

    def chat_url(self, base: str, model: str) -> str: ...

    def models_url(self, base: str) -> str | None:
        """What the check reads (its model list); None: the check only connects to ``base``."""
        ...

    def headers(self, api_key: str | None, method: str, url: str, content: bytes) -> dict[str, str]:
        """The request's credential headers (a signature may cover the URL and the body)."""
        ...

    def request_body(self, model: str, messages: list[dict[str, Any]], tools: list[Mapping[str, Any]],
                     sampling: SamplingParams, options: ChatOptions) -> dict[str, Any]: ...

    def parse_reply(self, payload: Any) -> ReferenceReply:
        """The reply; ValueError naming what is missing."""
        ...


class DeclaredEndpoint:
    """A ``CallingWire``'s URLs and credential header, declared as fields (Bedrock's SigV4 signing is the one
    protocol that needs code here).

    ``chat_path`` and ``models_path`` (None: no model list to read) follow the
    endpoint's URL, ``{model}`` in a path standing for the model's name; the
    key goes as ``key_header``, written after ``key_scheme`` (``Bearer ``),
    only when there is one (a local server takes none), after
    ``fixed_headers`` (an API version).
    """

    chat_path: str
    models_path: str | None = None
    key_header: str
    key_scheme: str = ""
    fixed_headers: tuple[tuple[str, str], ...] = ()

    def chat_url(self, base: str, model: str) -> str:
        return base + self.chat_path.format(model=model)

    def models_url(self, base: str) -> str | None:
        return None if self.models_path is None else base + self.models_path

    def headers(self, api_key: str | None, method: str, url: str, content: bytes) -> dict[str, str]:
        headers = dict(self.fixed_headers)
        if api_key:
            headers[self.key_header] = self.key_scheme + api_key
        return headers


@dataclass(frozen=True)
class Wire:
    """One wire protocol, as ``WIRES`` lists it.

    ``request``: the serving side's request schema (a pydantic model, its
    errors naming the field and the value); ``calling``: how to call a real
    endpoint of the protocol, None when mtrl only serves it; ``reference_name``:
    the name a reference model's ``protocol`` takes for it (``openai``,
    ``anthropic``, ``bedrock``: the names the CLI's ``--reference-protocol``
    has always taken).
    """

    name: str
    request: type[BaseModel]
    calling: CallingWire | None = None
    reference_name: str | None = None


def arguments_text(arguments: Any) -> str:
    """Tool-call arguments as the JSON text OpenAI's wire carries."""
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def arguments_object(arguments: Any) -> Any:
    """Tool-call arguments as a JSON value (parsed when they are JSON text)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments else {}
        except ValueError:
            return arguments
    return arguments


def tool_call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI tool call from a block of another wire (its arguments as JSON text)."""
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments or {}, ensure_ascii=False)}}


def sampling_fields(sampling: SamplingParams, *, max_tokens: str, temperature: str, top_p: str, stop: str,
                    seed: str | None = None) -> dict[str, Any]:
    """The rollout's sampling under a protocol's own field names, for calling a real endpoint.

    ``top_p`` only below 1 (newer Anthropic models refuse it beside
    ``temperature``), the stop sequences only when there are some, the seed
    only where the protocol takes one (``seed`` names its field) and the
    plan gave one.
    """
    fields: dict[str, Any] = {max_tokens: sampling.max_tokens, temperature: sampling.temperature}
    if sampling.top_p < 1.0:
        fields[top_p] = sampling.top_p
    if sampling.stop:
        fields[stop] = list(sampling.stop)
    if seed is not None and sampling.seed is not None:
        fields[seed] = sampling.seed
    return fields


def system_field(key: str, messages: list[dict[str, Any]], *, leading: bool = False
                 ) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The system prompt of a protocol that takes it apart from the turns, as its field ``key``, and the other messages.

    The system messages' texts joined by blank lines, empty ones left out; no
    field when none has text. ``leading``: only the system messages before the
    first other message (OpenAI Responses' ``instructions``); a later one stays
    in the conversation.
    """
    texts: list[str] = []
    conversation: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "system" and not (leading and conversation):
            texts.append(message.get("content") or "")
        else:
            conversation.append(message)
    text = "\n\n".join(t for t in texts if t)
    return ({key: text} if text else {}), conversation


def tool_fields(tools: list[dict[str, Any]], choice: "ToolChoices", options: ChatOptions) -> dict[str, Any]:
    """``tools`` (in the protocol's own shape) and the native tool choice ``options`` ask for, as the ``tools`` and
    ``tool_choice`` fields OpenAI's protocols and Anthropic's share; neither without tools (no choice to make)."""
    if not tools:
        return {}
    return {"tools": tools, "tool_choice": choice.to_native(options.tool_choice, options.tool_name)}


def reply_list(payload: Any, *keys: str) -> list[Any]:
    """The list a reply holds at ``keys`` (one key an object deeper each); ValueError ``no <keys> list`` without it."""
    value = payload
    for key in keys:
        value = value.get(key) if isinstance(value, Mapping) else None
    if not isinstance(value, list):
        raise ValueError(f"no {'.'.join(keys)} list")
    return value


def call_name(block: Mapping[str, Any], where: str) -> str:
    """The ``name`` of a reply's tool-call block; ValueError naming ``where`` when it has none."""
    name = block.get("name")
    if not isinstance(name, str):
        raise ValueError(f"{where} has no name")
    return name


@dataclass
class AssistantBlocks:
    """An assistant turn of another protocol read block by block: its text, its reasoning, its (OpenAI) tool calls.

    Read from a request (the serving side), ``message()`` is the chat message
    as the client sent it; read from a real endpoint's reply (the calling
    side), ``reply()`` is the ``ReferenceReply``.
    """

    texts: list[str] = field(default_factory=list)
    thoughts: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)

    def message(self) -> dict[str, Any]:
        """The chat message: no text sent, no content; reasoning only when some was sent."""
        message: dict[str, Any] = {"role": "assistant", "content": "".join(self.texts) if self.texts else None}
        if self.thoughts:
            message["reasoning_content"] = "\n".join(self.thoughts)
        if self.calls:
            message["tool_calls"] = self.calls
        return message

    def reply(self, stop: Any, finish: "FinishReasons") -> ReferenceReply:
        """The OpenAI assistant message of what was read; ``stop``, the reply's own reason, read by ``finish``."""
        content = "".join(self.texts)
        reasoning = "\n".join(self.thoughts) or None
        message: dict[str, Any] = {"role": "assistant", "content": content if content or not self.calls else None}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if self.calls:
            message["tool_calls"] = self.calls
        return ReferenceReply(message, finish.to_chat(stop, bool(self.calls)), content, reasoning)


def append_blocks(turns: list[dict[str, Any]], role: str, blocks: list[dict[str, Any]], key: str = "content") -> None:
    """Add ``blocks`` as a ``role`` message (under ``key``), joining the previous one when it has the same role."""
    if not blocks:
        return
    if turns and turns[-1]["role"] == role:
        turns[-1][key].extend(blocks)
    else:
        turns.append({"role": role, key: list(blocks)})


class FinishReasons:
    """A protocol's stop reasons and the chat finish reasons they mean, written once for both directions.

    ``pairs`` are ``(native, chat)``. Reading a reply, each native reason is
    its chat reason (an unknown one: ``tool_calls`` when the reply holds
    calls, else ``stop``; a missing one: ``stop``). Writing an answer, a chat
    reason is the first native reason paired with it (an unknown one:
    ``default``).
    """

    def __init__(self, pairs: tuple[tuple[str, str], ...], default: str) -> None:
        self.pairs = pairs
        self.default = default
        self._chat = dict(pairs)
        self._native: dict[str, str] = {}
        for native, chat in pairs:
            self._native.setdefault(chat, native)

    def to_chat(self, native: Any, has_calls: bool = False) -> str:
        if not isinstance(native, str):
            return "stop"
        return self._chat.get(native, "tool_calls" if has_calls else "stop")

    def to_native(self, chat: str) -> str:
        return self._native.get(chat, self.default)


class ToolChoices:
    """A protocol's tool choices and the chat tool choice each means, written once for both directions.

    ``pairs`` are ``(native, chat)`` kinds; the chat kinds are ``auto``,
    ``none``, ``required`` (some tool must be called) and ``function`` (the
    named tool must be called). ``write`` puts a native kind and the tool's
    name (None unless ``function``) in the protocol's own value; ``read`` takes
    them out of it (a request's validated value is read as its JSON). Reading a
    request, a native kind is the chat kind it is paired with first, and one
    also paired with ``function`` (Gemini's ``ANY``) is ``function`` when the
    value names one tool; no value (or no kind in it) is ``auto``. Writing a
    request to a real endpoint, a chat kind is the first native kind paired
    with it.
    """

    def __init__(self, pairs: tuple[tuple[str, str], ...], write: Callable[[str, str | None], Any],
                 read: Callable[[Any], tuple[str | None, str | None]]) -> None:
        self.pairs = pairs
        self._write = write
        self._read = read
        self._chat: dict[str, str] = {}
        self._native: dict[str, str] = {}
        for native, chat in pairs:
            self._chat.setdefault(native, chat)
            self._native.setdefault(chat, native)

    def to_chat(self, value: Any) -> tuple[str, str | None]:
        """The chat kind and tool name (None unless ``function``) of a request's native ``value``."""
        if value is None:  # most calls name no choice: answered before the (costly) model check
            return "auto", None
        if isinstance(value, BaseModel):
            value = value.model_dump(exclude_none=True)
        native, name = self._read(value)
        if native is None:
            return "auto", None
        if name is not None and self._native.get("function") == native:
            return "function", name
        if native not in self._chat:
            raise ValueError(f"tool choice {native!r} has no chat meaning; known: {sorted(self._chat)}")
        return self._chat[native], None

    def to_native(self, chat: str, name: str | None = None) -> Any:
        """The protocol's value for the chat kind ``chat`` (``name``: the tool a ``function`` choice names)."""
        if chat not in self._native:
            raise ValueError(f"tool choice {chat!r} has no native form here; known: {sorted(self._native)}")
        return self._write(self._native[chat], name if chat == "function" else None)

    def options(self, value: Any, **fields: Any) -> ChatOptions:
        """The coordinator's options for a request's ``value``, with ``fields`` (``none`` is ``auto`` there: the
        route drops the tools, ``types.ChatOptions``)."""
        chat, name = self.to_chat(value)
        return ChatOptions(tool_choice="auto" if chat == "none" else chat, tool_name=name, **fields)


def tool_message(call_id: str, text: str, failed: bool, name: str | None = None) -> dict[str, Any]:
    """The chat ``tool`` message of one tool result: ``text`` unchanged, ``status: error`` when ``failed``."""
    message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": text}
    if name is not None:
        message["name"] = name
    if failed:
        message["status"] = "error"
    return message


def string_field(block: Mapping[str, Any], key: str, where: str) -> str:
    """A request block's ``key``, which must be a string; BadRequest naming ``where.key`` and the value."""
    value = block.get(key)
    if not isinstance(value, str):
        raise BadRequest(f"{where}.{key}: expected a string, got {value!r:.80}", param=f"{where}.{key}")
    return value


def prefill_refused(where: str, whose: str, ending: str) -> BadRequest:
    """The error for a request that ends with the model's own turn at ``where`` (a prefill, which ``whose`` names)."""
    return BadRequest(f"{where}: {whose} (a prefill); mtrl's policy answers whole turns: end with {ending}",
                      param=f"{where}.role")


def object_arguments(fn: Mapping[str, Any], must: str) -> dict[str, Any]:
    """The model's call ``fn`` (a chat tool call's ``function``): its arguments as the JSON object a protocol's call
    block carries; EngineFailure, saying ``must`` (what the protocol requires), when they are no object."""
    arguments = orjson.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
    if not isinstance(arguments, dict):
        raise EngineFailure(
            f"the model called {fn['name']!r} with arguments that are not a JSON object ({fn['arguments']!r:.80}); "
            f"{must}"
        )
    return arguments


def sse(event: str, payload: bytes) -> bytes:
    """One server-sent event with a named type."""
    return b"event: " + event.encode() + b"\ndata: " + payload + b"\n\n"


__all__ = ["EVENTS", "CallingWire", "DeclaredEndpoint", "FinishReasons", "ToolChoices", "ReferenceReply", "AssistantBlocks",
           "Wire", "append_blocks", "arguments_object", "arguments_text", "call_name", "object_arguments", "prefill_refused",
           "reply_list", "sampling_fields", "sse", "string_field", "system_field", "tool_call", "tool_fields", "tool_message"]
