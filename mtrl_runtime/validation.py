"""Pydantic validation errors in one wording: a sentence per problem naming the field's dotted path and the value.

Config files, sandbox settings, judge specs and HTTP bodies are all checked by
pydantic models; their callers differ only in the exception they raise and the
words before the problems (a file name, ``invalid configuration: ``, ...), so
the problems themselves are described here, once. Imports nothing of the project.

- A missing field reads ``field required``: pydantic's input for it is the enclosing
  object, not a value of the field.
- A key the model does not know reads ``Extra inputs are not permitted: an unknown key (got value)``.
- A problem with the whole object (a model validator's, whose message names the
  fields it read) does not repeat that object, which may hold every setting and
  its secrets; a whole input that is not a mapping at all is shown.
- Values are shown as ``repr``, cut at ``VALUE_CHARS`` characters.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

VALUE_CHARS = 120
"""The longest value a message shows; a longer repr is cut and ends in ``...``."""


def error_field(error: Mapping[str, Any], *, whole: str = "(top level)", under: str = "") -> str:
    """The dotted path of the field at fault, below ``under``; ``whole`` when the problem is the whole object."""
    path = ".".join(str(part) for part in (under, *error["loc"]) if part != "")
    return path or whole


def describe_error(error: Mapping[str, Any], *, whole: str = "(top level)", under: str = "") -> str:
    """One problem (an item of ``ValidationError.errors()``) as ``field: what is wrong (got value)``."""
    field = error_field(error, whole=whole, under=under)
    if error["type"] == "missing":
        return f"{field}: field required"
    what = f"{error['msg']}: an unknown key" if error["type"] == "extra_forbidden" else error["msg"]
    value = error.get("input")
    if not error["loc"] and isinstance(value, Mapping):
        return f"{field}: {what}"
    return f"{field}: {what} (got {shown(value)})"


def describe_errors(errors: Iterable[Mapping[str, Any]], *, whole: str = "(top level)", under: str = "") -> str:
    """Every problem, ``; `` between them."""
    return "; ".join(describe_error(error, whole=whole, under=under) for error in errors)


def shown(value: Any) -> str:
    """``repr(value)``, at most ``VALUE_CHARS`` characters."""
    text = repr(value)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 3] + "..."


def validated(model: type[M], data: Mapping[str, Any], *, error: type[Exception], prefix: str = "",
              whole: str = "(top level)", under: str = "") -> M:
    """``data`` as ``model``, or ``error(prefix + every problem)`` naming each field and its value."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as exc:
        raise error(prefix + describe_errors(exc.errors(), whole=whole, under=under)) from None


def coerced(model: type[M], value: M | Mapping[str, Any] | None, *, error: type[Exception], prefix: str = "") -> M:
    """What a user may pass for settings: None (the defaults), an instance (a deep copy, so the caller's own stays
    as it is) or a mapping (``validated``); anything else is a TypeError naming its type."""
    if value is None:
        return model()
    if isinstance(value, model):
        return value.model_copy(deep=True)
    if not isinstance(value, Mapping):
        raise TypeError(f"{prefix}expected {model.__name__}, a mapping or None, got {type(value).__name__}")
    return validated(model, value, error=error, prefix=prefix)


__all__ = ["VALUE_CHARS", "coerced", "describe_error", "describe_errors", "error_field", "shown", "validated"]
