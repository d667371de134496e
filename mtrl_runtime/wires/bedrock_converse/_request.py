"""The Bedrock Converse request body (``converse`` and ``converse-stream`` take the same one), validated strictly.

Field names are Bedrock's own (camelCase). Unions (a content block, a tool,
a tool choice) hold exactly one member. What mtrl cannot honour is refused
with a sentence naming the field and why, never dropped: images and other
media (the policy is text-only), guardrails, prompt variables, structured
output, model-specific ``additionalModelRequestFields`` other than ``seed``
and ``chat_template_kwargs``. Hints that change nothing about the tokens
(``cachePoint`` blocks, ``requestMetadata``, ``performanceConfig``,
``serviceTier``, a tool's ``strict``) are accepted and ignored.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator


class _Strict(BaseModel):
    """Unknown fields refused; no string read as a number, no bool as a number."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class _OneMember(_Strict):
    """A union: exactly one member present (checked by each class's ``_one``; published as such in the schema)."""

    model_config = ConfigDict(json_schema_extra=lambda schema: _one_member_schema(schema))


def _one_member_schema(schema: dict[str, Any]) -> None:
    """Publish a union as it is validated: exactly one property, and that one not null."""
    schema["minProperties"] = schema["maxProperties"] = 1
    for prop in schema.get("properties", {}).values():
        options = [o for o in prop.get("anyOf", ()) if o != {"type": "null"}]
        if options and len(options) < len(prop["anyOf"]):
            del prop["anyOf"]
            prop.pop("default", None)
            prop.update(options[0] if len(options) == 1 else {"anyOf": options})


def _one_member(data: Any, what: str, members: tuple[str, ...], refused: tuple[str, ...] = (),
                nullable: tuple[str, ...] = ()) -> Any:
    """A union value must be an object with exactly one member (a refused one then fails on its own field)."""
    if not isinstance(data, dict):
        return data  # pydantic names the type error
    unknown = [k for k in data if k not in members and k not in refused]
    if unknown:
        raise ValueError(f"unknown {what} member {unknown[0]!r}; expected one of {', '.join(members)}")
    if len(data) != 1:
        raise ValueError(f"a {what} holds exactly one of {', '.join(members)}, got {len(data)}: {list(data)}")
    [(member, value)] = data.items()
    # {"tool": null} would pass as a union with no member, and fail later, unnamed
    if value is None and member in members and member not in nullable:
        raise ValueError(f"a {what}'s {member} is null; give it a value")
    return data


def Refused(why: str) -> Any:  # noqa: N802 (a type)
    """A field mtrl cannot honour: absent it costs nothing; present, it is a 400 saying ``why``."""

    def refuse(value: Any) -> Any:
        raise ValueError(why)

    # published as a field that must be absent ({"not": {}} admits no value), with the reason
    return Annotated[Any, BeforeValidator(refuse), WithJsonSchema({"not": {}, "description": f"refused: {why}"})]


_MEDIA = "mtrl's policy endpoint is text-only; send text blocks"
_GUARD = "mtrl applies no guardrails; remove guardContent inside rollouts"
_TOOL_EDIT = "tools change through toolConfig on each request, not through content blocks"
_REFUSED_BLOCKS = ("image", "document", "video", "audio", "searchResult", "guardContent", "citationsContent",
                   "toolAddition", "toolRemoval")


class ToolUseBlock(_Strict):
    toolUseId: str = Field(min_length=1, max_length=64)
    name: str = Field(min_length=1, max_length=256)
    input: Any
    type: str | None = None


class ToolResultContent(_OneMember):
    text: str | None = None
    json_value: Any = Field(default=None, alias="json")
    image: Refused(_MEDIA) = None
    document: Refused(_MEDIA) = None
    video: Refused(_MEDIA) = None
    searchResult: Refused(_MEDIA) = None

    @model_validator(mode="before")
    @classmethod
    def _one(cls, data: Any) -> Any:
        refused = ("image", "document", "video", "searchResult")
        return _one_member(data, "tool result content block", ("text", "json"), refused, nullable=("json",))


class ToolResultBlock(_Strict):
    toolUseId: str = Field(min_length=1, max_length=64)
    content: list[ToolResultContent]
    status: Literal["success", "error"] | None = None
    type: str | None = None


class ReasoningText(_Strict):
    text: str
    signature: str | None = None  # Anthropic's check on its own thinking; mtrl's policy writes none


class ReasoningBlock(_OneMember):
    reasoningText: ReasoningText | None = None
    redactedContent: Refused("mtrl's policy never writes redacted reasoning; send reasoningText") = None

    @model_validator(mode="before")
    @classmethod
    def _one(cls, data: Any) -> Any:
        return _one_member(data, "reasoning block", ("reasoningText",), ("redactedContent",))


class ContentBlock(_OneMember):
    text: str | None = None
    toolUse: ToolUseBlock | None = None
    toolResult: ToolResultBlock | None = None
    reasoningContent: ReasoningBlock | None = None
    cachePoint: dict[str, Any] | None = None  # a caching hint: changes no token
    image: Refused(_MEDIA) = None
    document: Refused(_MEDIA) = None
    video: Refused(_MEDIA) = None
    audio: Refused(_MEDIA) = None
    searchResult: Refused(_MEDIA) = None
    guardContent: Refused(_GUARD) = None
    citationsContent: Refused("mtrl's policy writes no citations; send the text as a text block") = None
    toolAddition: Refused(_TOOL_EDIT) = None
    toolRemoval: Refused(_TOOL_EDIT) = None

    @model_validator(mode="before")
    @classmethod
    def _one(cls, data: Any) -> Any:
        members = ("text", "toolUse", "toolResult", "reasoningContent", "cachePoint")
        return _one_member(data, "content block", members, _REFUSED_BLOCKS)


class Message(_Strict):
    role: Literal["user", "assistant"]
    content: list[ContentBlock] = Field(min_length=1)


class SystemBlock(_OneMember):
    text: str | None = None
    cachePoint: dict[str, Any] | None = None
    guardContent: Refused(_GUARD) = None

    @model_validator(mode="before")
    @classmethod
    def _one(cls, data: Any) -> Any:
        return _one_member(data, "system block", ("text", "cachePoint"), ("guardContent",))


class InferenceConfig(_Strict):
    maxTokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=5.0)
    topP: float | None = Field(default=None, gt=0.0, le=1.0)
    stopSequences: list[str] | None = Field(default=None, max_length=16)

    @model_validator(mode="after")
    def _no_empty_stop(self) -> "InferenceConfig":
        if self.stopSequences and any(not s for s in self.stopSequences):
            raise ValueError(f"stopSequences: stop sequences must not be empty, got {self.stopSequences!r}")
        return self


class InputSchema(_Strict):
    json_schema: dict[str, Any] = Field(alias="json")


class ToolSpecification(_Strict):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    inputSchema: InputSchema
    strict: bool | None = None  # constrained decoding hint; the policy's calls are parsed either way


class Tool(_OneMember):
    toolSpec: ToolSpecification | None = None
    cachePoint: dict[str, Any] | None = None
    systemTool: Refused("mtrl's policy has no built-in tools; declare a toolSpec") = None

    @model_validator(mode="before")
    @classmethod
    def _one(cls, data: Any) -> Any:
        return _one_member(data, "tool", ("toolSpec", "cachePoint"), ("systemTool",))


class SpecificTool(_Strict):
    name: str = Field(min_length=1)


class ToolChoice(_OneMember):
    auto: dict[str, Any] | None = None
    any: dict[str, Any] | None = None
    tool: SpecificTool | None = None

    @model_validator(mode="before")
    @classmethod
    def _one(cls, data: Any) -> Any:
        return _one_member(data, "toolChoice", ("auto", "any", "tool"))


class ToolConfig(_Strict):
    tools: list[Tool] = Field(min_length=1)
    toolChoice: ToolChoice | None = None


class ModelFields(_Strict):
    """``additionalModelRequestFields``: the model-specific fields mtrl's policy understands."""

    seed: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # as vLLM's extension: e.g. {"enable_thinking": false}

    @model_validator(mode="before")
    @classmethod
    def _known(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                if key not in ("seed", "chat_template_kwargs"):
                    raise ValueError(
                        f"{key}: not a field mtrl's policy understands (it knows seed and chat_template_kwargs); "
                        "remove it from additionalModelRequestFields inside rollouts"
                    )
        return data


class ConverseRequest(_Strict):
    """The body of ``POST /model/{modelId}/converse`` and ``.../converse-stream``."""

    messages: list[Message] = Field(min_length=1)
    system: list[SystemBlock] | None = None
    inferenceConfig: InferenceConfig | None = None
    toolConfig: ToolConfig | None = None
    additionalModelRequestFields: ModelFields | None = None
    additionalModelResponseFieldPaths: list[str] | None = None  # mtrl returns no model-specific fields
    requestMetadata: dict[str, str] | None = None
    performanceConfig: dict[str, Any] | None = None
    serviceTier: dict[str, Any] | None = None
    guardrailConfig: Refused("mtrl applies no guardrails; leave guardrailConfig out inside rollouts") = None
    promptVariables: Refused("prompt management templates are not served by mtrl; send the messages themselves") = None
    outputConfig: Refused(
        "structured output is not enforced by mtrl's policy; describe the format in the prompt"
    ) = None


__all__ = ["ContentBlock", "ConverseRequest", "Message", "ToolChoice", "ToolConfig"]
