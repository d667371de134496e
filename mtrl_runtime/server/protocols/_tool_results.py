"""One rule for a tool result in every protocol: its text reaches the model unchanged; a failure flag is recorded.

A protocol may flag a tool result as failed: Anthropic Messages'
``tool_result.is_error: true``, Bedrock Converse's ``toolResult.status:
"error"``. OpenAI chat completions (``tool`` messages) and Responses
(``function_call_output``) have no such flag: their result is its text.

The prompt gets the result's text exactly as the agent sent it, with no
marker added, because that is what a deployed server of each protocol puts
in front of the models mtrl trains:

- Anthropic's tool-use docs ("Handle tool calls") put the error itself in
  the result's ``content`` ("ConnectionError: the weather service API is
  not available (HTTP 500)") and ``is_error`` beside it; vLLM's
  ``/v1/messages`` server, which serves open models on this protocol, turns
  a ``tool_result`` into a ``tool`` message of its text and drops
  ``is_error``.
- Bedrock's API reference says ``ToolResultBlock.status`` "is only
  supported by Amazon Nova and Anthropic Claude 3 and 4 models": for the
  open-weight models mtrl trains the model sees the content alone.
- The frameworks already write the failure into the text (Strands:
  ``"Error: <exception>"``, ``"Unknown tool: <name>"``; LangChain's
  ``ToolMessage`` the error text), so one agent's failed tool renders the
  same tokens whichever protocol its model client speaks. (An earlier rule
  prefixed ``Error:`` to Bedrock's failed results only: Strands'
  ``"Unknown tool: x"`` then read differently on Bedrock than on OpenAI,
  and differently from what deployment shows.)

The flag is never dropped: the canonical ``tool`` message keeps
``"status": "error"`` (``chat.normalize_messages``; ``ChatRenderer.render``
hides it from the template), so the stored turn's messages (and its MLflow
span) show which results failed, and a rollout
that saw failed results ends with the metric ``tool_results_failed`` (each
failed call counted once, however many turns repeat it) and the
coordinator counter of that name. A tool call an adapter reported keeps its
own ``ToolCall.status``.
"""

from __future__ import annotations

from typing import Any


def tool_message(call_id: str, text: str, failed: bool, name: str | None = None) -> dict[str, Any]:
    """The chat ``tool`` message of one tool result: ``text`` unchanged, ``status: error`` when ``failed``."""
    message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": text}
    if name is not None:
        message["name"] = name
    if failed:
        message["status"] = "error"
    return message


__all__ = ["tool_message"]
