"""Turning the store's refusal of client-sent data into the client's error."""

from __future__ import annotations

import contextlib
from typing import Iterator

from ..errors import BadRequest


@contextlib.contextmanager
def client_data(param: str) -> Iterator[None]:
    """A value a client sent that the store refuses (it validates before writing anything) is a 400."""
    try:
        yield
    except ValueError as exc:
        raise BadRequest(f"{param}: {exc}", param=param) from None


__all__ = ["client_data"]
