"""Chat rendering and token-in-token-out prompts for the OpenAI-compatible policy endpoint.

- ``normalize_messages`` / ``normalize_tools``: the shapes Strands, LangChain
  and plain OpenAI clients send, in one canonical form.
- ``ChatRenderer``: a chat template (the tokenizer's own when it supports
  tools, else ``CHATML_TOOLS_TEMPLATE``) rendered and encoded.
- ``parse_tool_calls``: ``<tool_call>`` blocks of a completion → OpenAI tool calls.
- ``ReplyText``: a completion's streamable content and reasoning while it is decoded.
- ``PromptBuilder``: each turn's prompt ids, extending the previous turn's
  prompt + completion ids when the request extends it (``BreakReason`` otherwise).
- ``find_compaction``: a request whose history is the summary the previous call wrote + recent messages.
"""

from ._compaction import Compaction, find_compaction
from ._extension import ConversationState, PromptBuilder, PromptPlan
from ._messages import message_key, normalize_messages, normalize_tools
from ._template import CHAT_TEMPLATE_META, CHATML_TOOLS_TEMPLATE, DEFAULT_SYSTEM_PROMPT, ChatRenderer
from ._streaming import ReplyText, TextDelta
from ._toolparse import ParsedReply, parse_tool_calls

__all__ = [
    "CHAT_TEMPLATE_META",
    "CHATML_TOOLS_TEMPLATE",
    "DEFAULT_SYSTEM_PROMPT",
    "ChatRenderer",
    "Compaction",
    "ConversationState",
    "ParsedReply",
    "PromptBuilder",
    "PromptPlan",
    "ReplyText",
    "TextDelta",
    "find_compaction",
    "message_key",
    "normalize_messages",
    "normalize_tools",
    "parse_tool_calls",
]
