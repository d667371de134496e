"""Redirect every ``anthropic`` client used inside a rollout to the coordinator.

The Anthropic SDK is built like OpenAI's: ``anthropic._base_client.BaseClient._build_request``
turns a call's options into an HTTP request, once per attempt, for the sync
and the async client (``Anthropic``, ``AsyncAnthropic``, and so every
framework built on them: Strands' ``AnthropicModel``, LangChain's
``ChatAnthropic``). ``instrument_anthropic()`` installs the ``redirect`` layer
(``_patches``) on it; inside a rollout
context the wrapper rewrites the options before the request is built:

* the URL becomes ``{endpoint}/rollouts/{id}/<path>`` (``v1/messages``; the
  client's own ``base_url`` is not touched, so shared clients stay right);
* ``X-Api-Key`` becomes the rollout's token, ``Authorization`` (an
  ``auth_token``) is removed and ``x-mtrl-rollout-id`` is added, so the
  user's real key never leaves the process;
* a Messages call's ``temperature``, ``top_p``, ``max_tokens`` and ``seed`` take the
  rollout's values.

Outside a rollout context the wrapper calls the original unchanged. It is
installed only when called (the ``rollout`` decorator calls it), never at
import; without the ``anthropic`` package it does nothing.
"""

from __future__ import annotations

from typing import Any

from ._context import RolloutContext
from ._patches import PATCHES
from ._sdk_redirect import build_request_patch, point_at_rollout

_SAMPLED = {"temperature", "top_p", "max_tokens", "seed"}  # the rollout's sampling fields (seed: an mtrl extension)


def instrument_anthropic() -> bool:
    """Install the redirect if anthropic is loaded, else the moment it is; True if installed now."""
    return PATCHES.install_when_imported((REDIRECT,))


def redirect_anthropic_options(client: Any, options: Any, ctx: RolloutContext) -> None:
    """Point one request's options at the rollout (in place: the client copies options per attempt)."""
    from anthropic._types import Omit

    # "X-Api-Key": the SDK's own spelling, so it replaces the client's key; "Authorization": an auth_token
    path = point_at_rollout(client, options, ctx, "anthropic", {"X-Api-Key": ctx.token, "Authorization": Omit()})
    if ctx.sampling and isinstance(options.json_data, dict) and path.split("?")[0].endswith("messages"):
        options.json_data = {**options.json_data, **{k: v for k, v in ctx.sampling.items() if k in _SAMPLED}}


REDIRECT = build_request_patch("anthropic", redirect_anthropic_options)

__all__ = ["REDIRECT", "instrument_anthropic", "redirect_anthropic_options"]
