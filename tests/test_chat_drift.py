"""Train/serve drift: trained segments against the deployment template's rendering of the same conversation."""

from __future__ import annotations

import json

import pytest

from _adapter_support import TOOLS, lookup, specs, tasks
from mtrl_runtime.chat.formats import segment_drift
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.testing_formats import answer_text, call_text, family_tokenizer


def _rollout(served, name: str, thinking: bool, echo_reasoning: bool, history: str = "extend"):
    """A 4-turn tool loop (3 calls, an answer) through a plain OpenAI client; returns (handle, turns).

    ``history`` is ``advanced.history_training``: "extend" (one sequence; what drift is measured on) by default.
    """
    import openai

    def policy(request, prompt):
        reasoning = f"turn {request.turn_index}: think." if thinking else None
        if request.turn_index < 3:
            head = answer_text(name, "", reasoning) if reasoning and name != "harmony" else ""
            return head + call_text(name, [("lookup", {"key": f"K1{request.turn_index}"})])
        return answer_text(name, "Done. DONE", reasoning)

    handle = served(ScriptedEngine(family_tokenizer(name), policy), MtrlConfig.coerce(
        {"advanced": {"chat_format": name, "history_training": history}}))
    [spec] = specs(handle, tasks(2)[1:])
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{spec.rollout_id}/v1", api_key=spec.token, max_retries=0)
    messages = [{"role": "user", "content": spec.task.prompt}]
    for _ in range(4):
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS).choices[0].message
        echoed = message.model_dump(exclude_none=True)
        if not echo_reasoning:  # Strands and LangGraph send back content and tool calls only
            echoed.pop("reasoning_content", None)
        messages.append(echoed)
        for call in message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "name": "lookup",
                             "content": str(lookup(**json.loads(call.function.arguments)))})
    return handle, handle.store.get_rollout(spec.rollout_id).turns


def _drift(handle, turns):
    return segment_drift(handle.coordinator.renderer, turns)


def test_hermes_without_thinking_trains_exactly_what_deployment_renders(served):
    handle, turns = _rollout(served, "hermes", thinking=False, echo_reasoning=False)
    [seg] = _drift(handle, turns)
    assert seg.equal and seg.fraction == 0.0 and seg.first_difference is None and seg.turns == 4
    assert seg.trained_tokens == seg.deployed_tokens


def test_hermes_thinking_dropped_by_the_client_is_drift_and_the_first_difference_shows_it(served):
    handle, turns = _rollout(served, "hermes", thinking=True, echo_reasoning=False)
    [seg] = _drift(handle, turns)
    assert not seg.equal and seg.trained_tokens > seg.deployed_tokens
    assert 0 < seg.fraction < 1
    assert "<think>" in seg.first_difference.split("deployed")[0]  # the trained side has the thinking ...
    assert "turn 0: think." not in seg.first_difference.split("deployed")[1]  # ... the deployed side does not


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral", "harmony"])
def test_history_trained_as_deployed_has_no_drift(served, name):
    """Trained as deployed: a new segment wherever the template renders a reply unlike the generated ids."""
    handle, turns = _rollout(served, name, thinking=True, echo_reasoning=False, history="deployed")
    drifts = _drift(handle, turns)
    assert len(drifts) == 4 and all(d.equal for d in drifts), [d.first_difference for d in drifts]


def test_hermes_thinking_echoed_back_renders_as_generated(served):
    handle, turns = _rollout(served, "hermes", thinking=True, echo_reasoning=True)
    [seg] = _drift(handle, turns)
    assert seg.equal, seg.first_difference


def test_harmony_extends_one_sequence_and_the_calls_deployment_renders_otherwise_are_drift(served):
    handle, turns = _rollout(served, "harmony", thinking=True, echo_reasoning=False)
    assert [t.break_reason for t in turns] == [None] * 4 and {t.segment for t in turns} == {0}  # <|call|> extends
    [seg] = _drift(handle, turns)
    # gpt-oss writes a call's channel first ("<|channel|>commentary to=functions.lookup <|constrain|>json");
    # deployment renders a past call recipient first: trained as generated, and reported
    assert seg.turns == 4 and not seg.equal and 0 < seg.fraction < 1
    trained, deployed = seg.first_difference.split("deployed")
    assert "<|channel|>commentary" in trained and "assistant to=functions.lookup<|channel|>" in deployed


@pytest.mark.parametrize("name", ["qwen3_coder", "deepseek_v3"])
def test_formats_without_reasoning_in_play_have_no_drift(served, name):
    handle, turns = _rollout(served, name, thinking=False, echo_reasoning=False)
    [seg] = _drift(handle, turns)
    assert seg.equal, seg.first_difference


def test_llama_python_tag_the_template_does_not_render_is_reported(served):
    """Llama writes calls after <|python_tag|>; its JSON tool template renders them without: real drift, found."""
    handle, turns = _rollout(served, "llama3_json", thinking=False, echo_reasoning=False)
    [seg] = _drift(handle, turns)
    assert seg.trained_tokens - seg.deployed_tokens == 3 and seg.differing_tokens == 3  # one tag per call
    trained, deployed = seg.first_difference.split("deployed")
    assert "<|python_tag|>" in trained and "<|python_tag|>" not in deployed


def test_mtrl_check_template_reports_each_rollout_from_a_run_store(served, tmp_path, capsys):
    from transformers import LlamaConfig

    from mtrl_runtime.cli import main

    handle, turns = _rollout(served, "hermes", thinking=True, echo_reasoning=False)
    handle.store.flush()
    model_dir = tmp_path / "qwen3-like"
    family_tokenizer("hermes").save_pretrained(model_dir)
    LlamaConfig(vocab_size=600, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(model_dir)
    store_path = str(tmp_path / "store0.db")
    status = main(["check", "template", "--store", store_path, "--model", str(model_dir), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 1 and report["chat_format"] == "hermes" and report["rollouts"] == 1 and not report["equal"]
    [seg] = report["segments"]
    assert seg["rollout_id"] == turns[0].rollout_id and seg["turns"] == 4 and 0 < seg["fraction"] < 1
    assert "<think>" in seg["first_difference"]
    assert 0 < report["drift_fraction"] == pytest.approx(seg["differing_tokens"] / seg["trained_tokens"])
    status = main(["check", "template", "--store", store_path, "--model", str(model_dir)])
    text = capsys.readouterr().out
    assert status == 1 and "DIFF" in text and "1 differ from the deployment template" in text
    # the training loop's and the evaluator's figure is the same number (MeasuresTemplateDrift)
    rollout = handle.store.get_rollout(turns[0].rollout_id)
    assert handle.coordinator.template_drift([rollout]) == pytest.approx(report["drift_fraction"])


def test_the_drift_figure_is_zero_trained_as_deployed_and_counts_every_segment(served):
    from mtrl_runtime.types import MeasuresTemplateDrift

    handle, turns = _rollout(served, "hermes", thinking=True, echo_reasoning=False, history="deployed")
    assert isinstance(handle.coordinator, MeasuresTemplateDrift)
    clean = handle.store.get_rollout(turns[0].rollout_id)
    assert handle.coordinator.template_drift([clean]) == 0.0
    handle, turns = _rollout(served, "hermes", thinking=True, echo_reasoning=False)
    drifted = handle.store.get_rollout(turns[0].rollout_id)
    [seg] = _drift(handle, turns)
    assert seg.fraction > 0 and handle.coordinator.template_drift([drifted, drifted]) == pytest.approx(seg.fraction)
    assert handle.coordinator.template_drift([]) == 0.0
    # a large batch is measured on 32 rollouts, evenly spaced: here every other one, all of them drifted
    assert handle.coordinator.template_drift([drifted, clean] * 32) == pytest.approx(seg.fraction)
    assert 0 < handle.coordinator.template_drift([drifted, clean] * 16) < seg.fraction  # 32: all of them
