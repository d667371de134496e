"""Chat rendering and token-in-token-out prompts for the OpenAI-compatible policy endpoint.

- ``normalize_messages`` / ``normalize_tools``: the shapes Strands, LangChain
  and plain OpenAI clients send, in one canonical form.
- ``ChatRenderer``: a chat template (the tokenizer's own when it supports
  tools, else ``CHATML_TOOLS_TEMPLATE``) rendered and encoded.
- ``parse_tool_calls``: ``<tool_call>`` blocks of a completion → OpenAI tool calls.
- ``PromptBuilder``: each turn's prompt ids, extending the previous turn's
  prompt + completion ids when the request extends it (``BreakReason`` otherwise).
"""

from ._extension import ConversationState, PromptBuilder, PromptPlan
from ._messages import message_key, normalize_messages, normalize_tools
from ._template import CHATML_TOOLS_TEMPLATE, DEFAULT_SYSTEM_PROMPT, ChatRenderer
from ._toolparse import ParsedReply, parse_tool_calls

__all__ = [
    "CHATML_TOOLS_TEMPLATE",
    "DEFAULT_SYSTEM_PROMPT",
    "ChatRenderer",
    "ConversationState",
    "ParsedReply",
    "PromptBuilder",
    "PromptPlan",
    "message_key",
    "normalize_messages",
    "normalize_tools",
    "parse_tool_calls",
]
