"""What every environment tool shares: its OpenAI-style spec and a plain function form.

A tool here is an object with ``name``, ``description``, ``parameters`` (a
JSON schema) and ``__call__(**arguments)``. ``as_function`` turns one into an
ordinary Python function with a real signature and type hints, which is what
Strands' ``@tool`` and LangChain's ``StructuredTool.from_function`` read.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable, Mapping, get_type_hints

JSON = Any

# JSON schema type of each Python annotation a tool parameter may carry.
_JSON_TYPES: dict[Any, str] = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    tuple: "array",
    dict: "object",
}
_PY_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def tool_spec(name: str, description: str, parameters: Mapping[str, JSON]) -> dict[str, JSON]:
    """The ``{"name", "description", "parameters"}`` record that tool listings use."""
    return {"name": name, "description": description, "parameters": dict(parameters)}


def to_json(value: JSON) -> str:
    """A tool result as the text a model reads; keys sorted so equal results are equal strings."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, default=str)


def as_function(tool: Any, *, output: str = "json") -> Callable[..., Any]:
    """A plain function with the tool's name, docstring and keyword signature.

    ``output="json"`` returns the result as a JSON string (what a model reads);
    ``output="value"`` returns the dict or list itself.
    """
    if output not in ("json", "value"):
        raise ValueError(f"output must be 'json' or 'value', got {output!r}")
    schema = tool.parameters
    required = set(schema.get("required", ()))
    params = []
    annotations: dict[str, Any] = {}
    for pname, prop in schema.get("properties", {}).items():
        py_type = _PY_TYPES.get(prop.get("type", "string"), str)
        default = inspect.Parameter.empty if pname in required else None
        if pname not in required:
            py_type = py_type | None  # type: ignore[operator]
        params.append(inspect.Parameter(pname, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=py_type))
        annotations[pname] = py_type
    returns = str if output == "json" else Any
    annotations["return"] = returns

    def call(**arguments: Any) -> Any:
        given = {k: v for k, v in arguments.items() if not (v is None and k not in required)}
        result = tool(**given)
        return to_json(result) if output == "json" else result

    call.__name__ = tool.name
    call.__qualname__ = tool.name
    call.__doc__ = _docstring(tool.description, schema)
    call.__signature__ = inspect.Signature(params, return_annotation=returns)  # type: ignore[attr-defined]
    call.__annotations__ = annotations
    return call


def _docstring(description: str, schema: Mapping[str, JSON]) -> str:
    """A Google-style docstring, so frameworks that parse ``Args:`` pick up parameter descriptions."""
    lines = [description.strip() or "(no description)"]
    props = schema.get("properties", {})
    described = {k: p["description"] for k, p in props.items() if p.get("description")}
    if described:
        lines += ["", "Args:"] + [f"    {k}: {d}" for k, d in described.items()]
    return "\n".join(lines)


def callable_parameters(fn: Callable[..., Any]) -> dict[str, JSON]:
    """A JSON schema of a plain function's parameters, from its signature and type hints."""
    try:
        hints = get_type_hints(fn)
    except Exception:  # unresolvable forward references: fall back to no types
        hints = {}
    properties: dict[str, JSON] = {}
    required: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        properties[pname] = {"type": _json_type(hints.get(pname, str))}
        if param.default is inspect.Parameter.empty:
            required.append(pname)
    return {"type": "object", "properties": properties, "required": required}


def _json_type(annotation: Any) -> str:
    origin = getattr(annotation, "__origin__", None)
    if annotation in _JSON_TYPES:
        return _JSON_TYPES[annotation]
    if origin in _JSON_TYPES:
        return _JSON_TYPES[origin]
    args = [a for a in getattr(annotation, "__args__", ()) if a is not type(None)]
    if len(args) == 1:  # Optional[X] / X | None
        return _json_type(args[0])
    return "string"
