"""Chat rendering: canonical messages + tools → prompt text → token ids.

``ChatRenderer`` picks a template (the one given, else the tokenizer's own
when it supports tools, else ``CHATML_TOOLS_TEMPLATE``), compiles it once,
and renders it directly with the same Jinja environment transformers'
``apply_chat_template`` uses, without that method's per-call checks: the
endpoint renders twice per turn and must stay well under a millisecond.
"""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from typing import Any, Mapping, Sequence

from ._template_pieces import CHATML_OTHER_ROLES, CHATML_TURNS_TO_CALLS, HERMES_CALL, HERMES_TOOLS_LIST

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# ChatML (as SmolLM2-135M-Instruct uses it, same default system prompt) plus
# tools in the Hermes style: tool definitions as JSON lines in <tools></tools>
# in the system turn, calls as <tool_call> JSON blocks in the assistant turn,
# results as <tool_response> blocks in a user turn (consecutive tool messages
# share one user turn). Without tools it renders exactly as SmolLM2's own.
CHATML_TOOLS_TEMPLATE = (
    "{%- set default_system = '" + DEFAULT_SYSTEM_PROMPT + "' -%}\n"
    """{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set system_text = messages[0]['content'] -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system_text = default_system -%}
  {%- set rest = messages -%}
{%- endif -%}
{{- '<|im_start|>system\\n' + system_text -}}
{%- if tools -%}
  {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
""" + HERMES_TOOLS_LIST + """\
{%- endif -%}
{{- '<|im_end|>\\n' -}}
""" + CHATML_TURNS_TO_CALLS + """\
      {%- set fn = call['function'] if call['function'] is defined else call -%}
""" + HERMES_CALL + """\
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
""" + CHATML_OTHER_ROLES + """\
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"""
)

_PROBE_TEXT = "mtrl-probe-7f3a"
SEGMENT_CACHE_SIZE = 4096  # text pieces kept; a piece is one message's text between special tokens
SEGMENT_CACHE_MAX_CHARS = 65536  # longer pieces are encoded every time, never cached


# the trajectory store's meta key where the endpoint records what it renders with:
# {"chat_format": the format's name, "template": the Jinja text}; ``mtrl export`` writes that template
CHAT_TEMPLATE_META = "chat_template"


class ChatRenderer:
    """Renders canonical messages (see ``normalize_messages``) with a chat template and encodes the text.

    ``assistant_close`` is the text the template puts after an assistant
    message's content; ``eos_token_ids`` are the ids that end a reply (the
    tokenizer's eos and the close's first token when that is a special token).
    ``stop_token_ids`` are the ids an engine stops generating at: the
    tokenizer's eos and the format's stop tokens where it names some (gpt-oss
    ``<|call|>`` / ``<|return|>``, not the ``<|end|>`` that closes its
    analysis message), else ``eos_token_ids``. ``history_terminators`` are
    the format's (generated token, history text) pairs
    (``ChatFormat.history_terminators``): a reply ending in such a token is
    closed by nothing more (``reply_close``).
    """

    def __init__(
        self,
        tokenizer: Any,
        template: str | None = None,
        fallback: str = CHATML_TOOLS_TEMPLATE,
        stop_tokens: Sequence[str] = (),
        history_terminators: Sequence[tuple[str, str]] = (),
    ) -> None:
        self.tokenizer = tokenizer
        # ``fallback``: the chat format's own template, for tokenizers whose template renders no tools
        self.template = template if template is not None else _tokenizer_tool_template(tokenizer) or fallback
        self._stop_tokens = tuple(stop_tokens)  # the format's tokens that end a reply besides eos
        self._compiled = _compile(self.template)
        # the variables apply_chat_template passes: bos_token, eos_token, ...
        self._template_vars = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        self._backend = getattr(tokenizer, "backend_tokenizer", None)  # tokenizers.Tokenizer of a fast tokenizer
        self._segments = _SegmentEncoder.for_tokenizer(tokenizer, self._encode_whole)
        self.assistant_close = self._probe_close()
        self.eos_token_ids = frozenset(self._find_eos_ids())
        self.stop_token_ids = self._find_stop_ids()
        # id of a generated terminator -> the texts a history rendering may close that reply with
        vocab = tokenizer.get_vocab() if history_terminators else {}
        self._terminator_closes = {
            vocab[token]: tuple(dict.fromkeys((history, token))) for token, history in history_terminators if token in vocab
        }

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        """The prompt text of canonical ``messages`` and ``tools`` (empty tools render as none).

        ``template_kwargs`` are a request's ``chat_template_kwargs`` (e.g. ``enable_thinking``). A tool
        message's ``status`` (a failed result's flag, recorded with the turn) is not shown to the template.
        """
        if any("status" in m for m in messages):
            messages = [{k: v for k, v in m.items() if k != "status"} if "status" in m else m for m in messages]
        if template_kwargs:
            return self._compiled.render(
                {**self._template_vars, **template_kwargs},
                messages=messages,
                tools=list(tools) if tools else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
            )
        return self._compiled.render(
            messages=messages,
            tools=list(tools) if tools else None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self._template_vars,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``: special tokens written in it are parsed, no BOS is added.

        Text between special tokens is encoded piece by piece through a bounded
        cache: the system prompt with its tool list, and a task's user message,
        recur across the rollouts of a group and across turns.
        """
        if self._segments is not None:
            return self._segments.encode(text)
        return self._encode_whole(text)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` with special tokens kept (the fast backend, when there is one)."""
        if self._backend is not None:
            return self._backend.decode(list(ids), skip_special_tokens=False)
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def _encode_whole(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def close_glue(self, completion_ids: Sequence[int]) -> str:
        """The text still needed after a completion to close its assistant turn as the template does."""
        return self.reply_close(completion_ids)[0]

    def reply_close(self, completion_ids: Sequence[int]) -> tuple[str, tuple[str, ...]]:
        """(glue, closes): the text still needed after a completion, and what a history rendering ends the reply with.

        A completion that ended with one of the format's history terminators
        (gpt-oss ``<|call|>`` / ``<|return|>``) needs no glue: the generated
        token stays, and the history rendering may close the reply with the
        format's history text for it (``<|end|>`` for ``<|return|>``: a
        rewrite the drift check reports) or with the token itself. A
        completion that ended with an eos token whose text starts the close
        needs only the rest of the close; one cut by length needs all of it.
        """
        if completion_ids:
            closes = self._terminator_closes.get(completion_ids[-1])
            if closes is not None:
                return "", closes
            if completion_ids[-1] in self.eos_token_ids:
                eos_text = self.tokenizer.decode([completion_ids[-1]], skip_special_tokens=False)
                if self.assistant_close.startswith(eos_text):
                    return self.assistant_close[len(eos_text) :], (self.assistant_close,)
        return self.assistant_close, (self.assistant_close,)

    def _probe_close(self) -> str:
        probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE_TEXT}]
        text = self.render(probe, add_generation_prompt=False)
        at = text.rfind(_PROBE_TEXT)
        if at < 0:
            raise ValueError("the chat template does not render assistant message content; it cannot be used")
        return text[at + len(_PROBE_TEXT) :]

    def _find_stop_ids(self) -> frozenset[int]:
        vocab = self.tokenizer.get_vocab() if self._stop_tokens else {}
        named = {vocab[t] for t in self._stop_tokens if t in vocab}
        if not named:
            return self.eos_token_ids
        eos = self.tokenizer.eos_token_id
        return frozenset(named | ({eos} if eos is not None else set()))

    def _find_eos_ids(self) -> set[int]:
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        close_ids = self.encode(self.assistant_close)
        if close_ids and close_ids[0] in set(self.tokenizer.all_special_ids):
            ids.add(close_ids[0])
        vocab = self.tokenizer.get_vocab() if self._stop_tokens else {}
        ids.update(vocab[t] for t in self._stop_tokens if t in vocab)
        return ids


class _SegmentEncoder:
    """Encodes text split at special tokens, caching each piece's ids.

    Tokenizers match added special tokens before anything else and encode the
    text between them independently, so the pieces' ids concatenated equal the
    whole text's ids. ``for_tokenizer`` checks that on a probe and returns None
    where it does not hold (a normalizer or stripping special tokens).
    """

    def __init__(self, pattern: re.Pattern[str], special_ids: dict[str, int], encode_piece: Any) -> None:
        self._pattern = pattern
        self._special_ids = special_ids
        self._encode_piece = encode_piece
        self._cache: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, encode_whole: Any) -> "_SegmentEncoder | None":
        specials = {t: tokenizer.convert_tokens_to_ids(t) for t in getattr(tokenizer, "all_special_tokens", [])}
        specials = {t: i for t, i in specials.items() if t and isinstance(i, int)}
        if not specials:
            return None
        pattern = re.compile("(" + "|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)) + ")")
        encoder = cls(pattern, specials, encode_whole)
        probe = "".join(f"{t}user\n  hello {t} x{t}\n" for t in specials) + " tail <tool_call>\n{}"
        if encoder.encode(probe) != list(encode_whole(probe)):
            return None
        encoder._cache.clear()
        return encoder

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self._pattern.split(text):
            if not piece:
                continue
            special = self._special_ids.get(piece)
            if special is not None:
                ids.append(special)
            else:
                ids.extend(self._piece(piece))
        return ids

    def _piece(self, piece: str) -> tuple[int, ...]:
        # shared by the event loop and the worker thread that prepares a large call: each cache step is one
        # atomic OrderedDict call, and an entry another thread evicted in between is simply gone
        cached = self._cache.get(piece)
        if cached is not None:
            with contextlib.suppress(KeyError):
                self._cache.move_to_end(piece)
            return cached
        ids = tuple(self._encode_piece(piece))
        if len(piece) <= SEGMENT_CACHE_MAX_CHARS:
            self._cache[piece] = ids
            if len(self._cache) > SEGMENT_CACHE_SIZE:
                with contextlib.suppress(KeyError):
                    self._cache.popitem(last=False)
        return ids


def _tokenizer_tool_template(tokenizer: Any) -> str | None:
    """The tokenizer's own chat template when it renders tools, else None."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):  # named templates: prefer the tool-use one
        template = template.get("tool_use") or template.get("default")
    if isinstance(template, str) and "tools" in template:
        return template
    return None


def _compile(template: str) -> Any:
    """The template compiled in transformers' chat-template environment, its globals in one flat dict.

    Jinja keeps a template's globals as a ChainMap over its environment's and
    copies them into each render's context key by key, in Python; from a
    plain dict the copy is one C-level call (about a third of a short
    render). The template is this renderer's own, so transformers' cached
    one is left as it is.
    """
    from transformers.utils.chat_template_utils import _compile_jinja_template

    own = _compile_jinja_template(template).environment.from_string(template)
    own.globals = dict(own.globals)
    return own


__all__ = ["CHATML_TOOLS_TEMPLATE", "DEFAULT_SYSTEM_PROMPT", "ChatRenderer"]
