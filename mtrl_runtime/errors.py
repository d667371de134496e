"""Errors the coordinator raises; each carries the HTTP status the server answers with.

Messages name the field and the value at fault, so a caller can fix the
request without reading the server's code.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from .validation import describe_errors, error_field


class MtrlError(Exception):
    """Base error: ``status`` is the HTTP status, ``code`` the error's name in the answer, ``param`` the request
    field at fault. A subclass declares its status and code as class arguments:
    ``class Gone(MtrlError, status=410, code="gone")``."""

    status = 400
    code = "invalid_request"

    def __init_subclass__(cls, *, status: int | None = None, code: str | None = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status = status
        if code is not None:
            cls.code = code

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class BadRequest(MtrlError, status=400, code="invalid_request"):
    """A request the coordinator cannot take: a field missing, of the wrong type or out of range."""

    @classmethod
    def naming(cls, errors: Sequence[Mapping[str, Any]]) -> "BadRequest":
        """The 400 for a body pydantic refused (``errors()`` of its exception): each field at fault by its dotted
        path and the value given; ``param`` is the first field, ``body`` for the body as a whole."""
        param = error_field(errors[0], whole="body") if errors else None
        return cls(describe_errors(errors, whole="body"), param=param)


class Unauthorized(MtrlError, status=401, code="unauthorized"):
    """No credential, or one that does not verify."""


class Forbidden(MtrlError, status=403, code="forbidden"):
    """A valid credential for something else: another rollout's token."""


class RolloutNotFound(MtrlError, status=404, code="rollout_not_found"):
    """A rollout id the coordinator does not know."""


class Conflict(MtrlError, status=409, code="conflict"):
    """A call that the rollout's state no longer allows: it ended, or its turn was taken."""


class RequestTimeout(MtrlError, status=408, code="request_timeout"):
    """A request body that did not arrive within the server's body timeout."""


class ServerBusy(MtrlError, status=503, code="server_busy"):
    """The server holds its limit of requests still sending their bodies; the caller may retry shortly."""


class PayloadTooLarge(MtrlError, status=413, code="payload_too_large"):
    """A request body over the configured limit."""


class EngineFailure(MtrlError, status=502, code="engine_failure"):
    """The policy engine, or the reference endpoint behind the coordinator, failed to answer."""


class AnswerFailure(MtrlError, status=500, code="answer_failure"):
    """The call was served but its answer could not be written; nothing was recorded for it."""


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
