"""HTTP plumbing shared by the routes: JSON bodies, errors in OpenAI's shape, size limits."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any, Mapping, TypeVar

import orjson
from fastapi import Request
from fastapi.responses import Response
from pydantic import BaseModel, ValidationError

from ..errors import BadRequest, MtrlError, PayloadTooLarge
from ..wires.openai_chat import error_body

M = TypeVar("M", bound=BaseModel)


def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json", headers=headers)


def error_response(exc: MtrlError) -> Response:
    body, headers = error_body(exc)
    return Response(body, status_code=exc.status, media_type="application/json", headers=headers)


def route_error_response(method: str, path: str, status: int, headers: Mapping[str, str] | None = None) -> Response:
    """A routing refusal (unknown path, method not allowed, ...) in OpenAI's error shape."""
    if status == 404:
        message, code, param = f"{method} {path}: no such route", "not_found", "path"
    elif status == 405:
        allowed = (headers or {}).get("Allow") or (headers or {}).get("allow")
        takes = f"; this route takes {allowed} only" if allowed else ""
        message, code, param = f"{method} {path}: method not allowed{takes}", "method_not_allowed", "method"
    else:
        message, code, param = f"{method} {path}: HTTP {status}", "http_error", None
    payload = {"error": {"message": message, "type": code, "param": param, "code": status}}
    extra = {"x-should-retry": "false"} if status < 500 else {}
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json",
                    headers={**dict(headers or {}), **extra})


OFF_LOOP_BYTES = 64 * 1024
"""A body larger than this is decoded and checked on a worker thread (and its call's prompt built there): parsing
thousands of items took seconds, during which the event loop served no one else."""


@dataclass(frozen=True)
class BodyLimits:
    """What every request body must stay within (``advanced.server``): its size, its strings, its nesting."""

    max_bytes: int
    max_string_chars: int | None = None
    max_depth: int | None = None

    @classmethod
    def of(cls, server_config: Any) -> "BodyLimits":
        return cls(server_config.max_body_bytes, server_config.max_string_chars, server_config.max_json_depth)


async def parse_body(request: Request, model: type[M], limits: BodyLimits) -> M:
    """Read, size-check, decode and validate a JSON body into ``model`` within ``limits``."""
    return decode_body(await read_limited(request, limits.max_bytes), model, limits)


def decode_body(body: bytes, model: type[M], limits: BodyLimits) -> M:
    """Decode and validate a JSON body into ``model``; errors name the field and the value."""
    return validate(decode_json(body, limits), model)


def decode_json(body: bytes, limits: BodyLimits) -> dict[str, Any]:
    """The JSON object of a request body, its strings and nesting within ``limits``."""
    if not body:
        raise BadRequest("the request body is empty; send a JSON object", param="body")
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}", param="body") from None
    if not isinstance(data, dict):
        raise BadRequest(f"the request body must be a JSON object, got {type(data).__name__}", param="body")
    # each level opens with a '{' or '[': a body with no more of them than the limit cannot nest deeper (C-speed);
    # a body no longer than the string limit holds no longer string. Whatever is left is walked once.
    depth = limits.max_depth
    if depth is not None and body.count(b"{") + body.count(b"[") <= depth:
        depth = None
    chars = limits.max_string_chars if limits.max_string_chars is not None and len(body) > limits.max_string_chars else None
    if chars is not None:
        check_string_lengths(data, chars, depth)
    elif depth is not None:
        check_depth(data, depth)
    return data


def validate(data: dict[str, Any], model: type[M]) -> M:
    """``data`` as ``model``, or a 400 naming each field at fault and its value."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise BadRequest.naming(exc.errors()) from None


async def read_limited(request: Request, max_bytes: int) -> bytes:
    check_declared_size(request.headers.get("content-length"), max_bytes)
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        check_read_size(size, max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def check_declared_size(declared: str | None, max_bytes: int) -> None:
    """Refuse a body whose ``content-length`` is over the limit before reading it."""
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise PayloadTooLarge(
            f"the request body is {int(declared)} bytes; the limit is {max_bytes} bytes", param="body"
        )


def check_read_size(size: int, max_bytes: int) -> None:
    """Refuse a body (sent without ``content-length``) once what was read passes the limit."""
    if size > max_bytes:
        raise PayloadTooLarge(f"the request body exceeds the limit of {max_bytes} bytes", param="body")


def check_depth(data: Any, limit: int) -> None:
    """Refuse JSON nested more than ``limit`` levels deep (the body object is level 1), naming where.

    One iterative walk over the containers (nothing recurses, however deep the
    body); the path is spelled out only for a refusal. Deeper values cannot be
    written back: the JSON writer stops at 254 levels and Python's recursion at
    about 1,000, which once failed a call after its turn was stored.
    """
    stack: list[tuple[Any, int]] = [(data, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, depth = pop()
        for child in node.values() if type(node) is dict else node:
            if type(child) is dict or type(child) is list:
                if depth >= limit:
                    _too_deep(data, limit)
                push((child, depth + 1))


def _too_deep(data: Any, limit: int) -> None:
    where = _path_deeper_than(data, limit)
    raise BadRequest(f"{where}: nested more than {limit} levels deep; the limit is {limit} "
                     "(advanced.server.max_json_depth)", param=where.split("...")[0].rstrip("."))


def _path_deeper_than(data: Any, limit: int, shown: int = 6) -> str:
    """The path to the first container below level ``limit``, its first ``shown`` steps spelled out."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(data, ())]
    while stack:
        node, path = stack.pop()
        if len(path) >= limit:
            steps = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path[:shown]).lstrip(".")
            return steps + ("..." if len(path) > shown else "")
        items = node.items() if isinstance(node, dict) else enumerate(node)
        stack.extend((child, (*path, key)) for key, child in items if isinstance(child, (dict, list)))
    return "body"


def check_string_lengths(data: Any, limit: int, max_depth: int | None = None) -> None:
    """Refuse the first string (value or key) longer than ``limit`` characters, naming where it is; with
    ``max_depth``, refuse nesting deeper than that too (``check_depth``), in the same walk."""
    stack: list[tuple[str, Any, int]] = [("", data, 1)]
    while stack:
        path, node, depth = stack.pop()
        if isinstance(node, str):
            if len(node) > limit:
                where = path or "body"
                raise BadRequest(f"{where}: a string of {len(node)} characters; the limit is {limit}", param=where)
            continue
        if max_depth is not None and depth > max_depth and isinstance(node, (dict, list)):
            _too_deep(data, max_depth)
        if isinstance(node, dict):
            for key, value in node.items():
                child = f"{path}.{key}" if path else str(key)
                if len(key) > limit:
                    raise BadRequest(f"{path or 'body'}: a key of {len(key)} characters; the limit is {limit}", param=path or "body")
                stack.append((child, value, depth + 1))
        elif isinstance(node, list):
            stack.extend((f"{path}[{i}]", value, depth + 1) for i, value in enumerate(node))


def api_key_matches(token: str | None, api_key: str) -> bool:
    """Whether ``token`` is the run's API key, compared in constant time (no timing hint about the key)."""
    return token is not None and hmac.compare_digest(token.encode(), api_key.encode())


def bearer_token(request: Request) -> str | None:
    return parse_bearer(request.headers.get("authorization"))


def parse_bearer(value: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header value, or None."""
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
    "OFF_LOOP_BYTES",
    "BodyLimits",
    "api_key_matches",
    "bearer_token",
    "check_declared_size",
    "check_depth",
    "check_read_size",
    "check_string_lengths",
    "decode_body",
    "decode_json",
    "error_body",
    "error_response",
    "json_response",
    "openapi_body",
    "parse_bearer",
    "parse_body",
    "read_limited",
    "route_error_response",
    "validate",
]
