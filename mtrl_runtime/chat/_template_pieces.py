"""Jinja lines that several families' chat templates write alike, each written once.

A family's template (``chat/_template.py``, ``chat/formats/*.py``) is its own
lines joined with these; the joined text is what the tokenizer, the export
and the run's metadata see, unchanged by where the lines are written.
"""

from __future__ import annotations


def split_system(default: str = "") -> str:
    """Sets ``system_text`` (the leading system message's content, else ``default``) and ``rest`` (the others)."""
    return (
        "{%- if messages and messages[0]['role'] == 'system' -%}\n"
        "  {%- set system_text = messages[0]['content'] -%}{%- set rest = messages[1:] -%}\n"
        "{%- else -%}\n"
        "  {%- set system_text = '" + default + "' -%}{%- set rest = messages -%}\n"
        "{%- endif -%}\n"
    )


# one tool definition per line, each as JSON
TOOLS_AS_JSON_LINES = "{%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}"

# Hermes: the tool list in the system turn, after its "# Tools" heading, with the instructions for a call
HERMES_TOOLS_LIST = """\
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
  """ + TOOLS_AS_JSON_LINES + """
  {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' -}}
  {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' -}}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' -}}
"""

# a call's arguments as JSON: the string a client sent as it is, a mapping encoded
JSON_ARGUMENTS = "(fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson))"

# ChatML: consecutive tool messages share one user turn of <tool_response> blocks
# (the lines inside the template's ``message['role'] == 'tool'`` branch)
CHATML_TOOL_RESULTS = """\
    {%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}
    {%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
"""

# ChatML: the loop over the messages after the system turn (``rest``) up to an assistant turn's calls: tool results,
# then the assistant's content and the loop over its calls (each ``call``)
CHATML_TURNS_TO_CALLS = """\
{%- for message in rest -%}
  {%- if message['role'] == 'tool' -%}
""" + CHATML_TOOL_RESULTS + """\
  {%- elif message['role'] == 'assistant' -%}
    {{- '<|im_start|>assistant\\n' + (message['content'] or '') -}}
    {%- for call in message['tool_calls'] or [] -%}
"""

# ChatML: every other role as one plain turn, closing the template's loop over the messages
CHATML_OTHER_ROLES = """\
  {%- else -%}
    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
"""

# Hermes: one call (``fn``, inside a loop over the assistant's calls) as a <tool_call> JSON block, on a new line
# after the content or an earlier call
HERMES_CALL = """\
      {%- if message['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}
      {{- '<tool_call>\\n{"name": ' + (fn['name'] | tojson) + ', "arguments": ' -}}
      {{- """ + JSON_ARGUMENTS + """ + '}\\n</tool_call>' -}}
"""

# Qwen3-Coder: one call (``fn``) as XML, a <parameter=KEY> block per argument, non-string values as JSON
XML_CALL = """\
      {{- '<tool_call>\\n<function=' + fn['name'] + '>\\n' -}}
      {%- if fn['arguments'] is mapping -%}
        {%- for key, value in fn['arguments'] | items -%}
          {{- '<parameter=' + key + '>\\n' + (value if value is string else (value | tojson)) + '\\n</parameter>\\n' -}}
        {%- endfor -%}
      {%- endif -%}
      {{- '</function>\\n</tool_call>' -}}
"""

__all__ = [
    "CHATML_OTHER_ROLES",
    "CHATML_TOOL_RESULTS",
    "CHATML_TURNS_TO_CALLS",
    "HERMES_CALL",
    "HERMES_TOOLS_LIST",
    "JSON_ARGUMENTS",
    "TOOLS_AS_JSON_LINES",
    "XML_CALL",
    "split_system",
]
