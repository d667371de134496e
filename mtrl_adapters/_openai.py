"""Redirect every ``openai`` client used inside a rollout to the coordinator.

``instrument_openai()`` installs the ``redirect`` layer (``_patches``) on
``openai._base_client.BaseClient._build_request``,
the one method through which both the sync and the async client turn a
call's options into an HTTP request (once per attempt, retries included).
Inside a rollout context the wrapper rewrites the options before the
request is built:

* the URL becomes ``{endpoint}/rollouts/{id}/v1/<path>`` (the client's own
  ``base_url`` is not touched, so clients shared between rollouts stay right);
* ``Authorization`` becomes the rollout's token and ``x-mtrl-rollout-id`` is
  added; Azure's ``api-key`` header is removed, so the user's real key never
  leaves the process;
* a chat completion's (or a Responses call's) sampling fields take the rollout's values.

Outside a rollout context the wrapper calls the original unchanged. It is
installed only when called (the ``rollout`` decorator calls it), never at
import, and calling it again does nothing.
"""

from __future__ import annotations

from typing import Any

from ._context import RolloutContext
from ._patches import PATCHES
from ._sdk_redirect import build_request_patch, point_at_rollout

_SAMPLED_PATHS = ("chat/completions", "completions", "responses")  # the routes the coordinator samples on
_MAX_TOKENS_FIELDS = {"responses": "max_output_tokens"}  # the route's name for max_tokens, where it differs


def instrument_openai() -> bool:
    """Install the redirect if openai is loaded, else the moment it is; True if installed now."""
    return PATCHES.install_when_imported((REDIRECT,))


def redirect_options(client: Any, options: Any, ctx: RolloutContext) -> None:
    """Point one request's options at the rollout (in place: the client copies options per attempt)."""
    from openai._types import Omit

    path = point_at_rollout(client, options, ctx, "openai", {"Authorization": f"Bearer {ctx.token}", "api-key": Omit()})
    if ctx.sampling and isinstance(options.json_data, dict) and path.startswith(_SAMPLED_PATHS):
        options.json_data = _with_sampling(options.json_data, ctx.sampling, _MAX_TOKENS_FIELDS.get(path))


def _with_sampling(body: dict[str, Any], sampling: Any, max_tokens_field: str | None = None) -> dict[str, Any]:
    body = dict(body)
    for key, value in sampling.items():
        if key == "max_tokens":
            if max_tokens_field is not None:
                body[max_tokens_field] = value
            elif "max_completion_tokens" in body:
                body["max_completion_tokens"] = value
            else:
                body["max_tokens"] = value
        else:
            body[key] = value
    return body


REDIRECT = build_request_patch("openai", redirect_options)

__all__ = ["REDIRECT", "instrument_openai", "redirect_options"]
