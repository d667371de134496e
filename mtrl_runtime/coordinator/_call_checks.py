"""What a chat call must satisfy before anything is generated or recorded: a 400 naming the field otherwise.

``checked``: the messages normalized, the tools well formed (kept as sent),
a required or named tool call possible. ``fit_context``: the prompt and its
completion within the engine's context, a default ``max_tokens`` shortened
to fit.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from ..chat import normalize_messages, normalize_tools
from ..errors import BadRequest
from ..types import ChatOptions, SamplingParams
from ._counters import CoordinatorCounters


def checked(
    messages: list[Mapping[str, Any]], tools: list[Mapping[str, Any]] | None, options: ChatOptions
) -> tuple[list[dict[str, Any]], list[Mapping[str, Any]]]:
    """The call's messages normalized and its tools checked (kept as sent), or a 400 before anything is recorded."""
    try:
        normalized = normalize_messages(messages)
    except ValueError as exc:
        raise BadRequest(str(exc), param="messages") from None
    tools = list(tools or [])
    try:
        normalize_tools(tools)  # checked before anything is recorded (the turn keeps the tools as sent)
    except ValueError as exc:
        raise BadRequest(str(exc), param="tools") from None
    _check_tool_choice(options, tools)
    return normalized, tools


def _check_tool_choice(options: ChatOptions, tools: list) -> None:
    """A required or named tool call needs tools, and a named one must be among them (400 otherwise)."""
    if options.tool_choice == "auto":
        return
    if not tools:
        raise BadRequest(f"tool_choice {options.tool_choice!r} needs tools, and the request has none", param="tool_choice")
    if options.tool_choice == "function":
        names = [t.get("function", {}).get("name") for t in tools]
        if options.tool_name not in names:
            raise BadRequest(
                f"tool_choice names the function {options.tool_name!r}, which is not in tools "
                f"(tools: {', '.join(map(str, names))})",
                param="tool_choice",
            )


def fit_context(context: int | None, prompt_tokens: int, sampling: SamplingParams,
                counters: CoordinatorCounters) -> SamplingParams:
    """``sampling`` within the engine's ``context`` (None: unbounded): a 400 (the caller's error, not retried)
    naming both numbers when the prompt leaves no room or the client's own ``max_tokens`` does not fit; a default
    is shortened."""
    if context is None or prompt_tokens + sampling.max_tokens <= context:
        return sampling
    # a max_tokens the client named is refused over the context, unless it was already above the cap and clamped
    # (``max_tokens_asked``): then it is shortened like a default
    named = sampling.max_tokens_requested and sampling.max_tokens_asked is None
    if prompt_tokens >= context or named:
        counters.context_exceeded += 1
        asked = f" + max_tokens {sampling.max_tokens}" if named else ""
        raise BadRequest(
            # "maximum context length" is how OpenAI words it: agents that compact on overflow (Strands'
            # conversation managers) recognise the error by that phrase
            f"the rendered prompt is {prompt_tokens} tokens{asked}; the model's context is {context} tokens "
            "(maximum context length exceeded): shorten the conversation" + (" or lower max_tokens" if asked else ""),
            param="max_tokens" if asked and prompt_tokens < context else "messages",
        )
    return replace(sampling, max_tokens=context - prompt_tokens)


__all__ = ["checked", "fit_context"]
