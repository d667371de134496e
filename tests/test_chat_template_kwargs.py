"""``chat_template_kwargs`` that change between the turns of one rollout break the sequence, with the reason recorded.

Kwargs may change what the template writes anywhere in the prompt (Qwen3's
``enable_thinking`` in the generation prompt, gpt-oss's ``reasoning_effort``
in the system message). Extending the previous turn's ids would keep what
the earlier kwargs rendered and silently ignore the new ones.
"""

from __future__ import annotations

import json

import pytest

from _adapter_support import TOOLS, lookup, specs, tasks
from mtrl_runtime.chat import ChatRenderer, PromptBuilder, normalize_messages, normalize_tools
from mtrl_runtime.chat.formats import CHAT_FORMATS
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.testing_formats import answer_text, call_text, family_tokenizer
from mtrl_runtime.types import BreakReason

QUESTION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is A1?"}]


def _turns(name: str, kwargs: list[dict | None]):
    """Plans of a rollout whose turn i is sent with ``kwargs[i]``; each reply is a final answer, then a user turn."""
    tokenizer = family_tokenizer(name)
    fmt = CHAT_FORMATS.get(name)
    renderer = ChatRenderer(tokenizer, fallback=fmt.template, stop_tokens=fmt.stop_tokens)
    builder = PromptBuilder(renderer)
    messages, state, plans = list(QUESTION), None, []
    for i, kw in enumerate(kwargs):
        plan = builder.build(state, messages, None, kw)
        completion = renderer.encode(answer_text(name, f"Answer {i}.")) + [tokenizer.eos_token_id]
        reply = fmt.parse(answer_text(name, f"Answer {i}.")).to_message()
        state = builder.advance(state, plan, messages, None, completion, "stop", reply)
        plans.append((plan, renderer.render(normalize_messages(messages), None, True, kw), renderer))
        messages += [reply, {"role": "user", "content": f"And then {i}?"}]
    return plans


def test_the_same_kwargs_every_turn_extend_one_sequence():
    plans = _turns("hermes", [{"enable_thinking": False}] * 3)
    assert [p.break_reason for p, _, _ in plans] == [None, None, None] and [p.segment for p, _, _ in plans] == [0, 0, 0]
    assert [p.template_kwargs for p, _, _ in plans] == [{"enable_thinking": False}] * 3
    # no kwargs and empty kwargs are the same request
    assert [p.break_reason for p, _, _ in _turns("hermes", [None, {}, None])] == [None, None, None]


@pytest.mark.parametrize("name, before, after, written", [
    ("hermes", {"enable_thinking": False}, {"enable_thinking": True}, None),
    ("hermes", None, {"enable_thinking": False}, "<think>\n\n</think>"),
    ("harmony", {"reasoning_effort": "low"}, {"reasoning_effort": "high"}, "Reasoning: high"),
])
def test_changed_kwargs_start_a_new_segment_rendered_with_the_new_kwargs(name, before, after, written):
    plans = _turns(name, [before, before, after, after])
    assert [p.break_reason for p, _, _ in plans] == [None, None, BreakReason.TEMPLATE_KWARGS_CHANGED, None]
    assert [p.segment for p, _, _ in plans] == [0, 0, 1, 1]
    plan, text, renderer = plans[2]
    assert plan.prompt_ids == tuple(renderer.encode(text)) and plan.new_token_count == len(plan.prompt_ids)
    assert plan.template_kwargs == after
    if written:  # what the new kwargs write is in the prompt the engine is given
        assert written in renderer.decode(plan.prompt_ids) and written not in renderer.decode(plans[1][0].prompt_ids)


def test_the_endpoint_records_the_break_on_the_turn_and_counts_it(served):
    import openai

    def policy(request, prompt: str) -> str:
        if request.turn_index == 0:
            return call_text("hermes", [("lookup", {"key": "K01"})])
        return answer_text("hermes", f"Done {request.turn_index}.")

    handle = served(ScriptedEngine(family_tokenizer("hermes"), policy), MtrlConfig.coerce({"advanced": {"chat_format": "hermes"}}))
    [spec] = specs(handle, tasks(2)[1:])
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{spec.rollout_id}/v1", api_key=spec.token, max_retries=0)
    messages = [{"role": "user", "content": spec.task.prompt}]
    for kw in ({"enable_thinking": False}, {"enable_thinking": False}, {"enable_thinking": True}):
        sent = list(messages)
        message = client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS, extra_body={"chat_template_kwargs": kw}).choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                             "content": str(lookup(**json.loads(call.function.arguments)))})
        if not message.tool_calls:
            messages.append({"role": "user", "content": "Once more."})
    turns = handle.store.get_rollout(spec.rollout_id).turns
    assert [t.break_reason for t in turns] == [None, None, BreakReason.TEMPLATE_KWARGS_CHANGED]
    assert [t.segment for t in turns] == [0, 0, 1]
    assert handle.coordinator.counters["prefix_break/template_kwargs_changed"] == 1
    renderer = handle.coordinator.renderer
    last = renderer.render(normalize_messages(sent), normalize_tools(TOOLS), True, {"enable_thinking": True})
    assert turns[2].prompt_ids == tuple(renderer.encode(last))  # the whole prompt rendered with the new kwargs
