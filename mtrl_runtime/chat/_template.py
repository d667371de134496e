"""Chat rendering: canonical messages + tools → prompt text → token ids.

``ChatRenderer`` picks a template (the one given, else the tokenizer's own
when it supports tools, else ``CHATML_TOOLS_TEMPLATE``), compiles it once,
and renders it directly with the same Jinja environment transformers'
``apply_chat_template`` uses, without that method's per-call checks: the
endpoint renders twice per turn and must stay well under a millisecond.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

# ChatML (as SmolLM2-135M-Instruct uses it, same default system prompt) plus
# tools in the Hermes style: tool definitions as JSON lines in <tools></tools>
# in the system turn, calls as <tool_call> JSON blocks in the assistant turn,
# results as <tool_response> blocks in a user turn (consecutive tool messages
# share one user turn). Without tools it renders exactly as SmolLM2's own.
CHATML_TOOLS_TEMPLATE = (
    "{%- set default_system = '" + DEFAULT_SYSTEM_PROMPT + "' -%}\n"
    """{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set system_text = messages[0]['content'] -%}
  {%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system_text = default_system -%}
  {%- set rest = messages -%}
{%- endif -%}
{{- '<|im_start|>system\\n' + system_text -}}
{%- if tools -%}
  {{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' -}}
  {{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}
  {%- for tool in tools -%}{{- '\\n' + (tool | tojson) -}}{%- endfor -%}
  {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments ' -}}
  {{- 'within <tool_call></tool_call> XML tags:\\n<tool_call>\\n' -}}
  {{- '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call>' -}}
{%- endif -%}
{{- '<|im_end|>\\n' -}}
{%- for message in rest -%}
  {%- if message['role'] == 'tool' -%}
    {%- if loop.first or loop.previtem['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' -}}
    {%- if loop.last or loop.nextitem['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- elif message['role'] == 'assistant' -%}
    {{- '<|im_start|>assistant\\n' + (message['content'] or '') -}}
    {%- for call in message['tool_calls'] or [] -%}
      {%- set fn = call['function'] if call['function'] is defined else call -%}
      {%- if message['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}
      {{- '<tool_call>\\n{"name": ' + (fn['name'] | tojson) + ', "arguments": ' -}}
      {{- (fn['arguments'] if fn['arguments'] is string else (fn['arguments'] | tojson)) + '}\\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"""
)

_PROBE_TEXT = "mtrl-probe-7f3a"


class ChatRenderer:
    """Renders canonical messages (see ``normalize_messages``) with a chat template and encodes the text.

    ``assistant_close`` is the text the template puts after an assistant
    message's content; ``eos_token_ids`` are the ids that end a reply (the
    tokenizer's eos and the close's first token when that is a special token).
    """

    def __init__(self, tokenizer: Any, template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.template = template if template is not None else _tokenizer_tool_template(tokenizer) or CHATML_TOOLS_TEMPLATE
        self._compiled = _compile(self.template)
        # the variables apply_chat_template passes: bos_token, eos_token, ...
        self._template_vars = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
        self._backend = getattr(tokenizer, "backend_tokenizer", None)  # tokenizers.Tokenizer of a fast tokenizer
        self.assistant_close = self._probe_close()
        self.eos_token_ids = frozenset(self._find_eos_ids())

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text of canonical ``messages`` and ``tools`` (empty tools render as none)."""
        return self._compiled.render(
            messages=messages,
            tools=list(tools) if tools else None,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **self._template_vars,
        )

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``: special tokens written in it are parsed, no BOS is added."""
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def close_glue(self, completion_ids: Sequence[int]) -> str:
        """The text still needed after a completion to close its assistant turn as the template does.

        A completion that ended with an eos token whose text starts the close
        needs only the rest of the close; one cut by length needs all of it.
        """
        if completion_ids and completion_ids[-1] in self.eos_token_ids:
            eos_text = self.tokenizer.decode([completion_ids[-1]], skip_special_tokens=False)
            if self.assistant_close.startswith(eos_text):
                return self.assistant_close[len(eos_text) :]
        return self.assistant_close

    def _probe_close(self) -> str:
        probe = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE_TEXT}]
        text = self.render(probe, add_generation_prompt=False)
        at = text.rfind(_PROBE_TEXT)
        if at < 0:
            raise ValueError("the chat template does not render assistant message content; it cannot be used")
        return text[at + len(_PROBE_TEXT) :]

    def _find_eos_ids(self) -> set[int]:
        ids = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        close_ids = self.encode(self.assistant_close)
        if close_ids and close_ids[0] in set(self.tokenizer.all_special_ids):
            ids.add(close_ids[0])
        return ids


def _tokenizer_tool_template(tokenizer: Any) -> str | None:
    """The tokenizer's own chat template when it renders tools, else None."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, Mapping):  # named templates: prefer the tool-use one
        template = template.get("tool_use") or template.get("default")
    if isinstance(template, str) and "tools" in template:
        return template
    return None


def _compile(template: str) -> Any:
    """The template compiled in transformers' chat-template environment (cached by transformers)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template

    return _compile_jinja_template(template)


__all__ = ["CHATML_TOOLS_TEMPLATE", "DEFAULT_SYSTEM_PROMPT", "ChatRenderer"]
