"""Engines stop on the chat format's stop tokens (gpt-oss ``<|call|>`` / ``<|return|>``, Llama ``<|eom_id|>``, ...).

The endpoint asks for them in ``GenerationRequest.stop_token_ids`` (the
renderer's ``stop_token_ids``); the hf engine stops there on a real tiny
model, the scripted engine ends its reply there, the vllm engine sends them
as vLLM's ``stop_token_ids``. A served rollout in each format ends each reply
at the format's stop token and parses the call before it.
"""

from __future__ import annotations

import json

import httpx
import pytest

from _adapter_support import TOOLS, specs, tasks
from mtrl_runtime.chat import ChatRenderer
from mtrl_runtime.chat.formats import CHAT_FORMATS
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import HFEngine, ScriptedEngine
from mtrl_runtime.engines.vllm import completion_body
from mtrl_runtime.testing import tiny_model
from mtrl_runtime.testing_formats import call_text, family_tokenizer
from mtrl_runtime.types import GenerationRequest, SamplingParams


def renderer(name: str) -> ChatRenderer:
    fmt = CHAT_FORMATS.get(name)
    return ChatRenderer(family_tokenizer(name), fallback=fmt.template, stop_tokens=fmt.stop_tokens)


def ids_of(tok, *tokens: str) -> frozenset[int]:
    return frozenset(tok.convert_tokens_to_ids(t) for t in tokens)


def test_each_format_stops_on_its_own_tokens_and_harmony_not_on_the_end_of_its_analysis():
    harmony = renderer("harmony")
    # gpt-oss writes <|end|> after its analysis and goes on to the final channel: only <|call|> and <|return|> stop it
    assert harmony.stop_token_ids == ids_of(harmony.tokenizer, "<|call|>", "<|return|>")
    assert harmony.tokenizer.convert_tokens_to_ids("<|end|>") in harmony.eos_token_ids - harmony.stop_token_ids
    llama = renderer("llama3_json")
    assert llama.stop_token_ids == ids_of(llama.tokenizer, "<|eom_id|>", "<|eot_id|>")
    hermes = renderer("hermes")  # names no stop tokens of its own: the eos and the template's close
    assert hermes.stop_token_ids == hermes.eos_token_ids == ids_of(hermes.tokenizer, "<|im_end|>")


async def test_hf_engine_stops_at_a_requested_stop_token_on_a_real_model():
    tok = family_tokenizer("harmony")
    model = tiny_model(tok)
    engine = HFEngine.from_objects(model, tok, eos_token_ids=())  # the model's own eos never stops it here
    try:
        prompt = tuple(tok.encode("What is the value for key A1?"))
        sampling = SamplingParams(temperature=1.0, max_tokens=12, seed=5)
        baseline = (await engine.generate(GenerationRequest(prompt, sampling))).completion_ids
        assert len(baseline) == 12
        stop = baseline[4]
        cut = baseline.index(stop)
        gen = await engine.generate(GenerationRequest(prompt, sampling, stop_token_ids=frozenset({stop})))
        assert gen.completion_ids == baseline[: cut + 1] and gen.finish_reason == "stop"
        assert len(gen.logprobs) == cut + 1
        other = await engine.generate(GenerationRequest(prompt, sampling))  # a request without them is unaffected
        assert other.completion_ids == baseline and other.finish_reason == "length"
    finally:
        await engine.close()


async def test_scripted_engine_ends_its_reply_at_the_first_stop_token():
    tok = family_tokenizer("harmony")
    text = call_text("harmony", [("lookup", {"key": "A1"})]) + "<|start|>assistant<|channel|>final<|message|>more"
    engine = ScriptedEngine(tok, [text, text])
    call = tok.convert_tokens_to_ids("<|call|>")
    prompt = tuple(tok.encode("hi"))
    gen = await engine.generate(GenerationRequest(prompt, SamplingParams(), stop_token_ids=frozenset({call})))
    assert gen.completion_ids[-1] == call and gen.finish_reason == "stop"
    assert tok.decode(gen.completion_ids, skip_special_tokens=False) == call_text("harmony", [("lookup", {"key": "A1"})])
    plain = await engine.generate(GenerationRequest(prompt, SamplingParams()))  # none asked: the whole text + eos
    assert plain.completion_ids[-1] == tok.eos_token_id and len(plain.completion_ids) > len(gen.completion_ids)


def test_vllm_request_carries_the_stop_token_ids():
    request = GenerationRequest((1, 2, 3), SamplingParams(max_tokens=8), stop_token_ids=frozenset({200012, 200002}))
    body = completion_body(request, "policy", max_model_len=64)
    assert body["stop_token_ids"] == [200002, 200012]
    assert "stop_token_ids" not in completion_body(GenerationRequest((1,), SamplingParams()), "policy", None)


@pytest.mark.parametrize(
    ("name", "stop", "tail"),
    [
        ("harmony", "<|call|>", "<|start|>assistant<|channel|>final<|message|>never sent"),
        ("llama3_json", "<|eom_id|>", "and then some more text"),
    ],
)
def test_a_served_rollout_ends_each_reply_at_the_format_stop_token(served, name, stop, tail):
    """The model writes on past its stop token; the endpoint's request makes the engine stop there, as a real one does."""
    tok = family_tokenizer(name)
    written = call_text(name, [("lookup", {"key": "K01"})]).removesuffix("<|call|>") + stop + tail
    handle = served(ScriptedEngine(tok, [written]), MtrlConfig.coerce({"advanced": {"chat_format": name}}))
    [spec] = specs(handle, tasks(2)[1:])
    reply = httpx.post(
        f"{handle.url}/rollouts/{spec.rollout_id}/v1/chat/completions",
        json={"model": "policy", "messages": [{"role": "user", "content": spec.task.prompt}], "tools": TOOLS},
        headers={"Authorization": f"Bearer {spec.token}"},
        timeout=30,
    ).json()["choices"][0]
    assert reply["finish_reason"] == "tool_calls"
    [call] = reply["message"]["tool_calls"]
    assert call["function"]["name"] == "lookup" and json.loads(call["function"]["arguments"]) == {"key": "K01"}
    [turn] = handle.store.get_rollout(spec.rollout_id).turns
    assert turn.completion_ids[-1] == tok.convert_tokens_to_ids(stop) and turn.finish_reason == "stop"
    assert tail not in turn.completion_text and tail not in tok.decode(turn.completion_ids)
