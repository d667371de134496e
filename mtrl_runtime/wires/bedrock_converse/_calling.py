"""Calling a Bedrock Converse endpoint (a reference model, a judge): ``POST <url>/model/<modelId>/converse``.

``url`` is the runtime's root, e.g. https://bedrock-runtime.us-east-1.amazonaws.com.
The credential is a Bedrock API key when ``api_key_env`` names one
(``AWS_BEARER_TOKEN_BEDROCK``: sent as ``Authorization: Bearer``), else an
AWS SigV4 signature (service ``bedrock``) with botocore's default
credentials (environment, profile, instance role); the region is the
URL's (``bedrock-runtime.<region>.amazonaws.com``), else ``AWS_REGION`` /
``AWS_DEFAULT_REGION``.

Chat messages become Converse blocks: system messages ``system`` text
blocks; an assistant message its text and a ``toolUse`` block per call;
each tool result a ``toolResult`` block (``status: error`` when the agent
flagged it) in a user message; consecutive blocks of one role share one
message, and empty text is left out (Converse refuses empty text blocks).
Sampling: ``inferenceConfig`` ``maxTokens``, ``temperature``, ``topP``,
``stopSequences``; Converse takes no seed. The reply's
``reasoningContent`` becomes ``reasoning_content`` and is not sent back
(it needs its signature).
"""

from __future__ import annotations

import os
import re
from typing import Any, Mapping
from urllib.parse import quote, urlsplit

from ...types import ChatOptions, SamplingParams
from .._shared import (
    DeclaredEndpoint, ReferenceReply, AssistantBlocks, append_blocks, arguments_object, call_name, reply_list,
    sampling_fields, tool_call,
)
from ._maps import FINISH, TOOL_CHOICE

_REGION = re.compile(r"^bedrock-runtime(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com")


class BedrockConverseWire(DeclaredEndpoint):
    """``POST <url>/model/<modelId>/converse`` (the model id URL-encoded: ARNs hold ``:`` and ``/``).

    No model list (``models_path`` None: that is the control plane's, the check
    only connects); the key, a Bedrock API key, as ``Authorization: Bearer``,
    and without one the call is SigV4-signed.
    """

    chat_path = "/model/{model}/converse"
    key_header = "Authorization"
    key_scheme = "Bearer "

    def chat_url(self, base: str, model: str) -> str:
        return super().chat_url(base, quote(model, safe=""))

    def headers(self, api_key: str | None, method: str, url: str, content: bytes) -> dict[str, str]:
        return super().headers(api_key, method, url, content) if api_key else _sigv4(method, url, content)

    def request_body(self, model: str, messages: list[dict[str, Any]], tools: list[Mapping[str, Any]],
                     sampling: SamplingParams, options: ChatOptions) -> dict[str, Any]:
        system: list[dict[str, str]] = []
        turns: list[dict[str, Any]] = []
        for message in messages:
            role = message["role"]
            if role == "system":
                system += _texts(message.get("content"))
            elif role == "assistant":
                blocks: list[dict[str, Any]] = _texts(message.get("content"))
                blocks += [{"toolUse": {"toolUseId": call.get("id"), "name": call["function"]["name"],
                                        "input": arguments_object(call["function"]["arguments"])}}
                           for call in message.get("tool_calls") or ()]
                append_blocks(turns, "assistant", blocks)
            elif role == "tool":
                result: dict[str, Any] = {"toolUseId": message.get("tool_call_id"),
                                          "content": [{"text": message.get("content") or ""}]}
                if message.get("status") == "error":
                    result["status"] = "error"
                append_blocks(turns, "user", [{"toolResult": result}])
            else:
                append_blocks(turns, "user", _texts(message.get("content")))
        config = sampling_fields(sampling, max_tokens="maxTokens", temperature="temperature", top_p="topP",
                                 stop="stopSequences")
        body: dict[str, Any] = {"messages": turns, "inferenceConfig": config}
        if system:
            body["system"] = system
        if tools:
            fns = [t.get("function") or {} for t in tools]
            body["toolConfig"] = {
                "tools": [{"toolSpec": {"name": fn.get("name"), **({"description": fn["description"]}
                                                                    if fn.get("description") else {}),
                                        "inputSchema": {"json": fn.get("parameters") or {"type": "object"}}}}
                          for fn in fns],
                "toolChoice": TOOL_CHOICE.to_native(options.tool_choice, options.tool_name),
            }
        return body

    def parse_reply(self, payload: Any) -> ReferenceReply:
        """A Converse response: ``output.message``'s text, reasoning and toolUse blocks, and its stop reason."""
        read = AssistantBlocks()
        for i, block in enumerate(reply_list(payload, "output", "message", "content")):
            if not isinstance(block, Mapping):
                raise ValueError(f"output.message.content[{i}] is not an object")
            if isinstance(block.get("text"), str):
                read.texts.append(block["text"])
            elif isinstance(block.get("toolUse"), Mapping):
                use = block["toolUse"]
                name = call_name(use, f"output.message.content[{i}].toolUse")
                read.calls.append(tool_call(str(use.get("toolUseId") or f"tooluse_{i}"), name, use.get("input")))
            elif isinstance(block.get("reasoningContent"), Mapping):
                text = (block["reasoningContent"].get("reasoningText") or {}).get("text")
                if isinstance(text, str):
                    read.thoughts.append(text)
        return read.reply(payload.get("stopReason"), FINISH)


def _texts(content: Any) -> list[dict[str, Any]]:
    return [{"text": content}] if isinstance(content, str) and content else []


def _sigv4(method: str, url: str, content: bytes) -> dict[str, str]:
    """SigV4 headers (service ``bedrock``) from botocore's default credentials; a clear error when there are none."""
    try:
        from botocore.auth import SigV4Auth
        from botocore.awsrequest import AWSRequest
        from botocore.session import Session
    except ImportError:
        raise ValueError("reference api_key_env: a Bedrock reference without an API key is signed with AWS "
                         "credentials, which needs botocore (pip install 'mtrl[bedrock]'); or name the variable "
                         "holding a Bedrock API key (AWS_BEARER_TOKEN_BEDROCK)") from None
    credentials = Session().get_credentials()
    if credentials is None:
        raise ValueError("reference api_key_env: no AWS credentials found to sign the Bedrock reference's calls "
                         "(environment, profile or role); or name the variable holding a Bedrock API key")
    host = urlsplit(url).hostname or ""
    match = _REGION.match(host)
    region = match.group(1) if match else os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if not region:
        raise ValueError(f"reference url: no AWS region in {host!r} (bedrock-runtime.<region>.amazonaws.com) "
                         "and none in AWS_REGION / AWS_DEFAULT_REGION")
    request = AWSRequest(method=method, url=url, data=content, headers={"Content-Type": "application/json"})
    SigV4Auth(credentials.get_frozen_credentials(), "bedrock", region).add_auth(request)
    return {k: v for k, v in request.headers.items() if k.lower() != "content-type"}


__all__ = ["BedrockConverseWire"]
