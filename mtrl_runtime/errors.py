"""Errors the coordinator raises; each carries the HTTP status the server answers with.

Messages name the field and the value at fault, so a caller can fix the
request without reading the server's code.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .validation import describe_errors, error_field


class MtrlError(Exception):
    """Base error: ``status`` is the HTTP status, ``param`` the request field at fault."""

    status = 400
    code = "invalid_request"

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class BadRequest(MtrlError):
    status = 400
    code = "invalid_request"

    @classmethod
    def naming(cls, errors: Sequence[Mapping[str, Any]]) -> "BadRequest":
        """The 400 for a body pydantic refused (``errors()`` of its exception): each field at fault by its dotted
        path and the value given; ``param`` is the first field, ``body`` for the body as a whole."""
        param = error_field(errors[0], whole="body") if errors else None
        return cls(describe_errors(errors, whole="body"), param=param)


class Unauthorized(MtrlError):
    status = 401
    code = "unauthorized"


class Forbidden(MtrlError):
    status = 403
    code = "forbidden"


class RolloutNotFound(MtrlError):
    status = 404
    code = "rollout_not_found"


class Conflict(MtrlError):
    status = 409
    code = "conflict"


class RequestTimeout(MtrlError):
    status = 408
    code = "request_timeout"


class ServerBusy(MtrlError):
    status = 503
    code = "server_busy"


class PayloadTooLarge(MtrlError):
    status = 413
    code = "payload_too_large"


class EngineFailure(MtrlError):
    status = 502
    code = "engine_failure"


class AnswerFailure(MtrlError):
    """The call was served but its answer could not be written; nothing was recorded for it."""

    status = 500
    code = "answer_failure"


__all__ = [
    "AnswerFailure",
    "BadRequest",
    "Conflict",
    "EngineFailure",
    "Forbidden",
    "MtrlError",
    "PayloadTooLarge",
    "RequestTimeout",
    "RolloutNotFound",
    "ServerBusy",
    "Unauthorized",
]
