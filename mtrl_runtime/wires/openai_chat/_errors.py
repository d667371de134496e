"""OpenAI's error shape, which the OpenAI SDKs read (chat completions and Responses alike)."""

from __future__ import annotations

import orjson

from ...errors import MtrlError


def error_body(exc: MtrlError) -> tuple[bytes, dict[str, str]]:
    """OpenAI's error shape and headers: clients read ``error.message``; ``param`` names the field at fault.

    A 4xx is final (a 409 for an ended rollout or max_turns would be the same
    on a retry), so it tells OpenAI-style clients not to retry; an engine
    failure (5xx) may pass, and clients retry it as usual.
    """
    payload = {"error": {"message": exc.message, "type": exc.code, "param": exc.param, "code": exc.status}}
    return orjson.dumps(payload), {"x-should-retry": "false"} if exc.status < 500 else {}


__all__ = ["error_body"]
