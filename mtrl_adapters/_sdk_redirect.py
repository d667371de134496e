"""The one hook both Stainless-built SDKs (``openai``, ``anthropic``) share: their ``BaseClient._build_request``.

Each SDK turns a call's options into an HTTP request there, once per attempt
(retries included), for its sync and async clients alike. ``wrap_build_request``
wraps it once: inside a rollout context the SDK's ``redirect`` rewrites the
options first; outside one the original runs unchanged.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

from ._context import RolloutContext, current_rollout

_INSTALL_LOCK = threading.Lock()
_MARK = "__mtrl_rollout_redirect__"

Redirect = Callable[[Any, Any, RolloutContext], None]  # (client, request options, rollout) -> None, in place


def wrap_build_request(base_client: type, redirect: Redirect) -> bool:
    """Wrap ``base_client._build_request`` with ``redirect``; True if installed now, False if it already was."""
    with _INSTALL_LOCK:
        original = base_client._build_request  # type: ignore[attr-defined]
        if getattr(original, _MARK, False):
            return False

        @functools.wraps(original)
        def _build_request(self: Any, options: Any, *, retries_taken: int = 0) -> Any:
            ctx = current_rollout()
            if ctx is not None:
                redirect(self, options, ctx)
            return original(self, options, retries_taken=retries_taken)

        setattr(_build_request, _MARK, True)
        _build_request.__mtrl_original__ = original  # type: ignore[attr-defined]
        base_client._build_request = _build_request  # type: ignore[attr-defined]
        return True


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


__all__ = ["Redirect", "relative_path", "wrap_build_request"]
