"""Calling an OpenAI chat-completions endpoint (a reference model, a judge) (OpenAI, vLLM, SGLang, LiteLLM, any compatible server).

The request forwards the conversation, the tools and ``tool_choice``, and
the rollout's sampling (temperature, top_p, max_tokens, stop, seed). The
key goes as ``Authorization: Bearer``.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...types import ChatOptions, SamplingParams
from .._shared import DeclaredEndpoint, ReferenceReply, arguments_text, tool_fields
from ._maps import TOOL_CHOICE


class OpenAIChatWire(DeclaredEndpoint):
    """``POST <url>/chat/completions`` (the URL is a ``.../v1`` base, as OpenAI clients take it)."""

    chat_path = "/chat/completions"
    models_path = "/models"
    key_header = "Authorization"
    key_scheme = "Bearer "

    def request_body(self, model: str, messages: list[dict[str, Any]], tools: list[Mapping[str, Any]],
                     sampling: SamplingParams, options: ChatOptions) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": model,
            "messages": [_wire_message(m) for m in messages],
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        body.update(tool_fields([dict(t) for t in tools], TOOL_CHOICE, options))
        return body

    def parse_reply(self, payload: Any) -> ReferenceReply:
        """The first choice of a chat-completion object."""
        choices = payload.get("choices") if isinstance(payload, Mapping) else None
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            raise ValueError("no choices[0]")
        choice = choices[0]
        message = choice.get("message")
        if not isinstance(message, Mapping):
            raise ValueError("choices[0].message is missing")
        content = message.get("content")
        if content is not None and not isinstance(content, str):
            raise ValueError(f"choices[0].message.content is {type(content).__name__}, not text")
        reasoning = message.get("reasoning_content") or message.get("reasoning")
        reasoning = reasoning if isinstance(reasoning, str) and reasoning else None
        calls = []
        for i, call in enumerate(message.get("tool_calls") or ()):
            fn = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
                raise ValueError(f"choices[0].message.tool_calls[{i}] has no function name")
            calls.append({"id": str(call.get("id") or f"call_{i}"), "type": "function",
                          "function": {"name": fn["name"], "arguments": arguments_text(fn.get("arguments") or "{}")}})
        reply: dict[str, Any] = {"role": "assistant", "content": content}
        if reasoning is not None:
            reply["reasoning_content"] = reasoning
        if calls:
            reply["tool_calls"] = calls
        finish = choice.get("finish_reason")
        finish = finish if isinstance(finish, str) and finish else ("tool_calls" if calls else "stop")
        return ReferenceReply(reply, finish, content or "", reasoning)


def _wire_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A normalized message as OpenAI takes it: tool-call arguments as JSON text, mtrl's own fields left out."""
    out: dict[str, Any] = {"role": message["role"], "content": message.get("content", "")}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"id": call.get("id"), "type": "function",
             "function": {"name": call["function"]["name"], "arguments": arguments_text(call["function"]["arguments"])}}
            for call in message["tool_calls"]
        ]
        if not out["content"]:
            out["content"] = None
    if message["role"] == "tool" and "tool_call_id" in message:
        out["tool_call_id"] = message["tool_call_id"]
    return out


__all__ = ["OpenAIChatWire"]
