"""The newest families against their published chat templates (``tests/data/templates/``, sources in SOURCES.md).

Each tokenizer here is the family's tiny test tokenizer carrying the
published template text, so the endpoint renders with the real template as
a deployment of that model would. Checked: the project's own template of
each format renders what the published one renders; detection from the
published text picks the format (a Qwen3.6 template also writes Qwen3-Coder's
``<function=`` calls); rollouts served through the real template train
token-exact under ``history_training: deployed`` and as one sequence under
``extend``, where ``mtrl check template`` reports the drift the real
template causes (Qwen3.5 re-renders thinking the client did not send back,
Gemma 4 never shows the generation prompt's empty thought block); and
``preserve_thinking`` keeps Qwen3.6's earlier reasoning.
"""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest

from _adapter_support import TOOLS, lookup, specs, tasks
from mtrl_runtime.algorithms.samples import build_samples
from mtrl_runtime.chat import CHAT_TEMPLATE_META, ChatRenderer, normalize_messages, normalize_tools
from mtrl_runtime.chat.formats import CHAT_FORMATS, detect_format, segment_drift
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.testing_formats import answer_text, call_text, family_tokenizer

TEMPLATES = Path(__file__).parent / "data" / "templates"
PUBLISHED = {  # file -> the format it belongs to
    "qwen3_6.jinja": "qwen3_5",
    "qwen3_5_think.jinja": "qwen3_5",
    "qwen3_5_nothink.jinja": "qwen3_5",
    "google-gemma-4-31B-it.jinja": "gemma4",
    "google-gemma-4-31B-it-interleaved.jinja": "gemma4",
}
REFERENCE = {"qwen3_5": "qwen3_6.jinja", "gemma4": "google-gemma-4-31B-it.jinja"}  # what each format renders as


def published(file: str) -> str:
    return (TEMPLATES / file).read_text()


def test_every_published_template_is_kept_with_its_source_and_licence():
    sources = (TEMPLATES / "SOURCES.md").read_text()
    for file in PUBLISHED:
        assert file in sources and published(file).strip()
    assert (TEMPLATES / "LICENSE-trl-Apache-2.0").read_text().lstrip().startswith("Apache License")
    assert (TEMPLATES / "LICENSE-llama.cpp-MIT").read_text().startswith("MIT License")


# ---------------------------------------------------------------------------------------------- detection
@pytest.mark.parametrize("file", sorted(PUBLISHED))
def test_detection_from_the_published_template_picks_the_format(file):
    name = PUBLISHED[file]
    tok = family_tokenizer(name, template=published(file))
    assert detect_format(tok).name == name


@pytest.mark.parametrize("file", ["qwen3_6.jinja", "qwen3_5_think.jinja", "qwen3_5_nothink.jinja"])
def test_a_qwen3_5_template_on_a_chatml_tokenizer_is_not_taken_for_qwen3_coder_or_hermes(file):
    """The case detection used to get wrong: the template writes <function= calls, as Qwen3-Coder's does, and thinks."""
    tok = family_tokenizer("hermes", template=published(file))  # ChatML's tokens, which alone mean hermes
    assert CHAT_FORMATS.get("qwen3_coder").detect(tok) and CHAT_FORMATS.get("hermes").detect(tok)
    assert detect_format(tok).name == "qwen3_5"
    # and Qwen3-Coder's own template (no thinking) stays qwen3_coder
    assert detect_format(family_tokenizer("qwen3_coder")).name == "qwen3_coder"


# ---------------------------------------------------------------------------------------------- rendering
TOOL = TOOLS[0]
RICH = {"type": "function", "function": {"name": "search", "description": "Search", "parameters": {
    "type": "object", "properties": {
        "query": {"type": "string", "description": "What to find"},
        "mode": {"type": "string", "enum": ["fast", "deep"]},
        "limit": {"type": "integer", "description": "Max", "nullable": True},
        "tags": {"type": "array", "items": {"type": "string"}},
        "rows": {"type": "array", "items": {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}},
        "filter": {"type": "object", "properties": {"field": {"type": "string"}}, "required": ["field"]},
        "flag": {"type": "boolean"}},
    "required": ["query"]}}}


def _call(i, name, args):
    return {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}


CONVERSATIONS = {
    "tool_loop": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Value of A1?"},
        {"role": "assistant", "content": "", "reasoning_content": "Need the tool.", "tool_calls": [_call(1, "lookup", {"key": "A1"})]},
        {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "42"},
        {"role": "assistant", "content": "It is 42.", "reasoning_content": "Got it."}],
    "parallel_then_second_question": [
        {"role": "user", "content": "Find things"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            _call(1, "lookup", {"key": "A1"}),
            _call(2, "search", {"query": "x y", "limit": 3, "tags": ["a", "b"], "filter": {"field": "f"}})]},
        {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "42"},
        {"role": "tool", "tool_call_id": "c2", "name": "search", "content": "[1, 2]"},
        {"role": "assistant", "content": "", "tool_calls": [_call(3, "lookup", {"key": "B2"})]},
        {"role": "tool", "tool_call_id": "c3", "name": "lookup", "content": "7"},
        {"role": "assistant", "content": "Done: 42 and 7."},
        {"role": "user", "content": "And C3?"},
        {"role": "assistant", "content": "", "reasoning_content": "again", "tool_calls": [_call(4, "lookup", {"key": "C3"})]},
        {"role": "tool", "tool_call_id": "c4", "name": "lookup", "content": "9"}],
    "plain": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": " Bye "}],
    "system_only": [{"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}],
}
KWARGS = [{}, {"enable_thinking": False}, {"enable_thinking": True}, {"preserve_thinking": True}]


def _renders(renderer: ChatRenderer):
    for conv_name, conversation in CONVERSATIONS.items():
        for tools in ([], [TOOL, RICH]):
            for generation in (False, True):
                for kwargs in KWARGS:
                    text = renderer.render(normalize_messages(conversation), normalize_tools(tools), generation, kwargs)
                    yield (conv_name, len(tools), generation, tuple(kwargs.items())), text


@pytest.mark.parametrize("name", ["qwen3_5", "gemma4"])
def test_the_format_template_renders_what_the_published_template_renders(name):
    tok = family_tokenizer(name)
    ours = dict(_renders(ChatRenderer(tok, template=CHAT_FORMATS.get(name).template)))
    theirs = dict(_renders(ChatRenderer(tok, template=published(REFERENCE[name]))))
    assert len(ours) == 4 * 2 * 2 * len(KWARGS)
    differing = [case for case in ours if ours[case] != theirs[case]]
    assert not differing, differing[:3]


def test_qwen3_5_differs_from_qwen3_6_only_in_booleans_and_preserve_thinking():
    """Qwen3.5 writes a call's non-string values with Python's str (True), and has no preserve_thinking."""
    tok = family_tokenizer("qwen3_5")
    ours = dict(_renders(ChatRenderer(tok, template=CHAT_FORMATS.get("qwen3_5").template)))
    think = dict(_renders(ChatRenderer(tok, template=published("qwen3_5_think.jinja"))))
    nothink = dict(_renders(ChatRenderer(tok, template=published("qwen3_5_nothink.jinja"))))
    for case, text in ours.items():
        kwargs = dict(case[3])
        if "preserve_thinking" in kwargs:
            continue
        assert think[case] == text, case  # no boolean argument in these conversations: the same text
        if case[2] and "enable_thinking" not in kwargs:  # the 2B and smaller default to thinking off
            assert nothink[case] == text.removesuffix("<think>\n") + "<think>\n\n</think>\n\n"
        else:
            assert nothink[case] == text, case
    flagged = normalize_messages([{"role": "user", "content": "Go"}, {"role": "assistant", "content": "", "tool_calls": [
        _call(1, "search", {"query": "q", "flag": True})]}])
    assert "<parameter=flag>\ntrue\n" in ChatRenderer(tok, template=published("qwen3_6.jinja")).render(flagged, None, False)
    assert "<parameter=flag>\nTrue\n" in ChatRenderer(tok, template=published("qwen3_5_think.jinja")).render(flagged, None, False)


# ---------------------------------------------------------------------------------------------- serving and training
def _tool_loop(served, name, *, history, thinking, echo_reasoning, template_kwargs=None, follow_up=False):
    """A tool loop (3 calls, an answer; with ``follow_up`` a second question and one more call and answer) served
    through the published template. Returns (handle, renderer, turns)."""
    tok = family_tokenizer(name, template=published(REFERENCE[name]))

    def policy(request, prompt):
        reasoning = f"turn {request.turn_index}: think." if thinking else None
        if request.turn_index in (0, 1, 2, 4):
            head = answer_text(name, "", reasoning).removesuffix("<turn|>") if reasoning else ""
            call = call_text(name, [("lookup", {"key": f"K1{request.turn_index}"})])
            return head + (call.removeprefix("\n</think>\n\n") if head else call)
        return answer_text(name, "Done. DONE", reasoning)

    # no chat_format in the config: the endpoint detects it from the published template, as it would for the model
    handle = served(ScriptedEngine(tok, policy), MtrlConfig.coerce({"advanced": {"history_training": history}}))
    assert handle.store.get_meta(CHAT_TEMPLATE_META) == {"chat_format": name, "template": published(REFERENCE[name])}
    [spec] = specs(handle, tasks(2)[1:])
    client = openai.OpenAI(base_url=f"{handle.url}/rollouts/{spec.rollout_id}/v1", api_key=spec.token, max_retries=0)
    messages = [{"role": "user", "content": spec.task.prompt}]
    extra = {"extra_body": {"chat_template_kwargs": template_kwargs}} if template_kwargs else {}
    for turn in range(6 if follow_up else 4):
        if turn == 4:
            messages.append({"role": "user", "content": "And K14?"})
        message = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, **extra).choices[0].message
        echoed = message.model_dump(exclude_none=True)
        if not echo_reasoning:  # Strands and LangGraph send back content and tool calls only
            echoed.pop("reasoning_content", None)
        if thinking and echo_reasoning:
            assert echoed["reasoning_content"] == f"turn {turn}: think."
        messages.append(echoed)
        for call in message.tool_calls or ():
            messages.append({"role": "tool", "tool_call_id": call.id, "name": "lookup",
                             "content": str(lookup(**json.loads(call.function.arguments)))})
    assert message.content == "Done. DONE" and not message.tool_calls
    turns = handle.store.get_rollout(spec.rollout_id).turns
    assert not any(t.malformed_tool_call for t in turns)
    return handle, handle.coordinator.renderer, turns


def _check_samples_are_the_turns(handle, turns):
    """One sample per segment: its ids are the segment's last prompt + completion, its loss on the model's ids only."""
    rollout = handle.store.get_rollout(turns[0].rollout_id)
    samples = build_samples(rollout, [1.0] * len(turns))
    assert len(samples) == len({t.segment for t in turns})
    for sample in samples:
        seg = [t for t in turns if t.segment == sample.segment]
        assert tuple(sample.token_ids_T) == tuple(seg[-1].prompt_ids) + tuple(seg[-1].completion_ids)
        assert sum(sample.loss_mask_T) == sum(len(t.completion_ids) for t in seg)
    return samples


def test_qwen3_5_thinking_echoed_back_trains_one_sequence_exactly_as_deployed(served):
    handle, renderer, turns = _tool_loop(served, "qwen3_5", history="extend", thinking=True, echo_reasoning=True)
    assert {t.segment for t in turns} == {0} and [t.break_reason for t in turns] == [None] * 4
    [seg] = segment_drift(renderer, turns)
    assert seg.equal and seg.turns == 4, seg.first_difference
    _check_samples_are_the_turns(handle, turns)


@pytest.mark.parametrize("name", ["qwen3_5", "gemma4"])
def test_trained_as_deployed_every_segment_equals_the_published_rendering(served, name):
    handle, renderer, turns = _tool_loop(served, name, history="deployed", thinking=True, echo_reasoning=False)
    drifts = segment_drift(renderer, turns)
    assert all(d.equal for d in drifts), [d.first_difference for d in drifts]
    assert handle.coordinator.template_drift([handle.store.get_rollout(turns[0].rollout_id)]) == 0.0
    samples = _check_samples_are_the_turns(handle, turns)
    if name == "qwen3_5":  # each call's reasoning is re-rendered empty: every turn is its own segment
        assert len(samples) == 4
    else:  # the first prompt's empty thought block and each call's thought (not sent back) are gone from history
        assert [t.break_reason is None for t in turns] == [True, False, False, False]
        assert len(samples) == 4


@pytest.mark.parametrize("name", ["qwen3_5", "gemma4"])
def test_extended_as_generated_the_drift_is_measured_and_mtrl_check_template_reports_it(served, name, tmp_path, capsys):
    from transformers import LlamaConfig

    from mtrl_runtime.cli import main

    handle, renderer, turns = _tool_loop(served, name, history="extend", thinking=True, echo_reasoning=False)
    assert {t.segment for t in turns} == {0}
    [seg] = segment_drift(renderer, turns)
    assert not seg.equal and 0 < seg.fraction < 1
    trained, deployed = seg.first_difference.split("deployed")
    if name == "qwen3_5":  # the client dropped the reasoning: deployment renders each call's <think> empty
        assert "turn 0: think." in trained and "turn 0: think." not in deployed
    else:  # the first prompt's empty thought block, never rendered in history
        assert "<|channel>thought\n<channel|>" in renderer.decode(turns[0].prompt_ids)
        assert "<|channel>" in trained
    _check_samples_are_the_turns(handle, turns)

    handle.store.flush()
    model_dir = tmp_path / f"{name}-like"
    handle.coordinator.renderer.tokenizer.save_pretrained(model_dir)
    LlamaConfig(vocab_size=600, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                num_attention_heads=2).save_pretrained(model_dir)
    store_path = str(Path(handle.store.path))
    status = main(["check", "template", "--store", store_path, "--model", str(model_dir), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert status == 1 and report["chat_format"] == name and report["rollouts"] == 1 and not report["equal"]
    assert report["drift_fraction"] == pytest.approx(seg.fraction)


def test_qwen3_6_preserve_thinking_keeps_earlier_reasoning_and_extends_one_sequence(served):
    """After a second user question, Qwen3.6 drops the first question's reasoning unless preserve_thinking is true."""
    from mtrl_runtime.types import BreakReason

    handle, renderer, turns = _tool_loop(served, "qwen3_5", history="extend", thinking=True, echo_reasoning=True,
                                         follow_up=True)
    # the question's turns lose their <think> blocks once a new question follows: not a prefix, a new segment
    assert [t.break_reason for t in turns] == [None] * 4 + [BreakReason.TEMPLATE_NOT_PREFIX, None]
    assert "turn 0: think." not in renderer.decode(turns[4].prompt_ids)
    handle, renderer, turns = _tool_loop(served, "qwen3_5", history="extend", thinking=True, echo_reasoning=True,
                                         follow_up=True, template_kwargs={"preserve_thinking": True})
    assert [t.break_reason for t in turns] == [None] * 6
    last = turns[-1]  # stored turns do not keep the kwargs, so the deployment rendering is made here with them
    deployed = renderer.encode(renderer.render(normalize_messages(last.messages), normalize_tools(last.tools), True,
                                               {"preserve_thinking": True}))
    assert tuple(deployed) == tuple(last.prompt_ids)
    assert "turn 0: think." in renderer.decode(last.prompt_ids)
    _check_samples_are_the_turns(handle, turns)


# ---------------------------------------------------------------------------------------------- Gemma 4's call notation
GEMMA_CALLS = [  # what Gemma 4 writes -> the arguments as JSON
    ('call:get_time{city:<|"|>San Francisco<|"|>}', {"city": "San Francisco"}),
    ("call:empty_args{}", {}),
    ("call:f{n:42,neg:-7,x:3.14,big:1.5e10}", {"n": 42, "neg": -7, "x": 3.14, "big": 1.5e10}),
    ("call:toggle{on:true,off:false,none:null}", {"on": True, "off": False, "none": None}),
    ('call:todo{todos:[<|"|>buy milk<|"|>,<|"|>walk, dog<|"|>],empty:[]}', {"todos": ["buy milk", "walk, dog"], "empty": []}),
    ('call:cfg{config:{theme:<|"|>dark<|"|>,count:3,deep:{a:[1,{b:<|"|>}{<|"|>}]}},e:{}}',
     {"config": {"theme": "dark", "count": 3, "deep": {"a": [1, {"b": "}{"}]}}, "e": {}}),
    ('call:q{<|"|>quoted key<|"|>:1}', {"quoted key": 1}),
]


@pytest.mark.parametrize("body,arguments", GEMMA_CALLS)
def test_gemma4_reads_its_call_notation(body, arguments):
    fmt = CHAT_FORMATS.get("gemma4")
    parsed = fmt.parse("<|channel>thought\nPlan.<channel|>" + f"<|tool_call>{body}<tool_call|>" * 2 + "<|tool_response>")
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [arguments, arguments]
    assert parsed.tool_calls[0]["function"]["name"] == body[5:body.index("{")]
    assert parsed.content is None and parsed.reasoning == "Plan." and parsed.malformed == 0


def test_gemma4_history_renders_a_parsed_call_as_the_model_wrote_it():
    """Keys sorted, strings quoted with <|"|>, literals as written: the call round-trips through the published template."""
    fmt = CHAT_FORMATS.get("gemma4")
    written = '<|tool_call>call:f{a:<|"|>x<|"|>,b:[1,2],c:{d:true}}<tool_call|>'
    message = fmt.parse(written + "<|tool_response>").to_message()
    renderer = ChatRenderer(family_tokenizer("gemma4", template=published(REFERENCE["gemma4"])))
    history = renderer.render(normalize_messages([{"role": "user", "content": "Go"}, message]), None, False)
    assert history.endswith("<|turn>model\n" + written + "<|tool_response>")


def test_gemma4_with_thinking_enabled_extends_one_sequence_exactly_as_deployed(served):
    """enable_thinking: true puts <|think|> in the system turn and leaves the generation prompt bare: a tool loop
    whose calls carry no thought is then rendered in history exactly as generated (turn, calls, results, answer)."""
    kwargs = {"enable_thinking": True}
    handle, renderer, turns = _tool_loop(served, "gemma4", history="extend", thinking=False, echo_reasoning=True,
                                         template_kwargs=kwargs)
    assert [t.break_reason for t in turns] == [None] * 4
    last = turns[-1]  # stored turns do not keep the kwargs, so the deployment rendering is made here with them
    deployed = renderer.encode(renderer.render(normalize_messages(last.messages), normalize_tools(last.tools), True, kwargs))
    assert tuple(deployed) == tuple(last.prompt_ids) and "<|think|>" in renderer.decode(last.prompt_ids)
    _check_samples_are_the_turns(handle, turns)
