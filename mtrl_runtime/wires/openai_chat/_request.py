"""The OpenAI chat-completions request body.

Known fields are validated (a bad value is a 400 naming the field and the
value; a wrong JSON type is refused, never coerced); fields that OpenAI
clients send and mtrl does not use are accepted and ignored, since clients
add them over time.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema, field_validator, model_validator

from ...errors import BadRequest
from ...types import ChatOptions, SamplingParams
from ._maps import TOOL_CHOICE

Role = Literal["system", "developer", "user", "assistant", "tool"]

# Published schemas of fields the chat normalizer checks itself (its errors name the message and part):
# text parts only, and tool calls in OpenAI's function shape.
_TEXT_PART = {
    "type": "object",
    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
    "required": ["text"],
}
_TOOL_CALL = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
            "required": ["name"],
        },
    },
    "required": ["function"],
}
Content = Annotated[
    str | list[dict[str, Any]] | None,
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART}, {"type": "null"}]}),
]
ToolCalls = Annotated[
    list[dict[str, Any]] | None,
    WithJsonSchema({"anyOf": [{"type": "array", "items": _TOOL_CALL}, {"type": "null"}]}),
]
ToolChoice = Annotated[
    str | dict[str, Any] | None,
    WithJsonSchema({"anyOf": [{"enum": ["auto", "none", "required"]}, {"type": "object"}, {"type": "null"}]}),
]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # no "yes" read as true, no true as 1

    role: Role
    content: Content = None
    name: str | None = None
    tool_calls: ToolCalls = None
    tool_call_id: str | None = None

    @model_validator(mode="after")
    def _content_given(self) -> "ChatMessage":
        if self.content is None and self.role != "assistant":  # only an assistant's tool-call turn may omit it
            raise ValueError(f"content: a {self.role} message needs content (a string or text parts), got null")
        return self


class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # no "yes" read as true, no true as 1

    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # no "yes" read as true, no true as 1

    type: Literal["function"] = "function"
    function: FunctionSpec


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # no "yes" read as true, no true as 1

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # no "yes" read as true, no true as 1

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice = None
    temperature: float | None = Field(default=None, ge=0.0, le=5.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = Field(default=None, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    return_token_ids: bool | None = None  # mtrl / vLLM extension: token ids in the response
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM / SGLang extension: e.g. {"enable_thinking": false}

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if len(stops) > 16:
            raise ValueError(f"at most 16 stop strings, got {len(stops)}")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @model_validator(mode="after")
    def _tool_choice_known(self) -> "ChatCompletionRequest":
        choice = self.tool_choice
        if isinstance(choice, str) and choice not in ("auto", "none", "required"):
            raise ValueError(f"tool_choice must be 'auto', 'none', 'required' or an object, got {choice!r}")
        return self

    def options(self) -> ChatOptions:
        """The call's options: template variables, the tool choice (``TOOL_CHOICE``; ``"none"`` is applied by dropping
        the tools), the model it named (``advanced.server.background_models``) and its family."""
        return TOOL_CHOICE.options(self.tool_choice, template_kwargs=self.chat_template_kwargs or {},
                                   token_ids=self.wants_token_ids or self.wants_logprobs, model=self.model,
                                   protocol="openai")

    def sampling(self, default: SamplingParams, max_tokens_cap: int, over_cap: str = "clamp") -> SamplingParams:
        """The request's sampling settings over the run's defaults. A max_tokens above the cap is served up to the
        cap (``over_cap``, advanced.server.max_tokens_over_cap: ``clamp``) or a 400 naming the field (``refuse``)."""
        max_tokens = self.max_completion_tokens or self.max_tokens or default.max_tokens
        asked = None
        if max_tokens > max_tokens_cap and over_cap == "clamp":
            asked, max_tokens = max_tokens, max_tokens_cap
        if max_tokens > max_tokens_cap:
            raise BadRequest(
                f"max_tokens: {max_tokens} is above this server's limit of {max_tokens_cap} "
                "(advanced.server.max_tokens_over_cap: refuse)",
                param="max_tokens",
            )
        return SamplingParams(
            temperature=default.temperature if self.temperature is None else self.temperature,
            top_p=default.top_p if self.top_p is None else self.top_p,
            max_tokens=max_tokens,
            stop=tuple(self.stop or default.stop),
            seed=self.seed,  # the coordinator decides an absent seed (the rollout's, or the run's)
            top_logprobs=self.top_logprobs or 0,
            max_tokens_requested=bool(self.max_completion_tokens or self.max_tokens),
            max_tokens_asked=asked,
        )

    @property
    def wants_token_ids(self) -> bool:
        return bool(self.return_token_ids)

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.logprobs)


__all__ = ["ChatCompletionRequest", "ChatMessage", "ToolSpec"]
