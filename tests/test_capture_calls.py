"""``CallCapture``'s per-call shortcuts keep what they replace: ``PolicyCall.settled`` every field, and the
remembered reasoning opener what decoding the prompt's tail finds."""

from __future__ import annotations

import dataclasses
import types

from mtrl_runtime.chat.formats import opened_reasoning
from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.coordinator._capture import PolicyCall
from mtrl_runtime.coordinator._rendering import OPENER_TAIL_TOKENS
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.store.memory import MemoryStore
from mtrl_runtime.testing import tiny_tokenizer
from mtrl_runtime.types import ChatOptions, SamplingParams


def test_settled_keeps_every_other_field():
    """A field added to ``PolicyCall`` and left out of ``settled`` fails here (a call would lose it silently)."""
    call = PolicyCall(rollout_id="r", token="t", messages=[{"role": "user", "content": "a"}], tools=None,
                      sampling=SamplingParams(temperature=0.5), options=None, stream=object(), respond=object(),
                      off_loop=True)
    fields = [f.name for f in dataclasses.fields(PolicyCall)]
    call = dataclasses.replace(call, **{f.name: object() for f in dataclasses.fields(PolicyCall)
                                        if f.name not in ("messages", "tools", "options")})
    messages, tools, options = [{"role": "user", "content": "b"}], [{"type": "function"}], ChatOptions(token_ids=True)
    settled = call.settled(messages, tools, options)
    assert settled == dataclasses.replace(call, messages=messages, tools=tools, options=options)
    for name in fields:
        if name not in ("messages", "tools", "options"):
            assert getattr(settled, name) is getattr(call, name), name


def test_remembered_opener_is_the_decoded_tails():
    coordinator = Coordinator(ScriptedEngine(tiny_tokenizer(), lambda request, prompt: "DONE"), MemoryStore())
    rendering = coordinator._capture.rendering
    renderer = rendering.renderer
    assert rendering.format.reasoning_openers  # the tiny tokenizer's format opens reasoning: the cache is used
    prompts = [renderer.render([{"role": "user", "content": "hi"}], None, True),
               renderer.render([{"role": "user", "content": "hi"}], None, True) + "<think>\n",
               "<think>\n", "x"]
    for _ in range(2):  # decoded, then remembered
        for text in prompts:
            ids = renderer.encode(text)
            expected = opened_reasoning(rendering.format, renderer.decode(ids[-OPENER_TAIL_TOKENS:]))
            assert rendering.opened_reasoning(ids) == expected, text
    assert any(rendering.opened_reasoning(renderer.encode(t)) for t in prompts)  # an opener is found at all
    assert len(rendering._openers) <= len(prompts)


def test_no_openers_decodes_nothing(monkeypatch):
    coordinator = Coordinator(ScriptedEngine(tiny_tokenizer(), lambda request, prompt: "DONE"), MemoryStore())
    rendering = coordinator._capture.rendering
    monkeypatch.setattr(rendering, "format", types.SimpleNamespace(reasoning_openers=()))
    monkeypatch.setattr(rendering.renderer, "decode", lambda ids: (_ for _ in ()).throw(AssertionError("decoded")))
    assert rendering.opened_reasoning((1, 2, 3)) is None
