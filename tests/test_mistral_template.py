"""The mistral template renders exactly as the template it replaced, in mtrl's renderer and standalone.

The template was rewritten for speed (bench/chat_formats.py): one pass over
the roles, tool results written key by key. ``REFERENCE`` is the template
before that, verbatim; transformers' ``apply_chat_template`` renders it alone,
as vLLM and ``mtrl export`` consumers do.
"""

from __future__ import annotations

import pytest

from mtrl_runtime.chat import ChatRenderer, normalize_messages, normalize_tools
from mtrl_runtime.chat.formats import CHAT_FORMATS
from mtrl_runtime.testing_formats import family_tokenizer

REFERENCE = """{{- bos_token -}}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set system_text = messages[0]['content'] -%}{%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system_text = '' -%}{%- set rest = messages -%}
{%- endif -%}
{%- for message in rest -%}
  {%- if message['role'] == 'user' -%}
    {%- set last_user = not (rest[loop.index0 + 1:] | selectattr('role', 'equalto', 'user') | first) -%}
    {%- if tools and last_user -%}
      {{- '[AVAILABLE_TOOLS]' + (tools | tojson) + '[/AVAILABLE_TOOLS]' -}}
    {%- endif -%}
    {{- '[INST]' -}}
    {%- if system_text and last_user -%}{{- system_text + '\\n\\n' -}}{%- endif -%}
    {{- message['content'] + '[/INST]' -}}
  {%- elif message['role'] == 'tool' -%}
    {{- '[TOOL_RESULTS]' + ({'content': message['content'], 'call_id': message['tool_call_id'] or ''} | tojson) + '[/TOOL_RESULTS]' -}}
  {%- elif message['role'] == 'assistant' -%}
    {{- message['content'] or '' -}}
    {%- if message['tool_calls'] -%}
      {{- '[TOOL_CALLS][' -}}
      {%- for call in message['tool_calls'] -%}
        {%- set fn = call['function'] -%}
        {%- if not loop.first -%}{{- ', ' -}}{%- endif -%}
        {{- '{"name": ' + (fn['name'] | tojson) + ', "arguments": ' -}}
        {{- (fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson)) -}}
        {%- if call['id'] -%}{{- ', "id": ' + (call['id'] | tojson) -}}{%- endif -%}
        {{- '}' -}}
      {%- endfor -%}
      {{- ']' -}}
    {%- endif -%}
    {{- eos_token -}}
  {%- endif -%}
{%- endfor -%}"""

TOOLS = [
    {"type": "function", "function": {"name": "lookup", "description": "Look \"it\" up: ümlaut, 日本, \\ and\n",
                                      "parameters": {"type": "object", "properties": {"key": {"type": "string"}},
                                                     "required": ["key"]}}},
    {"type": "function", "function": {"name": "sum", "description": "", "parameters": {"type": "object"}}},
]


def _call(name: str, args: dict, call_id: str | None) -> dict:
    call = {"type": "function", "function": {"name": name, "arguments": args}}
    return {**call, "id": call_id} if call_id is not None else call


CONVERSATIONS = {
    "one_user_tool_rounds": [
        {"role": "system", "content": "You look records up."},
        {"role": "user", "content": "Look up K00 and K01."},
        {"role": "assistant", "content": None, "tool_calls": [_call("lookup", {"key": "K00"}, "call_a1")]},
        {"role": "tool", "tool_call_id": "call_a1", "content": '{"value": 7, "note": "quote \\" and \\\\ and\\n"}'},
        {"role": "assistant", "content": "Next.", "tool_calls": [
            _call("lookup", {"key": "K01", "deep": {"x": [1, 2.5, None, True]}}, "c2"),
            _call("sum", {"values": ["é", "\u2028", "\t"]}, "c3")]},
        {"role": "tool", "tool_call_id": "c2", "content": "ümlaut 日本 \u0001 end"},
        {"role": "tool", "tool_call_id": "c3", "content": ""},
        {"role": "assistant", "content": "Done: 42."},
    ],
    "several_user_turns_no_system": [
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": None, "tool_calls": [_call("lookup", {"key": "A"}, "x1")]},
        {"role": "tool", "tool_call_id": "x1", "content": "A is 1"},
        {"role": "assistant", "content": "A is 1."},
        {"role": "user", "content": "third, the last"},
    ],
    "user_after_results": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [_call("sum", {}, "s1")]},
        {"role": "tool", "tool_call_id": "s1", "content": "3"},
        {"role": "user", "content": "and now?"},
        {"role": "assistant", "content": "3."},
        {"role": "user", "content": "thanks"},
        {"role": "assistant", "content": "bye"},
    ],
}


@pytest.fixture(scope="module")
def tok():
    return family_tokenizer("mistral")


def _reference(tok, messages, tools, template: str) -> str:
    return tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=False,
                                   chat_template=template)


@pytest.mark.parametrize("with_tools", [True, False])
@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_mistral_renders_every_token_as_the_template_it_replaced(tok, name, with_tools):
    messages = normalize_messages(CONVERSATIONS[name])
    tools = normalize_tools(TOOLS) if with_tools else None
    template = CHAT_FORMATS.get("mistral").template
    assert template != REFERENCE
    expected = _reference(tok, messages, tools, REFERENCE)
    assert ("[AVAILABLE_TOOLS]" in expected) is with_tools and "[TOOL_RESULTS]" in expected
    if with_tools:  # the tool list goes before the last user message only
        last_user = [m["content"] for m in messages if m["role"] == "user"][-1]
        assert expected.count("[AVAILABLE_TOOLS]") == 1
        after = expected.split("[/AVAILABLE_TOOLS]")[1]
        assert after.startswith("[INST]") and after.split("[/INST]")[0].endswith(last_user)
    # mtrl's renderer, and the template alone as vLLM / transformers render what `mtrl export` writes
    assert ChatRenderer(tok, template=template).render(messages, tools, add_generation_prompt=False) == expected
    assert _reference(tok, messages, tools, template) == expected
    assert tok.encode(expected, add_special_tokens=False) == ChatRenderer(tok, template=template).encode(expected)


def test_a_tool_result_without_a_call_id_renders_an_empty_one(tok):
    messages = [{"role": "user", "content": "q"}, {"role": "tool", "tool_call_id": None, "content": "r"}]
    template = CHAT_FORMATS.get("mistral").template
    expected = _reference(tok, messages, None, REFERENCE)
    assert '[TOOL_RESULTS]{"content": "r", "call_id": ""}[/TOOL_RESULTS]' in expected
    assert ChatRenderer(tok, template=template).render(messages, None, add_generation_prompt=False) == expected


def test_a_call_id_the_model_wrote_is_kept_and_history_renders_the_call_as_generated(tok):
    """Mistral's history writes each call's id: the id the model wrote must be the one the agent gets back."""
    fmt = CHAT_FORMATS.get("mistral")
    generated = ('[TOOL_CALLS][{"name": "lookup", "arguments": {"key": "K07", "note": "größe"}, "id": "a1B2c3D4e"}, '
                 '{"name": "add", "arguments": {"a": 1, "b": 5}, "id": "Zz9Yy8Xx7"}]')
    parsed = fmt.parse(generated, {"lookup", "add"})
    assert [c["id"] for c in parsed.tool_calls] == ["a1B2c3D4e", "Zz9Yy8Xx7"]
    messages = normalize_messages([{"role": "user", "content": "q"},
                                   {"role": "assistant", "content": None, "tool_calls": parsed.tool_calls}])
    rendered = ChatRenderer(tok, template=fmt.template).render(messages, None, add_generation_prompt=False)
    assert rendered.endswith("[/INST]" + generated + tok.eos_token)


def test_a_call_without_an_id_gets_one_of_the_shape_mistral_requires(tok):
    fmt = CHAT_FORMATS.get("mistral")
    for generated in ('[TOOL_CALLS][{"name": "lookup", "arguments": {"key": "K07"}}]', '[TOOL_CALLS]lookup[ARGS]{"key": "K07"}'):
        [call] = fmt.parse(generated, {"lookup"}).tool_calls
        assert len(call["id"]) == 9 and call["id"].isascii() and call["id"].isalnum(), call["id"]
