"""LiteLLM inside a rollout: ``openai/`` model ids are captured, its own HTTP calls refused before they are sent.

LiteLLM (``litellm.completion`` / ``acompletion``, and so Strands'
``LiteLLMModel``) reaches a provider one of two ways:

* through the ``openai`` SDK: ``openai/<model>`` ids (with or without
  ``api_base``) and the OpenAI-compatible providers built on it. The
  ``openai`` redirect (``_openai``) already points those requests at the
  rollout, with the rollout's token in place of the key: they are captured
  as chat completions, token for token, like any OpenAI client's;
* over LiteLLM's own HTTP client (``litellm.llms.custom_httpx.http_handler``:
  ``HTTPHandler`` and ``AsyncHTTPHandler``): ``anthropic/<model>``,
  ``bedrock/<model>`` (signed by LiteLLM itself with SigV4), Vertex, Gemini
  and most others. Nothing rewrites those, and each provider's body and
  signing differ, so mtrl does not redirect them.

``instrument_litellm()`` puts the ``guard`` layer (``_patches``) on every
request method of both handler classes: inside a rollout, a request to any
URL but the rollout's own coordinator endpoint raises :class:`UncapturedLiteLLMCall` before a byte is
sent, naming the fix. Outside a rollout, and for non-policy calls that
selective capture lets pass (it runs them with no rollout current), the
handlers run unchanged. Installed by the ``rollout`` decorator when
its HTTP client module is loaded (importing LiteLLM is slow and reads the
network for its cost map, so mtrl never imports it), or, when it is not yet
loaded, the moment that module loads (``_patches``' import hook); calling it
again does nothing.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable
from urllib.parse import urlsplit

from ._context import RolloutContext, current_rollout
from ._patches import PATCHES, Patch

_HANDLER_MODULE = "litellm.llms.custom_httpx.http_handler"
_HANDLERS = ("HTTPHandler", "AsyncHTTPHandler")
_METHODS = ("get", "post", "put", "patch", "delete", "single_connection_post_request")


class UncapturedLiteLLMCall(RuntimeError):
    """LiteLLM was about to send a model call inside a rollout over its own HTTP client, past mtrl."""


def instrument_litellm() -> bool:
    """Install the guard if LiteLLM's HTTP client module is loaded; True if installed now.

    If it is not loaded yet (an agent that imports LiteLLM inside its rollout
    function), the guard is installed the moment it is (``_patches``' import
    hook), before any call of the rollout that imports it can be made.
    """
    return PATCHES.install_when_imported(GUARDS)


def _guard(where: str, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)
    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def guarded_async(*args: Any, **kwargs: Any) -> Any:
            _check(signature, args, kwargs, where)
            return await original(*args, **kwargs)

        return guarded_async

    @functools.wraps(original)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _check(signature, args, kwargs, where)
        return original(*args, **kwargs)

    return guarded


GUARDS = tuple(  # a method this LiteLLM version lacks is skipped (required=False), as before
    Patch(f"{_HANDLER_MODULE}:{cls}", method, "guard", functools.partial(_guard, f"{cls}.{method}"), required=False)
    for cls in _HANDLERS for method in _METHODS
)


def _check(signature: inspect.Signature, args: tuple, kwargs: dict, where: str) -> None:
    ctx = current_rollout()
    if ctx is None:
        return
    url = str(signature.bind_partial(*args, **kwargs).arguments.get("url", ""))
    if not is_coordinator_url(url, ctx):
        raise UncapturedLiteLLMCall(refusal(url, ctx, where))


def is_coordinator_url(url: str, ctx: RolloutContext) -> bool:
    """Whether ``url`` is on the rollout's coordinator endpoint (scheme, host and port equal, path below it)."""
    target, endpoint = urlsplit(url), urlsplit(ctx.endpoint)
    return ((target.scheme, target.netloc) == (endpoint.scheme, endpoint.netloc)
            and target.path.startswith(endpoint.path.rstrip("/") + "/"))


def refusal(url: str, ctx: RolloutContext, where: str) -> str:
    """The error text: what was refused, why, and the fixes."""
    host = urlsplit(url).netloc or url
    return (
        f"LiteLLM was about to send a request to {host} ({url}) inside rollout {ctx.rollout_id!r} over its own "
        f"HTTP client ({where}), which mtrl does not redirect: the model call would go to the provider untrained. "
        "It was refused before sending. Fix: give the policy an 'openai/<model>' model id (LiteLLM calls those "
        "through the openai SDK, which mtrl points at the rollout; e.g. Strands LiteLLMModel(model_id='openai/policy')"
        "), or use the framework's own provider class (Strands AnthropicModel / BedrockModel, which mtrl captures). "
        "A judge or other non-policy model called through LiteLLM this way must be called outside the rollout"
    )


__all__ = ["GUARDS", "UncapturedLiteLLMCall", "instrument_litellm", "is_coordinator_url", "refusal"]
