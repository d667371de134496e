"""Redirect every ``google-genai`` client used inside a rollout to the coordinator (and so Google ADK's ``Gemini``).

google-genai turns each call into an HTTP request in one method,
``google.genai._api_client.BaseApiClient._build_request``, for the sync and
the async client, httpx or aiohttp, streamed or not (ADK's ``Gemini`` model
and gemini-cli's Python peers build on the same client).
``instrument_gemini()`` wraps it; inside a rollout context a call the policy
rule takes for the policy's (``_selective.is_policy_call``, by the model id
in the path ``models/<model>:generateContent``) is rewritten after it is
built:

* the URL becomes ``{endpoint}/rollouts/{id}/<path below base_url>``
  (``v1beta/models/<model>:generateContent``; the client's own ``base_url``
  is not touched, so clients shared between rollouts stay right);
* ``x-goog-api-key`` becomes the rollout's token, ``Authorization`` is
  removed and ``x-mtrl-rollout-id`` is added, so the user's real key never
  leaves the process;
* a generate call's ``generationConfig`` takes the rollout's ``temperature``,
  ``topP``, ``maxOutputTokens`` and ``seed``.

A Vertex AI client (``vertexai=True``) inside a rollout is refused before
it sends: its credential is an OAuth token added after the request is built,
and its paths are Vertex's; use the Gemini API client (an API key, any
value) for the policy. A call the rule passes through (a judge) is left as
it was and reaches its own endpoint. Outside a rollout context the wrapper
calls the original unchanged. It is installed only when called (the
``rollout`` decorator calls it), never at import; without google-genai it
does nothing.
"""

from __future__ import annotations

import functools
import importlib.util
import threading
from typing import Any

from ._context import RolloutContext, current_rollout
from ._selective import is_policy_call
from .wire import HEADER_ROLLOUT_ID

_INSTALL_LOCK = threading.Lock()
_MARK = "__mtrl_rollout_redirect__"
_KEY = "x-goog-api-key"
_GENERATE = (":generateContent", ":streamGenerateContent")
_SAMPLED = {"temperature": "temperature", "top_p": "topP", "max_tokens": "maxOutputTokens", "seed": "seed"}


def instrument_gemini() -> bool:
    """Install the redirect; True if installed now, False if already there or google-genai is not installed."""
    try:
        if importlib.util.find_spec("google.genai") is None:
            return False
    except ModuleNotFoundError:  # no google namespace at all
        return False
    from google.genai import _api_client

    with _INSTALL_LOCK:
        original = _api_client.BaseApiClient._build_request
        if getattr(original, _MARK, False):
            return False

        @functools.wraps(original)
        def _build_request(self: Any, http_method: str, path: str, request_dict: dict, http_options: Any = None) -> Any:
            ctx = current_rollout()
            base_url = self._http_options.base_url
            if ctx is None or not is_policy_call(ctx, "gemini", model_of(path), base_url):
                return original(self, http_method, path, request_dict, http_options)
            if self.vertexai:
                raise RuntimeError(
                    f"a google-genai Vertex AI client (vertexai=True) made a call inside rollout {ctx.rollout_id!r}; "
                    "mtrl redirects Gemini API clients only (its credential would be your Google OAuth token). "
                    "Build the policy's client as genai.Client(api_key=<any value>) (ADK: GOOGLE_GENAI_USE_VERTEXAI="
                    "false and GOOGLE_API_KEY set)"
                )
            if ctx.sampling and path.split("?")[0].endswith(_GENERATE):
                request_dict = with_sampling(request_dict, ctx.sampling)
            request = original(self, http_method, path, request_dict, http_options)
            redirect_request(request, str(base_url), ctx)
            return request

        setattr(_build_request, _MARK, True)
        _build_request.__mtrl_original__ = original  # type: ignore[attr-defined]
        _api_client.BaseApiClient._build_request = _build_request
        return True


def model_of(path: str) -> str | None:
    """The model id a request path names (``models/<id>:generateContent`` -> ``<id>``), else None."""
    head = path.split("?")[0].split(":")[0]
    marker = "models/"
    at = head.rfind(marker)
    return head[at + len(marker):] or None if at >= 0 else None


def with_sampling(request_dict: dict, sampling: Any) -> dict:
    config = dict(request_dict.get("generationConfig") or {})
    config.update({_SAMPLED[key]: value for key, value in sampling.items() if key in _SAMPLED})
    return {**request_dict, "generationConfig": config}


def redirect_request(request: Any, base_url: str, ctx: RolloutContext) -> None:
    """Point one built request at the rollout (in place): its URL, its key, the rollout's header."""
    base = base_url.rstrip("/")
    url = str(request.url)
    if not url.startswith(base):
        raise RuntimeError(
            f"a google-genai request inside a rollout names the URL {url!r}, outside the client's base_url "
            f"{base!r}; mtrl redirects only calls below base_url, and will not send this one with the rollout's "
            "token or your API key"
        )
    request.url = f"{ctx.endpoint.rstrip('/')}/rollouts/{ctx.rollout_id}/{url[len(base):].lstrip('/')}"
    headers = {name: value for name, value in request.headers.items()
               if name.lower() not in (_KEY, "authorization", HEADER_ROLLOUT_ID)}
    headers[_KEY] = ctx.token
    headers[HEADER_ROLLOUT_ID] = ctx.rollout_id
    request.headers = headers


__all__ = ["instrument_gemini", "model_of", "redirect_request", "with_sampling"]
