"""The Gemini wire of a reference endpoint: ``POST <url>/v1beta/models/<model>:generateContent``.

``url`` is the API's root (https://generativelanguage.googleapis.com, or
any server of the protocol: mtrl's own). Chat messages become ``contents``:
system messages the ``systemInstruction``; a user message a ``user`` turn
of one text part; an assistant message a ``model`` turn of its reasoning
(a ``thought`` part), its text and one ``functionCall`` part per call (the
call's id kept); each tool result a ``functionResponse`` part (``name``
from the call it answers; ``response`` ``{"output": text}``, or
``{"error": text}`` when the agent flagged it failed, as Gemini's API
reference asks) in a ``user`` turn. Consecutive parts of one role share one
turn. The reasoning of earlier turns is not sent back (Gemini reads thought
parts only with the signature it wrote, which chat messages do not carry),
and the first call of each model turn carries the thought signature Google
documents for a history from elsewhere, ``skip_thought_signature_validator``
(Gemini 3 refuses a replayed call without one). Sampling: ``temperature``, ``topP``, ``maxOutputTokens``,
``stopSequences`` and ``seed`` in ``generationConfig``; a required call is
``functionCallingConfig`` mode ANY (with the one allowed name for a named
function). The reply's thought parts become ``reasoning_content``; a reply
with calls ends ``tool_calls`` (Gemini writes STOP). The key goes as
``x-goog-api-key``; the check reads the model list at ``<url>/v1beta/models``.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...types import ChatOptions, SamplingParams
from .._shared import (
    DeclaredEndpoint, ReferenceReply, AssistantBlocks, append_blocks, arguments_object, call_name, sampling_fields,
    system_field, tool_call,
)
from ._maps import API_VERSION, FINISH, TOOL_CHOICE

SKIP_SIGNATURE = "skip_thought_signature_validator"  # Google's documented signature for calls it did not write


class GeminiWire(DeclaredEndpoint):
    """``POST <url>/v1beta/models/<model>:generateContent``; the model list at ``<url>/v1beta/models``."""

    chat_path = f"/{API_VERSION}/models/{{model}}:generateContent"
    models_path = f"/{API_VERSION}/models"
    key_header = "x-goog-api-key"

    def request_body(self, model: str, messages: list[dict[str, Any]], tools: list[Mapping[str, Any]],
                     sampling: SamplingParams, options: ChatOptions) -> dict[str, Any]:
        system, conversation = system_field("text", messages)  # the system instruction: one content, one text part
        contents: list[dict[str, Any]] = []
        names: dict[str, str] = {}  # call id -> function name (a functionResponse names its function)
        for message in conversation:
            role = message["role"]
            if role == "assistant":
                parts: list[dict[str, Any]] = []
                if isinstance(message.get("content"), str) and message["content"]:
                    parts.append({"text": message["content"]})
                for i, call in enumerate(message.get("tool_calls") or ()):
                    names[call.get("id")] = call["function"]["name"]
                    args = arguments_object(call["function"]["arguments"]) or {}
                    part: dict[str, Any] = {"functionCall": {"id": call.get("id"), "name": call["function"]["name"],
                                                             "args": args}}
                    if i == 0:
                        part["thoughtSignature"] = SKIP_SIGNATURE
                    parts.append(part)
                append_blocks(contents, "model", parts, "parts")
            elif role == "tool":
                call_id = message.get("tool_call_id")
                key = "error" if message.get("status") == "error" else "output"
                result = {"id": call_id, "name": message.get("name") or names.get(call_id, ""),
                          "response": {key: message.get("content") or ""}}
                append_blocks(contents, "user", [{"functionResponse": result}], "parts")
            else:
                content = message.get("content")
                text = [{"text": content}] if isinstance(content, str) and content else []
                append_blocks(contents, "user", text, "parts")
        config = sampling_fields(sampling, max_tokens="maxOutputTokens", temperature="temperature", top_p="topP",
                                 stop="stopSequences", seed="seed")
        body: dict[str, Any] = {"contents": contents, "generationConfig": config}
        if system:
            body["systemInstruction"] = {"parts": [system]}
        if tools:
            body["tools"] = [{"functionDeclarations": [_declaration(t) for t in tools]}]
            if options.tool_choice != "auto":  # auto: no toolConfig, Gemini's default
                body["toolConfig"] = {"functionCallingConfig": TOOL_CHOICE.to_native(options.tool_choice,
                                                                                      options.tool_name)}
        return body

    def parse_reply(self, payload: Any) -> ReferenceReply:
        """A ``GenerateContentResponse``: its first candidate's text, thought and functionCall parts."""
        candidates = payload.get("candidates") if isinstance(payload, Mapping) else None
        if not isinstance(candidates, list) or not candidates or not isinstance(candidates[0], Mapping):
            blocked = payload.get("promptFeedback") if isinstance(payload, Mapping) else None
            raise ValueError(f"no candidates (promptFeedback: {blocked!r:.200})" if blocked else "no candidates")
        candidate = candidates[0]
        parts = (candidate.get("content") or {}).get("parts") or []
        read = AssistantBlocks()
        for i, part in enumerate(parts):
            if not isinstance(part, Mapping):
                raise ValueError(f"candidates[0].content.parts[{i}] is not an object")
            call = part.get("functionCall")
            if isinstance(call, Mapping):
                name = call_name(call, f"candidates[0].content.parts[{i}].functionCall")
                read.calls.append(tool_call(str(call.get("id") or f"call_{i}"), name, call.get("args")))
            elif isinstance(part.get("text"), str):
                (read.thoughts if part.get("thought") else read.texts).append(part["text"])
        return read.reply(candidate.get("finishReason"), FINISH)


def _declaration(tool: Mapping[str, Any]) -> dict[str, Any]:
    fn = tool.get("function") or {}
    out: dict[str, Any] = {"name": fn.get("name"),
                           "parametersJsonSchema": fn.get("parameters") or {"type": "object", "properties": {}}}
    if fn.get("description"):
        out["description"] = fn["description"]
    return out


__all__ = ["SKIP_SIGNATURE", "GeminiWire"]
