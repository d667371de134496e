"""Gemini ``generateContent`` requests: the strict body schema, and contents as OpenAI chat messages.

The body is the Gemini API's ``GenerateContentRequest`` as the REST API
takes it (camelCase field names, as google-genai and ADK send them; the
proto names in snake_case are accepted too). Known fields are validated (a
wrong JSON type is refused, never coerced; the error names the field and the
value). ``safetySettings``, ``serviceTier``, ``labels`` and
``mediaResolution`` change nothing for the policy and are accepted and
ignored. ``topK`` is accepted and not applied (the policy samples with
temperature and topP; gemini-cli sends ``topK: 64`` with every call, as
chat completions clients send vLLM's ``top_k``). Refused with a 400 naming
the field: any other field, parts that are not text or function calls and
results (``inlineData``, ``fileData``, ``executableCode``...), tools other
than ``functionDeclarations`` (``googleSearch``, ``codeExecution``...),
``cachedContent``, a ``candidateCount`` above 1, structured output (``responseSchema``,
``responseJsonSchema``, a ``responseMimeType`` other than ``text/plain``),
penalties and logprobs, and a ``model`` turn last (the policy answers whole
turns).

Contents become chat messages: ``systemInstruction`` the system message; a
user turn's text parts a user message and each ``functionResponse`` a
``tool`` message (in part order); a model turn's ``thought`` parts its
``reasoning_content``, its other text parts its content, each
``functionCall`` a tool call (``args`` as JSON arguments); a
``thoughtSignature`` is read past (a part holding only one adds nothing).
A function call
without an ``id`` (the Gemini API leaves it out; ADK strips its own) gets
``call_<content>_<part>``, the same id every time the history is sent; a
``functionResponse`` without one answers the earliest unanswered call of
its ``name`` in the model turn before it.

A ``functionResponse.response`` is an object. Gemini's API reference: use
an ``output`` key for the function's output and an ``error`` key for its
error; with neither, the whole object is the output. So the tool message
is the ``output`` (a string as it is, anything else as JSON), or the
``error`` with the failure flag recorded (``wires._shared.tool_message``:
the text reaches the model unchanged), or the whole object as JSON.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from ...errors import BadRequest
from ...types import ChatOptions
from .._shared import AssistantBlocks, prefill_refused, tool_message
from ._maps import TOOL_CHOICE

_IGNORED = "accepted and ignored"
_PART_DATA = ("inlineData", "fileData", "executableCode", "codeExecutionResult", "toolCall", "toolResponse")
_UNSUPPORTED_GENERATION = {
    "responseSchema": "structured output is not supported; describe the format in the prompt",
    "responseJsonSchema": "structured output is not supported; describe the format in the prompt",
    "presencePenalty": "penalties are not supported",
    "frequencyPenalty": "penalties are not supported",
    "responseLogprobs": "logprobs are not returned on this protocol (the coordinator records them)",
    "logprobs": "logprobs are not returned on this protocol (the coordinator records them)",
    "speechConfig": "the policy writes text only",
    "imageConfig": "the policy writes text only",
    "audioTranscriptionConfig": "the policy writes text only",
    "routingConfig": "mtrl serves one policy",
    "modelSelectionConfig": "mtrl serves one policy",
}


def _alias(name: str) -> Any:
    """A camelCase field that also takes its snake_case proto name."""
    snake = "".join("_" + c.lower() if c.isupper() else c for c in name)
    return Field(default=None, validation_alias=AliasChoices(name, snake))


class ThinkingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    includeThoughts: bool | None = _alias("includeThoughts")
    thinkingBudget: int | None = _alias("thinkingBudget")
    thinkingLevel: str | None = _alias("thinkingLevel")

    def enable_thinking(self) -> bool | None:
        """``thinkingBudget: 0`` or ``thinkingLevel`` minimal turns thinking off; a budget above 0 (or -1) on."""
        if self.thinkingBudget is not None:
            return self.thinkingBudget != 0
        if self.thinkingLevel is not None:
            return self.thinkingLevel.upper() not in ("MINIMAL", "THINKING_LEVEL_UNSPECIFIED")
        return None


class GenerationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    topP: float | None = Field(default=None, gt=0.0, le=1.0, validation_alias=AliasChoices("topP", "top_p"))
    maxOutputTokens: int | None = Field(default=None, ge=1,
                                        validation_alias=AliasChoices("maxOutputTokens", "max_output_tokens"))
    stopSequences: list[str] | None = Field(default=None, max_length=16,
                                            validation_alias=AliasChoices("stopSequences", "stop_sequences"))
    seed: int | None = None
    candidateCount: int | None = Field(default=None, ge=1, le=1,
                                       validation_alias=AliasChoices("candidateCount", "candidate_count"))
    responseMimeType: Literal["text/plain"] | None = _alias("responseMimeType")
    responseModalities: list[Literal["TEXT"]] | None = _alias("responseModalities")
    thinkingConfig: ThinkingConfig | None = _alias("thinkingConfig")
    topK: int | None = Field(default=None, ge=0, validation_alias=AliasChoices("topK", "top_k"))  # not applied
    mediaResolution: str | None = _alias("mediaResolution")  # accepted and ignored: no media
    enableEnhancedCivicAnswers: bool | None = _alias("enableEnhancedCivicAnswers")  # accepted and ignored

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for key in data:
                camel = _camel(key)
                if camel in _UNSUPPORTED_GENERATION:
                    why = _UNSUPPORTED_GENERATION[camel]
                    raise ValueError(f"{camel}: not supported (got {data[key]!r:.80}); {why}")
        stops = data.get("stopSequences", data.get("stop_sequences")) if isinstance(data, dict) else None
        if isinstance(stops, list) and any(isinstance(s, str) and not s for s in stops):  # other types: the field's check
            raise ValueError("stopSequences must not hold empty strings")
        return data


class FunctionCallingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    mode: Literal["MODE_UNSPECIFIED", "AUTO", "ANY", "NONE", "VALIDATED"] | None = None
    allowedFunctionNames: list[str] | None = _alias("allowedFunctionNames")


class ToolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    functionCallingConfig: FunctionCallingConfig | None = _alias("functionCallingConfig")
    retrievalConfig: dict[str, Any] | None = _alias("retrievalConfig")  # for retrieval tools, which are refused


class FunctionDeclaration(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    parametersJsonSchema: Any = _alias("parametersJsonSchema")
    response: dict[str, Any] | None = None
    responseJsonSchema: Any = _alias("responseJsonSchema")
    behavior: str | None = None

    def chat_tool(self) -> dict[str, Any]:
        fn: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            fn["description"] = self.description
        if self.parametersJsonSchema is not None:
            fn["parameters"] = self.parametersJsonSchema
        elif self.parameters is not None:
            fn["parameters"] = json_schema(self.parameters)
        else:
            fn["parameters"] = {"type": "object", "properties": {}}
        return {"type": "function", "function": fn}


class Tool(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    functionDeclarations: list[FunctionDeclaration] | None = _alias("functionDeclarations")

    @model_validator(mode="after")
    def _only_functions(self) -> "Tool":
        for key in self.model_extra or {}:
            raise ValueError(f"{_camel(key)}: only functionDeclarations tools are supported (the policy calls your "
                             f"functions; it has no built-in {_camel(key)} tool)")
        return self


class Content(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    role: Literal["user", "model", "function"] | None = None
    parts: list[dict[str, Any]] = Field(default_factory=list)


class GenerateContentRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)  # no "yes" read as true, no true as 1

    contents: list[Content] = Field(min_length=1)
    systemInstruction: Content | None = _alias("systemInstruction")
    tools: list[Tool] | None = None
    toolConfig: ToolConfig | None = _alias("toolConfig")
    generationConfig: GenerationConfig | None = _alias("generationConfig")
    safetySettings: list[dict[str, Any]] | None = _alias("safetySettings")  # accepted and ignored
    serviceTier: str | None = _alias("serviceTier")  # accepted and ignored
    labels: dict[str, str] | None = None  # accepted and ignored
    cachedContent: str | None = _alias("cachedContent")
    model: str | None = None  # batch requests name it in the body; the path's name is the one served

    @model_validator(mode="after")
    def _refused(self) -> "GenerateContentRequest":
        if self.cachedContent is not None:
            raise ValueError(f"cachedContent: cached contents are not supported (got {self.cachedContent!r:.80}); "
                             "send the contents in the request")
        return self

    @property
    def config(self) -> GenerationConfig:
        return self.generationConfig or GenerationConfig()

    def chat_tools(self) -> list[dict[str, Any]] | None:
        """The function declarations as chat tools (None: none, or ``functionCallingConfig.mode`` NONE)."""
        declared = [d for tool in self.tools or () for d in tool.functionDeclarations or ()]
        fc = self.toolConfig.functionCallingConfig if self.toolConfig else None
        if not declared or (fc is not None and fc.mode == "NONE"):
            return None
        allowed = fc.allowedFunctionNames if fc is not None and fc.mode == "ANY" else None
        if allowed:
            unknown = sorted(set(allowed) - {d.name for d in declared})
            if unknown:
                raise BadRequest(f"toolConfig.functionCallingConfig.allowedFunctionNames: {unknown} are not declared "
                                 f"in tools (declared: {[d.name for d in declared]})",
                                 param="toolConfig.functionCallingConfig.allowedFunctionNames")
            declared = [d for d in declared if d.name in allowed]
        return [d.chat_tool() for d in declared]

    def options(self) -> ChatOptions:
        """``thinkingConfig`` as ``enable_thinking``; mode ANY as a required call (of the one allowed function)."""
        kwargs: dict[str, Any] = {}
        thinking = self.config.thinkingConfig
        enabled = thinking.enable_thinking() if thinking is not None else None
        if enabled is not None:
            kwargs["enable_thinking"] = enabled
        return TOOL_CHOICE.options(self.toolConfig.functionCallingConfig if self.toolConfig else None,
                                   template_kwargs=kwargs)


def chat_messages(body: GenerateContentRequest) -> list[dict[str, Any]]:
    """The request's system instruction and contents as OpenAI chat messages (see the module docstring)."""
    out: list[dict[str, Any]] = []
    if body.systemInstruction is not None:
        system = "\n".join(_text(part, f"systemInstruction.parts[{j}]")
                           for j, part in enumerate(body.systemInstruction.parts))
        if system:
            out.append({"role": "system", "content": system})
    calls: list[dict[str, Any]] = []  # the last model turn's calls, answered or not
    for i, content in enumerate(body.contents):
        where = f"contents[{i}]"
        if content.role == "model":
            message = _model(content.parts, i, where)
            calls = [dict(c, answered=False) for c in message.get("tool_calls") or ()]
            out.append(message)
        else:
            out.extend(_user(content.parts, calls, where))
    if body.contents[-1].role == "model":
        raise prefill_refused(f"contents[{len(body.contents) - 1}]", "the last content is the model's", "a user turn")
    return out


def _model(parts: list[dict[str, Any]], index: int, where: str) -> dict[str, Any]:
    turn = AssistantBlocks()
    for j, part in enumerate(parts):
        at = f"{where}.parts[{j}]"
        call = _field(part, "functionCall")
        if call is not None:
            if not isinstance(call, dict):
                raise BadRequest(f"{at}.functionCall: expected an object, got {call!r:.80}", param=f"{at}.functionCall")
            args = call.get("args", {})
            if not isinstance(args, dict):
                raise BadRequest(f"{at}.functionCall.args: expected an object, got {args!r:.80}",
                                 param=f"{at}.functionCall.args")
            call_id = call.get("id") or f"call_{index}_{j}"
            turn.calls.append({"id": _string(call_id, f"{at}.functionCall.id"), "type": "function",
                               "function": {"name": _string(call.get("name"), f"{at}.functionCall.name"),
                                            "arguments": orjson.dumps(args).decode()}})
        elif _signature_only(part):
            continue
        elif _field(part, "thought") is True:
            turn.thoughts.append(_text(part, at))
        else:
            turn.texts.append(_text(part, at))
    return turn.message()


def _user(parts: list[dict[str, Any]], calls: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for j, part in enumerate(parts):
        at = f"{where}.parts[{j}]"
        result = _field(part, "functionResponse")
        if result is None:
            texts.append(_text(part, at))
            continue
        if texts:
            out.append({"role": "user", "content": "\n".join(texts)})
            texts = []
        out.append(_tool_result(result, calls, f"{at}.functionResponse"))
    if texts:
        out.append({"role": "user", "content": "\n".join(texts)})
    return out


def _tool_result(result: Any, calls: list[dict[str, Any]], at: str) -> dict[str, Any]:
    if not isinstance(result, dict):
        raise BadRequest(f"{at}: expected an object, got {result!r:.80}", param=at)
    name = _string(result.get("name"), f"{at}.name")
    response = result.get("response", {})
    if not isinstance(response, dict):
        raise BadRequest(f"{at}.response: expected an object, got {response!r:.80}", param=f"{at}.response")
    call_id = result.get("id")
    if call_id is None:
        waiting = [c for c in calls if not c["answered"] and c["function"]["name"] == name]
        if not waiting:
            raise BadRequest(f"{at}: a response to {name!r} with no id answers no call of the model turn before it "
                             f"(its calls: {[c['function']['name'] for c in calls]})", param=f"{at}.name")
        call_id = waiting[0]["id"]
    for call in calls:
        if call["id"] == call_id:
            call["answered"] = True
    failed = "error" in response
    if failed or "output" in response:
        value = response["error"] if failed else response["output"]
        text = value if isinstance(value, str) else orjson.dumps(value).decode()
    else:
        text = orjson.dumps(response).decode()
    return tool_message(_string(call_id, f"{at}.id"), text, failed, name=name)


def _signature_only(part: Any) -> bool:
    """A part that holds a thought signature and no content (Gemini may close a thought run with one)."""
    return isinstance(part, dict) and _field(part, "thoughtSignature") is not None and not part.get("text") and not any(
        _field(part, kind) is not None for kind in ("functionCall", "functionResponse", *_PART_DATA))


def _text(part: Any, at: str) -> str:
    """A text part's text; any other kind of part is refused, naming it."""
    if not isinstance(part, dict):
        raise BadRequest(f"{at}: expected a part object, got {part!r:.80}", param=at)
    for kind in _PART_DATA:
        if _field(part, kind) is not None:
            raise BadRequest(f"{at}.{kind}: {kind} parts are not supported: the policy mtrl serves reads and writes "
                             "text and function calls; send the content as text", param=f"{at}.{kind}")
    text = part.get("text")
    if not isinstance(text, str):
        known = ", ".join(sorted(part)) or "nothing"
        raise BadRequest(f"{at}.text: expected a text, functionCall or functionResponse part, got one holding {known}",
                         param=f"{at}.text")
    return text


def _field(part: Any, name: str) -> Any:
    """A part's field by its camelCase or snake_case name."""
    if not isinstance(part, dict):
        return None
    value = part.get(name)
    if value is None:
        snake = "".join("_" + c.lower() if c.isupper() else c for c in name)
        value = part.get(snake)
    return value


def _string(value: Any, at: str) -> str:
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{at}: expected a non-empty string, got {value!r:.80}", param=at)
    return value


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def json_schema(schema: Any) -> Any:
    """A Gemini ``Schema`` (OpenAPI's subset, types named ``OBJECT``, ``STRING``...) as JSON Schema (types in
    lower case, as chat templates show tools); every other keyword as it is."""
    if isinstance(schema, list):
        return [json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "type" and isinstance(value, str):
            out[key] = value.lower()
        elif key == "properties" and isinstance(value, dict):
            out[key] = {name: json_schema(s) for name, s in value.items()}
        elif key in ("items", "anyOf"):
            out[key] = json_schema(value)
        else:
            out[key] = value
    return out


__all__ = ["GenerateContentRequest", "GenerationConfig", "chat_messages", "json_schema"]
