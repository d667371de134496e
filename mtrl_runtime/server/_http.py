"""HTTP plumbing shared by the routes: JSON bodies, errors in OpenAI's shape, size limits."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from ..errors import BadRequest, MtrlError, PayloadTooLarge

M = TypeVar("M", bound=BaseModel)


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def error_response(exc: MtrlError) -> Response:
    """OpenAI clients read ``error.message``; ``param`` names the field at fault."""
    return json_response(
        {"error": {"message": exc.message, "type": exc.code, "param": exc.param, "code": exc.status}},
        status=exc.status,
    )


def describe_validation(exc: ValidationError) -> tuple[str, str | None]:
    """One sentence per problem, each naming the field path and the value given."""
    parts = []
    first_param = None
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "body"
        first_param = first_param or loc
        value = err.get("input")
        shown = repr(value)
        if len(shown) > 120:
            shown = shown[:117] + "..."
        if err["type"] == "missing":
            parts.append(f"{loc}: field required")
        else:
            parts.append(f"{loc}: {err['msg']} (got {shown})")
    return "; ".join(parts), first_param


async def parse_body(request: Request, model: type[M], max_bytes: int) -> M:
    """Read, size-check, decode and validate a JSON body into ``model``."""
    body = await read_limited(request, max_bytes)
    if not body:
        raise BadRequest("the request body is empty; send a JSON object", param="body")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}", param="body") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(data).__name__}", param="body")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = describe_validation(exc)
        raise BadRequest(message, param=param) from None


async def read_limited(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(
            f"the request body is {int(declared)} bytes; the limit is {max_bytes} bytes", param="body"
        )
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"the request body exceeds the limit of {max_bytes} bytes", param="body")
        chunks.append(chunk)
    return b"".join(chunks)


def bearer_token(request: Request) -> str | None:
    value = request.headers.get("authorization")
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def openapi_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` declaring a JSON body for a route that parses it by hand.

    The schema is inlined (its ``$defs`` resolved) so it stands alone inside
    the OpenAPI document.
    """
    schema = model.model_json_schema()
    defs = schema.pop("$defs", {})

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.rsplit("/", 1)[1]])
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": inline(schema)}},
        }
    }


__all__ = [
    "bearer_token",
    "describe_validation",
    "error_response",
    "json_response",
    "openapi_body",
    "parse_body",
    "read_limited",
]
