"""The one hook both Stainless-built SDKs (``openai``, ``anthropic``) share: their ``BaseClient._build_request``.

Each SDK turns a call's options into an HTTP request there, once per attempt
(retries included), for its sync and async clients alike. ``build_request_patch``
declares the SDK's ``redirect`` layer on it (installed through ``_patches``):
inside a rollout context the SDK's ``redirect`` rewrites the options first;
outside one the original runs unchanged.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from ._context import RolloutContext, current_rollout
from ._patches import Patch
from .wire import HEADER_ROLLOUT_ID

Redirect = Callable[[Any, Any, RolloutContext], None]  # (client, request options, rollout) -> None, in place


def build_request_patch(sdk: str, redirect: Redirect) -> Patch:
    """The ``redirect`` layer on ``<sdk>._base_client.BaseClient._build_request``, calling ``redirect`` in a rollout."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def _build_request(self: Any, options: Any, *, retries_taken: int = 0) -> Any:
            ctx = current_rollout()
            if ctx is not None:
                redirect(self, options, ctx)
            return original(self, options, retries_taken=retries_taken)

        return _build_request

    return Patch(f"{sdk}._base_client:BaseClient", "_build_request", "redirect", wrap)


def point_at_rollout(client: Any, options: Any, ctx: RolloutContext, sdk: str, credentials: dict[str, Any]) -> str:
    """Point one request's options at the rollout (in place: the client copies options per attempt) and return
    the request's path below the client's base URL.

    The URL becomes the rollout's base URL for ``sdk`` plus that path (the client's own ``base_url`` is not
    touched, so clients shared between rollouts stay right); ``credentials`` (the rollout's token in the SDK's
    own header, ``Omit()`` for a header of the user's key) and the rollout's id replace the headers they name.
    """
    path = relative_path(client, options.url, sdk)
    options.url = f"{ctx.base_url_for(sdk)}/{path}"
    options.headers = replaced_headers(options.headers, {**credentials, HEADER_ROLLOUT_ID: ctx.rollout_id})
    return path


def relative_path(client: Any, url: str, sdk: str) -> str:
    """The request's path below the client's base URL; an absolute URL elsewhere is refused, naming ``sdk``."""
    import httpx

    parsed = httpx.URL(url)
    if parsed.is_relative_url:
        return url.lstrip("/")
    base = str(client.base_url)
    if url.startswith(base):
        return url[len(base):].lstrip("/")
    raise RuntimeError(
        f"an {sdk} request inside a rollout names the absolute URL {url!r}, outside the client's "
        f"base_url {base!r}; mtrl redirects only calls below base_url, and will not send this one "
        "with the rollout's token or your API key"
    )


def replaced_headers(headers: Any, replacements: dict[str, Any]) -> dict[str, Any]:
    """``headers`` less every header ``replacements`` names (in any case), then ``replacements`` (the rollout's
    credential in place of the user's; the SDK's ``Omit()`` as a value leaves a header out)."""
    named = {name.lower() for name in replacements}
    kept = {name: value for name, value in dict(headers or {}).items() if name.lower() not in named}
    return {**kept, **replacements}


__all__ = ["Redirect", "build_request_patch", "point_at_rollout", "relative_path", "replaced_headers"]
