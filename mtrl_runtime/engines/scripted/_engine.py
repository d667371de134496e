"""The ``scripted`` engine: a test double that answers each rollout from a script.

No model runs. A script is either a list of replies, consumed in order per
rollout (each ``rollout_id`` has its own cursor), or a callable
``(request, prompt_text) -> str | ScriptedReply``. A reply is tokenized,
gets the eos token appended (or ends at its first ``request.stop_token_ids``
token, as a model's generation stops there), and receives deterministic logprobs in
(-3, 0) derived from each token and its position, so tests can check that
logprobs flow through unchanged. Replies can delay (``asyncio.sleep``) or
fail (raise ``ScriptedFailure``) for fault-injection tests. ``token_delay_s``
spaces the tokens of every reply as a decoding model would: ``generate_stream``
(``types.StreamingEngine``) yields them one by one, and ``generate`` takes as
long to answer as the whole stream.

Example::

    engine = ScriptedEngine(tokenizer, [
        ScriptedReply.tool_call("lookup", {"key": "A1"}),
        "The value is 42.",
    ])
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, AsyncIterator, Callable, Sequence, Union

from ...types import JSON, Generation, GenerationRequest, TokenDelta
from .._stats import EngineClosedError


class ScriptedFailure(RuntimeError):
    """Raised by the scripted engine where the script says a turn fails."""


class ScriptExhausted(IndexError):
    """A rollout asked for more turns than its list script holds."""


@dataclass(frozen=True)
class ScriptedReply:
    """One scripted completion: its text, an optional delay, and an optional failure."""

    text: str = ""
    delay_s: float = 0.0
    error: str | None = None  # if set, the turn raises ScriptedFailure(error) after the delay

    @classmethod
    def plain(cls, text: str, delay_s: float = 0.0) -> "ScriptedReply":
        return cls(text=text, delay_s=delay_s)

    @classmethod
    def tool_call(cls, name: str, arguments: JSON, text: str = "", delay_s: float = 0.0) -> "ScriptedReply":
        """A reply that calls tool ``name``: ``text`` then ``<tool_call>\\n{json}\\n</tool_call>``."""
        call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
        return cls(text=f"{text}<tool_call>\n{call}\n</tool_call>", delay_s=delay_s)

    @classmethod
    def fail(cls, message: str = "scripted failure", delay_s: float = 0.0) -> "ScriptedReply":
        return cls(error=message, delay_s=delay_s)


Reply = Union[str, ScriptedReply]
Script = Union[Sequence[Reply], Callable[[GenerationRequest, str], Reply]]


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    """Decode through the fast backend when there is one: transformers' wrapper walks every id first."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return backend.decode(list(ids), skip_special_tokens=False)
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def scripted_logprob(token_id: int, position: int) -> float:
    """A deterministic stand-in logprob in (-3, 0) for ``token_id`` at completion ``position``."""
    mixed = (token_id * 2654435761 + position * 40503 + 97) % 9973
    return -3.0 * (mixed + 1) / 9975.0


class ScriptedEngine:
    """Scripted completions per rollout (see the module docstring).

    ``fail_turns`` makes the listed turns (0-based, per rollout) raise;
    ``delay_s`` delays every reply; ``token_delay_s`` each of its tokens
    (a decode step). ``calls`` counts generate calls.
    ``served_model`` is what the server names as the model it serves.
    """

    name = "scripted"

    def __init__(
        self,
        tokenizer: Any,
        script: Script,
        *,
        fail_turns: Sequence[int] = (),
        delay_s: float = 0.0,
        served_model: str = "scripted",
        context_length: int | None = None,
        token_delay_s: float = 0.0,
    ) -> None:
        if token_delay_s < 0:
            raise ValueError(f"token_delay_s: must be >= 0, got {token_delay_s}")
        if not callable(script) and isinstance(script, (str, bytes)):
            raise TypeError("script: expected a list of replies or a callable, got a string")
        if tokenizer.eos_token_id is None:
            raise ValueError("tokenizer: the scripted engine needs a tokenizer with an eos_token_id")
        self.tokenizer = tokenizer
        self.script = script
        self.served_model = served_model  # what /health names: no model runs here
        self.context_length = context_length  # None: no limit (a test may set one, as a real model has)
        self.policy_version = 0
        self.fail_turns = frozenset(fail_turns)
        self.delay_s = delay_s
        self.token_delay_s = token_delay_s
        self.adapters: list[tuple[str, int]] = []  # (path, version) of every load_adapter call
        self.calls = 0
        self._cursor: dict[str | None, int] = defaultdict(int)
        self._encoded: dict[str, tuple[int, ...]] = {}
        self._eos = int(tokenizer.eos_token_id)
        self._closed = False

    async def generate(self, request: GenerationRequest) -> Generation:
        if self.token_delay_s <= 0:
            return await self._whole(request)
        generation = None
        async for item in self.generate_stream(request):  # as long as the stream takes
            generation = item
        assert isinstance(generation, Generation)
        return generation

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | Generation]:
        """The reply's tokens one by one, ``token_delay_s`` apart, then the whole ``Generation``."""
        generation = await self._whole(request)
        for token, logprob in zip(generation.completion_ids, generation.logprobs):
            if self.token_delay_s > 0:
                await asyncio.sleep(self.token_delay_s)
            yield TokenDelta((token,), (logprob,))
        yield generation

    async def _whole(self, request: GenerationRequest) -> Generation:
        if self._closed:
            raise EngineClosedError("the scripted engine is closed")
        if request.sampling.max_tokens < 1:
            raise ValueError(f"sampling.max_tokens: must be >= 1, got {request.sampling.max_tokens}")
        self.calls += 1
        turn = self._cursor[request.rollout_id]
        self._cursor[request.rollout_id] = turn + 1
        reply = self._reply(request, turn)
        delay = reply.delay_s + self.delay_s
        if delay > 0:
            await asyncio.sleep(delay)
        if reply.error is not None:
            raise ScriptedFailure(f"rollout {request.rollout_id!r} turn {turn}: {reply.error}")
        if turn in self.fail_turns:
            raise ScriptedFailure(f"rollout {request.rollout_id!r} turn {turn}: failure injected by fail_turns")
        return self._generation(reply.text, request)

    async def load_adapter(self, path: str, version: int) -> None:
        self.adapters.append((str(path), version))
        self.policy_version = version

    async def close(self) -> None:
        """Refuse every later request, as the other engines do."""
        self._closed = True

    def _reply(self, request: GenerationRequest, turn: int) -> ScriptedReply:
        if callable(self.script):
            prompt_text = _decode(self.tokenizer, request.prompt_ids)
            reply = self.script(request, prompt_text)
        elif turn < len(self.script):
            reply = self.script[turn]
        else:
            raise ScriptExhausted(
                f"rollout {request.rollout_id!r} asked for turn {turn}; the script has {len(self.script)} replies"
            )
        if isinstance(reply, str):
            return ScriptedReply(text=reply)
        if isinstance(reply, ScriptedReply):
            return reply
        raise TypeError(f"script: a reply must be a str or ScriptedReply, got {type(reply).__name__}")

    def _generation(self, text: str, request: GenerationRequest) -> Generation:
        s = request.sampling
        finish = "stop"
        cut = min((text.find(stop) + len(stop) for stop in s.stop if stop in text), default=-1)
        if cut >= 0:  # like the hf engine: end with the stop string, no eos
            ids = self._encode(text[:cut])
        else:
            ids = self._encode(text) + (self._eos,)
        at = next((i for i, t in enumerate(ids) if t in request.stop_token_ids), None)
        if at is not None:  # like the hf engine: a stop token (gpt-oss <|call|>, ...) is the last id, no eos after it
            ids = ids[: at + 1]
        if len(ids) > s.max_tokens:
            ids, finish = ids[: s.max_tokens], "length"
        logprobs = tuple(scripted_logprob(t, i) for i, t in enumerate(ids))
        top = None
        if s.top_logprobs > 0:
            vocab = len(self.tokenizer)
            top = tuple(_alternatives(t, lp, s.top_logprobs, vocab) for t, lp in zip(ids, logprobs))
        return Generation(ids, logprobs, finish, self.policy_version, top)

    def _encode(self, text: str) -> tuple[int, ...]:
        ids = self._encoded.get(text)
        if ids is None:
            ids = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            if len(self._encoded) < 4096:  # scripts repeat a few replies; keep the cache bounded
                self._encoded[text] = ids
        return ids


def _alternatives(token: int, logprob: float, k: int, vocab: int) -> tuple[tuple[int, float], ...]:
    """The sampled token first, then k-1 deterministic lower-scored neighbours."""
    rest = tuple(((token + i) % vocab, logprob - i) for i in range(1, k))
    return ((token, logprob),) + rest


__all__ = [
    "ScriptExhausted",
    "ScriptedEngine",
    "ScriptedFailure",
    "ScriptedReply",
    "scripted_logprob",
]
