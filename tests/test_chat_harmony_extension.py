"""gpt-oss (harmony) sequence extension across its reply terminators, through the real endpoint.

gpt-oss ends a call with ``<|call|>`` and a final answer with ``<|return|>``;
in history, openai-harmony keeps ``<|call|>`` and writes a past final answer
with ``<|end|>``. The format declares that (``history_terminators``), so a
rollout extends after either token with the new messages' ids alone: never
a break at a call, never an ``<|end|>`` invented after a ``<|return|>``. Where
deployment renders the history otherwise (``<|end|>`` for ``<|return|>``, a
call's header order, dropped analysis), ``deployed`` starts a new segment and
the drift check reports it.
"""

from __future__ import annotations

import json

import pytest

from _adapter_support import TOOLS, lookup, specs, tasks
from mtrl_runtime.algorithms.samples import build_samples
from mtrl_runtime.chat import ChatRenderer, PromptBuilder, normalize_messages, normalize_tools
from mtrl_runtime.chat.formats import CHAT_FORMATS, HARMONY, segment_drift
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.testing_formats import answer_text, call_text, family_tokenizer

FOLLOW_UP = "Now double the last one."


def _analysis(text: str) -> str:
    return f"<|channel|>analysis<|message|>{text}<|end|><|start|>assistant"


def _deployment_order_call(key: str) -> str:
    """A call written as deployment renders a past one (recipient first, content type json): no rewrite in history."""
    return f' to=functions.lookup<|channel|>commentary json<|message|>{json.dumps({"key": key})}<|call|>'


def model_policy(request, prompt):
    """5 calls as gpt-oss writes them (analysis first on every other one), an answer, then the follow-up's answer."""
    i = request.turn_index
    if i < 5:
        return (_analysis(f"need K1{i}") if i % 2 == 0 else "") + call_text("harmony", [("lookup", {"key": f"K1{i}"})])
    return answer_text("harmony", f"Done {i}. DONE", reasoning=f"all looked up {i}")


def plain_policy(request, prompt):
    """Calls in deployment's order and answers without analysis: the only rewrite left is <|return|> → <|end|>."""
    i = request.turn_index
    return _deployment_order_call(f"K1{i}") if i < 5 else answer_text("harmony", f"Done {i}. DONE")


def _rollout(served, policy, history: str, echo_reasoning: bool = True):
    """6 turns (5 calls, an answer), then a new user turn and its answer, through an OpenAI client on loopback."""
    import openai

    handle = served(ScriptedEngine(family_tokenizer("harmony"), policy), MtrlConfig.coerce(
        {"advanced": {"chat_format": "harmony", "history_training": history}}))
    [spec] = specs(handle, tasks(2)[1:])
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{spec.rollout_id}/v1", api_key=spec.token, max_retries=0)
    messages = [{"role": "user", "content": spec.task.prompt}]
    for turn in range(7):
        if turn == 6:
            messages.append({"role": "user", "content": FOLLOW_UP})
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        echoed = message.model_dump(exclude_none=True)
        if not echo_reasoning:  # Strands and LangGraph send back content and tool calls only
            echoed.pop("reasoning_content", None)
        messages.append(echoed)
        for call in message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "name": "lookup",
                             "content": str(lookup(**json.loads(call.function.arguments)))})
    assert [bool(m.get("tool_calls")) for m in messages if m["role"] == "assistant"] == [True] * 5 + [False] * 2
    # echoed, the analysis the template drops before a new user turn reaches it
    assert any("reasoning_content" in m for m in messages) == (echo_reasoning and policy is model_policy)
    return handle, handle.store.get_rollout(spec.rollout_id)


def _deployed_ids(renderer, turn):
    return tuple(renderer.encode(renderer.render(normalize_messages(turn.messages), normalize_tools(turn.tools))))


@pytest.mark.parametrize("echo_reasoning", [True, False])
def test_calls_an_answer_and_a_new_user_turn_extend_one_sequence_of_what_the_model_generated(served, echo_reasoning):
    handle, rollout = _rollout(served, model_policy, "extend", echo_reasoning)
    turns, renderer = rollout.turns, handle.coordinator.renderer
    assert len(turns) == 7 and [t.break_reason for t in turns] == [None] * 7 and {t.segment for t in turns} == {0}
    assert not [k for k in handle.coordinator.counters if k.startswith("prefix_break/")]
    ends = [renderer.decode(t.completion_ids[-1:]) for t in turns]
    assert ends == ["<|call|>"] * 5 + ["<|return|>"] * 2
    for prev, turn in zip(turns, turns[1:]):
        context = prev.prompt_ids + prev.completion_ids
        assert turn.prompt_ids[: len(context)] == context  # the engine's own ids, terminator included
        new = renderer.decode(turn.prompt_ids[len(context):])  # then the new messages' ids only, no glue
        if prev.tool_calls:
            assert new == (f"<|start|>functions.lookup to=assistant<|channel|>commentary<|message|>"
                           f"{turn.messages[-1]['content']}<|end|><|start|>assistant")
        else:
            assert new == f"<|start|>user<|message|>{FOLLOW_UP}<|end|><|start|>assistant"
    [sample] = build_samples(rollout, [1.0] * len(turns))
    trained = [i for i, m in zip(sample.token_ids_T, sample.loss_mask_T) if m]
    assert trained == [i for t in turns for i in t.completion_ids]  # trained ids = what the model generated
    assert sample.token_ids_T == turns[-1].prompt_ids + turns[-1].completion_ids


def test_trained_as_deployed_a_call_extends_id_for_id_and_the_rewritten_return_starts_a_segment(served):
    handle, rollout = _rollout(served, plain_policy, "deployed")
    turns, renderer = rollout.turns, handle.coordinator.renderer
    reasons = [None if t.break_reason is None else t.break_reason.value for t in turns]
    assert reasons == [None] * 6 + ["reply_rendered_differently"] and [t.segment for t in turns] == [0] * 6 + [1]
    for prev, turn in zip(turns, turns[1:6]):  # after each <|call|>: no break, no extra token, deployment's ids
        context = prev.prompt_ids + prev.completion_ids
        assert turn.prompt_ids[: len(context)] == context and turn.prompt_ids == _deployed_ids(renderer, turn)
    # after <|return|>, deployment renders the answer ending <|end|>: the new segment is deployment's rendering
    assert turns[6].prompt_ids == _deployed_ids(renderer, turns[6])
    assert "<|channel|>final<|message|>Done 5. DONE<|end|><|start|>user" in renderer.decode(turns[6].prompt_ids)
    assert all(d.equal for d in segment_drift(renderer, turns))


def test_extended_the_rewritten_return_is_the_drift_check_reports(served, tmp_path, capsys):
    from transformers import LlamaConfig

    from mtrl_runtime.cli import main

    handle, rollout = _rollout(served, plain_policy, "extend")
    turns, renderer = rollout.turns, handle.coordinator.renderer
    assert [t.break_reason for t in turns] == [None] * 7
    end, ret = (renderer.encode(t)[0] for t in ("<|end|>", "<|return|>"))
    trained, deployed = list(turns[-1].prompt_ids), list(_deployed_ids(renderer, turns[-1]))
    assert len(trained) == len(deployed) and [(a, b) for a, b in zip(trained, deployed) if a != b] == [(ret, end)]
    [seg] = segment_drift(renderer, turns)
    assert seg.differing_tokens == 2 and "<|return|>" in seg.first_difference.split("deployed")[0]
    assert "<|end|>" in seg.first_difference.split("deployed")[1]
    handle.store.flush()
    model_dir = tmp_path / "gpt-oss-like"
    family_tokenizer("harmony").save_pretrained(model_dir)
    LlamaConfig(vocab_size=600, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(model_dir)
    status = main(["check", "template", "--store", str(tmp_path / "store0.db"), "--model", str(model_dir), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 1 and report["chat_format"] == "harmony" and not report["equal"]
    assert [s["differing_tokens"] for s in report["segments"]] == [2]
    assert report["drift_fraction"] == pytest.approx(2 / len(trained))


def _builder(name: str, history: str = "extend") -> PromptBuilder:
    fmt = CHAT_FORMATS.get(name)
    return PromptBuilder(ChatRenderer(family_tokenizer(name), fallback=fmt.template, stop_tokens=fmt.stop_tokens,
                                      history_terminators=fmt.history_terminators), history)


def test_the_renderer_adds_no_glue_after_a_declared_terminator_and_the_close_after_a_cut_reply():
    renderer = _builder("harmony").renderer
    ids = renderer.encode
    assert renderer.reply_close(ids("<|channel|>final<|message|>Hi<|return|>")) == ("", ("<|end|>", "<|return|>"))
    assert renderer.reply_close(ids(call_text("harmony", [("lookup", {"key": "A1"})]))) == ("", ("<|call|>",))
    assert renderer.reply_close(ids("<|channel|>final<|message|>cut of")) == ("<|end|>", ("<|end|>",))
    assert dict(HARMONY.history_terminators) == {"<|call|>": "<|call|>", "<|return|>": "<|end|>"}
    for name in ("hermes", "mistral", "qwen3_coder", "deepseek_v3"):  # their eos starts the template's close
        assert CHAT_FORMATS.get(name).history_terminators == ()


def test_a_length_cut_harmony_answer_is_closed_as_the_template_closes_it():
    builder = _builder("harmony")
    request = [{"role": "user", "content": "Count."}]
    plan = builder.build(None, request)
    cut = builder.renderer.encode("<|channel|>final<|message|>One, two")
    state = builder.advance(None, plan, request, None, cut, "length", {"role": "assistant", "content": "One, two"})
    follow = [*request, {"role": "assistant", "content": "One, two"}, {"role": "user", "content": "Go on."}]
    nxt = builder.build(state, follow)
    assert nxt.break_reason is None
    assert builder.renderer.decode(nxt.prompt_ids[len(state.context_ids):]) == (
        "<|end|><|start|>user<|message|>Go on.<|end|><|start|>assistant")


def test_a_llama_call_ended_by_eom_is_followed_by_the_result_without_an_invented_eot():
    builder = _builder("llama3_json")
    tools = normalize_tools(TOOLS)
    request = [{"role": "user", "content": "Look up A1."}]
    plan = builder.build(None, request, tools)
    ids = builder.renderer.encode('<|python_tag|>{"name": "lookup", "parameters": {"key": "A1"}}<|eom_id|>')
    reply = {"role": "assistant", "content": "",
             "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "A1"}'}}]}
    state = builder.advance(None, plan, request, tools, ids, "tool_calls", reply)
    nxt = builder.build(state, [*request, reply, {"role": "tool", "tool_call_id": "c1", "content": "42"}], tools)
    assert nxt.break_reason is None and nxt.prompt_ids[: len(state.context_ids)] == state.context_ids
    assert builder.renderer.decode(nxt.prompt_ids[len(state.context_ids):]) == (
        "<|start_header_id|>ipython<|end_header_id|>\n\n42<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
