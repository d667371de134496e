"""The OpenAPI document the server publishes: every route, and the errors they really answer."""

from __future__ import annotations

from typing import Any, Callable

from fastapi import FastAPI

_ERROR_SCHEMA = {
    "type": "object",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "message": {"type": "string", "description": "what is wrong, naming the field and the value"},
                "type": {"type": "string"},
                "param": {"anyOf": [{"type": "string"}, {"type": "null"}]},
                "code": {"type": "integer"},
            },
            "required": ["message", "type", "code"],
        }
    },
    "required": ["error"],
}


def install_openapi(app: FastAPI, extra_paths: Callable[[], dict[str, dict[str, Any]]]) -> None:
    """Publish the path items ``extra_paths()`` makes (plain ASGI routes) beside FastAPI's own, and OpenAI's error
    shape on 4xx (and 502). Both are built when the document is first asked for, as FastAPI builds its own.

    FastAPI would document a 422 that the routes never answer: their bad
    input is a 400 in OpenAI's shape.
    """
    build = app.openapi

    def openapi() -> dict:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        schema["paths"] = {**extra_paths(), **schema.get("paths", {})}
        schemas = schema.setdefault("components", {}).setdefault("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        schemas["Error"] = _ERROR_SCHEMA
        error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        for path, operations in schema["paths"].items():
            for operation in operations.values():
                responses = operation.setdefault("responses", {})
                responses.pop("422", None)
                # a protocol answering in its own error shape (Anthropic's, Bedrock's) declares it itself
                responses.setdefault("4XX", {"description": "The request is refused; error.message says why", **error})
                if path.endswith("/chat/completions"):
                    responses["502"] = {"description": "The policy engine failed on this call", **error}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = ["install_openapi"]
