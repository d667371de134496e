"""Chat formats: detection, rendering, parsing and their errors, per model family, on tokenizers built here.

Each family's tokenizer (``testing_formats.family_tokenizer``) carries the
family's special tokens and the project's template of the family as its own
chat template; expected strings below follow each family's public format.
"""

from __future__ import annotations

import json

import pytest

from mtrl_runtime.chat import ChatRenderer, normalize_messages, normalize_tools, parse_tool_calls
from mtrl_runtime.chat.formats import CHAT_FORMATS, ChatFormat, ReasoningHistory, detect_format, resolve_format
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.testing_formats import FAMILY_TOKENS, answer_text, call_text, family_tokenizer

FORMATS = sorted(FAMILY_TOKENS)
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look up a key", "parameters": {
    "type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}}
TOOL_JSON = json.dumps(TOOL)
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Value of A1?"},
    {"role": "assistant", "content": "", "reasoning_content": "Need the tool.",
     "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "A1"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "42"},
    {"role": "assistant", "content": "It is 42.", "reasoning_content": "Got it."},
]
NESTED = {"query": {"filters": [{"field": "naïve café ☕", "op": "in", "values": [1, 2.5, None, True]}], "deep": {"a": {"b": []}}},
          "note": "ünïcödé — 漢字"}


@pytest.fixture(scope="module")
def toks():
    return {name: family_tokenizer(name) for name in FORMATS}


def test_registry_holds_every_format_and_each_satisfies_the_protocol():
    assert CHAT_FORMATS.names() == [
        "deepseek_v3", "gemma4", "harmony", "hermes", "llama3_json", "mistral", "qwen3_5", "qwen3_coder"]
    for name in CHAT_FORMATS:
        fmt = CHAT_FORMATS.get(name)
        assert isinstance(fmt, ChatFormat) and fmt.name == name
        assert isinstance(fmt.reasoning_history, ReasoningHistory)
    assert CHAT_FORMATS.get("llama3_json").reasoning_history is ReasoningHistory.NONE
    assert CHAT_FORMATS.get("hermes").reasoning_history is ReasoningHistory.DROPPED


@pytest.mark.parametrize("name", FORMATS)
def test_each_family_tokenizer_is_detected_as_its_format(toks, name):
    assert detect_format(toks[name]).name == name
    assert resolve_format(toks[name], None, "some/model").name == name


@pytest.mark.parametrize("name", FORMATS)
def test_a_forced_named_call_extends_the_forced_call_and_names_the_tool(name):
    fmt = CHAT_FORMATS.get(name)
    unnamed = fmt.forced_prefix(None)
    assert unnamed.startswith(fmt.tool_call_opener)
    named = fmt.forced_prefix("lookup_v2")
    assert named.startswith(unnamed) and "lookup_v2" in named[len(unnamed):]


def test_the_project_tiny_tokenizer_is_hermes_and_renders_as_before(tiny_tok):
    from mtrl_runtime.chat import CHATML_TOOLS_TEMPLATE

    assert detect_format(tiny_tok).name == "hermes"
    fmt = CHAT_FORMATS.get("hermes")
    assert ChatRenderer(tiny_tok, fallback=fmt.template).template == CHATML_TOOLS_TEMPLATE == fmt.template


def test_undetectable_model_fails_naming_the_model_and_the_choices():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({"[UNK]": 0, "</s>": 1, "hello": 2}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="</s>", unk_token="[UNK]")
    with pytest.raises(ValueError) as err:
        resolve_format(tok, None, "acme/mystery-7b")
    message = str(err.value)
    assert "acme/mystery-7b" in message and "advanced.chat_format" in message
    assert all(name in message for name in FORMATS)
    # the same model with the format set starts
    assert resolve_format(tok, "mistral", "acme/mystery-7b").name == "mistral"
    # and so does the coordinator, which resolves it at startup
    from mtrl_runtime.coordinator import Coordinator
    from mtrl_runtime.engines import ScriptedEngine
    from mtrl_runtime.store import MemoryStore

    with pytest.raises(ValueError, match="acme/mystery-7b"):
        Coordinator(ScriptedEngine(tok, ["hi"]), MemoryStore(), MtrlConfig.coerce({"core": {"model": "acme/mystery-7b"}}))


def test_unknown_chat_format_in_config_is_an_error_listing_known_names():
    with pytest.raises(ValueError) as err:
        MtrlConfig.coerce({"advanced": {"chat_format": "llama3"}})
    assert "advanced.chat_format" in str(err.value) and "'llama3'" in str(err.value)
    assert all(name in str(err.value) for name in FORMATS)
    assert MtrlConfig.coerce({"advanced": {"chat_format": "harmony"}}).advanced.chat_format == "harmony"


# ---------------------------------------------------------------------------------------------- rendering
EXPECTED_RENDER = {
    'hermes': (
        '<|im_start|>system\n'
        'Be brief.\n'
        '\n'
        '# Tools\n'
        '\n'
        'You may call one or more functions to assist with the user query.\n'
        '\n'
        'You are provided with function signatures within <tools></tools> XML tags:\n'
        '<tools>\n'
        '' + TOOL_JSON + '\n'
        '</tools>\n'
        '\n'
        'For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n'
        '<tool_call>\n'
        '{"name": <function-name>, "arguments": <args-json-object>}\n'
        '</tool_call><|im_end|>\n'
        '<|im_start|>user\n'
        'Value of A1?<|im_end|>\n'
        '<|im_start|>assistant\n'
        '<think>\n'
        'Need the tool.\n'
        '</think>\n'
        '\n'
        '<tool_call>\n'
        '{"name": "lookup", "arguments": {"key": "A1"}}\n'
        '</tool_call><|im_end|>\n'
        '<|im_start|>user\n'
        '<tool_response>\n'
        '42\n'
        '</tool_response><|im_end|>\n'
        '<|im_start|>assistant\n'
        '<think>\n'
        'Got it.\n'
        '</think>\n'
        '\n'
        'It is 42.<|im_end|>\n'
    ),
    'qwen3_coder': (
        '<|im_start|>system\n'
        'Be brief.\n'
        '\n'
        '# Tools\n'
        '\n'
        'You have access to the following functions:\n'
        '\n'
        '<tools>\n'
        '' + TOOL_JSON + '\n'
        '</tools>\n'
        '\n'
        'If you choose to call a function ONLY reply in the following format with NO suffix:\n'
        '\n'
        '<tool_call>\n'
        '<function=example_function_name>\n'
        '<parameter=example_parameter_1>\n'
        'value_1\n'
        '</parameter>\n'
        '</function>\n'
        '</tool_call><|im_end|>\n'
        '<|im_start|>user\n'
        'Value of A1?<|im_end|>\n'
        '<|im_start|>assistant\n'
        '<tool_call>\n'
        '<function=lookup>\n'
        '<parameter=key>\n'
        'A1\n'
        '</parameter>\n'
        '</function>\n'
        '</tool_call><|im_end|>\n'
        '<|im_start|>user\n'
        '<tool_response>\n'
        '42\n'
        '</tool_response><|im_end|>\n'
        '<|im_start|>assistant\n'
        'It is 42.<|im_end|>\n'
    ),
    'qwen3_5': (  # Qwen3.6's published template renders the same (tests/test_chat_formats_published.py)
        '<|im_start|>system\n'
        '# Tools\n'
        '\n'
        'You have access to the following functions:\n'
        '\n'
        '<tools>\n'
        '' + TOOL_JSON + '\n'
        '</tools>\n'
        '\n'
        'If you choose to call a function ONLY reply in the following format with NO suffix:\n'
        '\n'
        '<tool_call>\n'
        '<function=example_function_name>\n'
        '<parameter=example_parameter_1>\n'
        'value_1\n'
        '</parameter>\n'
        '<parameter=example_parameter_2>\n'
        'This is the value for the second parameter\n'
        'that can span\n'
        'multiple lines\n'
        '</parameter>\n'
        '</function>\n'
        '</tool_call>\n'
        '\n'
        '<IMPORTANT>\n'
        'Reminder:\n'
        '- Function calls MUST follow the specified format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n'
        '- Required parameters MUST be specified\n'
        '- You may provide optional reasoning for your function call in natural language BEFORE the function call, but NOT after\n'
        '- If there is no function call available, answer the question like normal with your current knowledge and do not tell the user about function calls\n'
        '</IMPORTANT>\n'
        '\n'
        'Be brief.<|im_end|>\n'
        '<|im_start|>user\n'
        'Value of A1?<|im_end|>\n'
        '<|im_start|>assistant\n'
        '<think>\n'
        'Need the tool.\n'
        '</think>\n'
        '\n'
        '<tool_call>\n'
        '<function=lookup>\n'
        '<parameter=key>\n'
        'A1\n'
        '</parameter>\n'
        '</function>\n'
        '</tool_call><|im_end|>\n'
        '<|im_start|>user\n'
        '<tool_response>\n'
        '42\n'
        '</tool_response><|im_end|>\n'
        '<|im_start|>assistant\n'
        '<think>\n'
        'Got it.\n'
        '</think>\n'
        '\n'
        'It is 42.<|im_end|>\n'
    ),
    'gemma4': (  # Gemma 4's published template renders the same (tests/test_chat_formats_published.py)
        '<bos><|turn>system\n'
        'Be brief.<|tool>declaration:lookup{description:<|"|>Look up a key<|"|>,parameters:{properties:{key:{type:<|"|>STRING<|"|>}},required:[<|"|>key<|"|>],type:<|"|>OBJECT<|"|>}}<tool|><turn|>\n'
        '<|turn>user\n'
        'Value of A1?<turn|>\n'
        '<|turn>model\n'
        '<|channel>thought\n'
        'Need the tool.\n'
        '<channel|><|tool_call>call:lookup{key:<|"|>A1<|"|>}<tool_call|><|tool_response>response:lookup{value:<|"|>42<|"|>}<tool_response|>It is 42.<turn|>\n'
    ),
    'llama3_json': (
        '<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n'
        '\n'
        'Environment: ipython\n'
        '\n'
        'Be brief.\n'
        '\n'
        'Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n'
        '\n'
        'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Do not use variables.\n'
        '\n'
        '{\n'
        '    "type": "function",\n'
        '    "function": {\n'
        '        "name": "lookup",\n'
        '        "description": "Look up a key",\n'
        '        "parameters": {\n'
        '            "type": "object",\n'
        '            "properties": {\n'
        '                "key": {\n'
        '                    "type": "string"\n'
        '                }\n'
        '            },\n'
        '            "required": [\n'
        '                "key"\n'
        '            ]\n'
        '        }\n'
        '    }\n'
        '}<|eot_id|><|start_header_id|>user<|end_header_id|>\n'
        '\n'
        'Value of A1?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n'
        '\n'
        '{"name": "lookup", "parameters": {"key": "A1"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n'
        '\n'
        '42<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n'
        '\n'
        'It is 42.<|eot_id|>'
    ),
    'mistral': (
        '<s>[AVAILABLE_TOOLS][' + TOOL_JSON + '][/AVAILABLE_TOOLS][INST]Be brief.\n'
        '\n'
        'Value of A1?[/INST][TOOL_CALLS][{"name": "lookup", "arguments": {"key": "A1"}, "id": "c1"}]</s>[TOOL_RESULTS]{"content": "42", "call_id": "c1"}[/TOOL_RESULTS]It is 42.</s>'
    ),
    'harmony': (  # openai-harmony's rendering (tests/test_chat_harmony_reference.py checks it token for token)
        '<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n'
        'Knowledge cutoff: 2024-06\n'
        '\n'
        'Reasoning: medium\n'
        '\n'
        '# Valid channels: analysis, commentary, final. Channel must be included for every message.\n'
        "Calls to these tools must go to the commentary channel: 'functions'.<|end|><|start|>developer<|message|># Instructions\n"
        '\n'
        'Be brief.\n'
        '\n'
        '# Tools\n'
        '\n'
        '## functions\n'
        '\n'
        'namespace functions {\n'
        '\n'
        '// Look up a key\n'
        'type lookup = (_: {\n'
        'key: string,\n'
        '}) => any;\n'
        '\n'
        '} // namespace functions<|end|><|start|>user<|message|>Value of A1?<|end|><|start|>assistant<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant to=functions.lookup<|channel|>commentary json<|message|>{"key": "A1"}<|call|><|start|>functions.lookup to=assistant<|channel|>commentary<|message|>42<|end|><|start|>assistant<|channel|>analysis<|message|>Got it.<|end|><|start|>assistant<|channel|>final<|message|>It is 42.<|end|>'
    ),
    'deepseek_v3': (
        '<｜begin▁of▁sentence｜>Be brief.\n'
        '\n'
        '## Tools\n'
        'You have access to the following tools:\n'
        '' + TOOL_JSON + '\n'
        'To call tools, reply with <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n'
        '```json\n'
        'ARGUMENTS\n'
        '```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜User｜>Value of A1?<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n'
        '```json\n'
        '{"key": "A1"}\n'
        '```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>42<｜tool▁output▁end｜><｜tool▁outputs▁end｜>It is 42.<｜end▁of▁sentence｜>'
    ),
}


@pytest.mark.parametrize("name", FORMATS)
def test_render_with_tools_calls_results_and_reasoning_equals_the_family_format(toks, name):
    renderer = ChatRenderer(toks[name])
    text = renderer.render(normalize_messages(CONVERSATION), normalize_tools([TOOL]), add_generation_prompt=False)
    assert text == EXPECTED_RENDER[name]
    ids = renderer.encode(text)
    assert renderer.decode(ids) == text  # special tokens are single ids and the text round-trips
    for token in FAMILY_TOKENS[name][0][1:]:
        if token in text:
            assert toks[name].convert_tokens_to_ids(token) in ids


def test_hermes_drops_reasoning_before_the_last_user_turn_and_honours_enable_thinking(toks):
    renderer = ChatRenderer(toks["hermes"])
    later = normalize_messages([*CONVERSATION, {"role": "user", "content": "And B2?"}])
    text = renderer.render(later, None, add_generation_prompt=True)
    assert "Need the tool." not in text and "Got it." not in text  # both turns are before the last user turn
    off = renderer.render(later, None, True, {"enable_thinking": False})
    assert off == text + "<think>\n\n</think>\n\n"


# ---------------------------------------------------------------------------------------------- parsing
@pytest.mark.parametrize("name", FORMATS)
def test_parse_several_calls_with_nested_json_and_unicode_arguments(name):
    fmt = CHAT_FORMATS.get(name)
    calls = [("lookup", {"key": "A1"}), ("search", NESTED), ("lookup", {"key": "ключ"})]
    parsed = fmt.parse(call_text(name, calls), ["lookup"])
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == calls
    assert parsed.malformed == 0 and parsed.unknown_tools == 1 and parsed.content is None
    assert len({c["id"] for c in parsed.tool_calls}) == 3 and all(c["type"] == "function" for c in parsed.tool_calls)
    assert "ключ" in parsed.tool_calls[2]["function"]["arguments"]  # unicode kept, not escaped


# completions written as each family's model writes them (independent of testing_formats)
LITERAL_CALLS = {
    "hermes": 'Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "A1"}}\n</tool_call>',
    "qwen3_coder": "Let me look.\n<tool_call>\n<function=lookup>\n<parameter=key>\nA1\n</parameter>\n"
                   "<parameter=limit>\n3\n</parameter>\n</function>\n</tool_call>",
    # after the prompt's "<think>\n": reasoning, its close, the text, the call
    "qwen3_5": "The user wants A1.\n</think>\n\nLet me look.\n\n<tool_call>\n<function=lookup>\n<parameter=key>\nA1\n"
               "</parameter>\n<parameter=limit>\n3\n</parameter>\n</function>\n</tool_call>",
    "gemma4": 'Let me look.<|tool_call>call:lookup{key:<|"|>A1<|"|>,limit:3}<tool_call|><|tool_response>',
    "llama3_json": '{"name": "lookup", "parameters": {"key": "A1"}}',
    "mistral": 'Let me look.[TOOL_CALLS]lookup[ARGS]{"key": "A1"}',
    "harmony": "<|channel|>analysis<|message|>User wants A1.<|end|><|start|>assistant<|channel|>commentary"
               ' to=functions.lookup <|constrain|>json<|message|>{"key": "A1"}<|call|>',
    "deepseek_v3": "Let me look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>lookup<｜tool▁sep｜>"
                   '{"key": "A1"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
}


@pytest.mark.parametrize("name", FORMATS)
def test_parse_a_literal_completion_of_the_family(name):
    parsed = CHAT_FORMATS.get(name).parse(LITERAL_CALLS[name], ["lookup"])
    [call] = parsed.tool_calls
    expected = {"key": "A1", "limit": 3} if name in ("qwen3_coder", "qwen3_5", "gemma4") else {"key": "A1"}
    assert call["function"]["name"] == "lookup" and json.loads(call["function"]["arguments"]) == expected
    message = parsed.to_message()
    if name == "harmony":
        assert message["content"] is None and message["reasoning_content"] == "User wants A1."
    elif name == "llama3_json":
        assert message["content"] is None and "reasoning_content" not in message
    elif name == "qwen3_5":
        assert message["content"] == "Let me look." and message["reasoning_content"] == "The user wants A1."
    else:
        assert message["content"] == "Let me look."


@pytest.mark.parametrize("name", FORMATS)
def test_truncated_call_comes_back_as_text_and_is_counted(name):
    fmt = CHAT_FORMATS.get(name)
    full = call_text(name, [("lookup", {"key": "A1", "extra": NESTED})], content="")
    cut = full[: len(full) * 2 // 3]
    parsed = fmt.parse(cut, ["lookup"])
    assert parsed.tool_calls == [] and parsed.malformed == 1, parsed
    assert parsed.content and "key" in parsed.content  # what the model wrote, kept


# per family: calls that do not read (bad JSON, no name, arguments that are not an object, stray text)
MALFORMED = {
    "hermes": ['{"name": 5, "arguments": {}}', '{"name": "lookup", "arguments": [1]}', "{not json"],
    "qwen3_coder": ["<function=lookup>\nstray text\n</function>", "<function=>\n</function>", "<parameter=k>\n1\n</parameter>"],
    "qwen3_5": ["<function=lookup>\nstray text\n</function>", "<function=>\n</function>", "<parameter=k>\n1\n</parameter>"],
    "gemma4": ['key:<|"|>A1', "key A1", "key:[1,}"],
    "llama3_json": ['{"name": 5, "parameters": {}}', '{"name": "lookup", "parameters": [1]}', "{not json"],
    "mistral": ['[{"name": 5, "arguments": {}}]', '[{"name": "lookup", "arguments": [1]}]', "[{not json"],
    "harmony": ["[1]", '"text"', "{not json"],
    "deepseek_v3": ["[1]", '"text"', "{not json"],
}
WRAP = {
    "hermes": "<tool_call>\n{}\n</tool_call>",
    "qwen3_coder": "<tool_call>\n{}\n</tool_call>",
    "qwen3_5": "\n</think>\n\n<tool_call>\n{}\n</tool_call>",
    "gemma4": "<|tool_call>call:lookup{{}}<tool_call|>",
    "llama3_json": "<|python_tag|>{}",
    "mistral": "[TOOL_CALLS]{}",
    "harmony": "<|channel|>commentary to=functions.lookup <|constrain|>json<|message|>{}<|call|>",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>lookup\n```json\n{}\n```"
                   "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
}


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("which", [0, 1, 2])
def test_malformed_calls_come_back_as_text(name, which):
    text = WRAP[name].replace("{}", MALFORMED[name][which])
    parsed = CHAT_FORMATS.get(name).parse(text, ["lookup"])
    assert parsed.tool_calls == [] and parsed.malformed == 1, parsed
    assert parsed.content and MALFORMED[name][which].split("\n")[0] in parsed.content


@pytest.mark.parametrize("name", FORMATS)
def test_reasoning_is_split_from_the_answer(name):
    parsed = CHAT_FORMATS.get(name).parse(answer_text(name, "It is 42.", "Think: 6*7."), calls=False)
    assert parsed.content == "It is 42."
    assert parsed.reasoning == (None if name == "llama3_json" else "Think: 6*7.")


def test_hermes_parse_equals_the_pre_format_parser_without_reasoning():
    fmt = CHAT_FORMATS.get("hermes")
    for text in [LITERAL_CALLS["hermes"], "plain answer", "<tool_call>\n{bad}\n</tool_call> tail", "<tool_call>{\"name\": \"x\""]:
        old, new = parse_tool_calls(text, ["lookup"]), fmt.parse(text, ["lookup"])
        strip = lambda calls: [c["function"] for c in calls]  # noqa: E731  (ids are random)
        assert (new.content, strip(new.tool_calls), new.malformed, new.unknown_tools, new.reasoning) == (
            old.content, strip(old.tool_calls), old.malformed, old.unknown_tools, None)
    assert fmt.parse(" spaced answer \n", calls=False).content == " spaced answer \n"  # untouched, as before


def test_a_thinking_completion_cut_by_length_is_all_reasoning():
    parsed = CHAT_FORMATS.get("hermes").parse("<think>\nstill thinking about", calls=False)
    assert parsed.content is None and parsed.reasoning == "still thinking about"
