"""Redirect every ``google-genai`` client used inside a rollout to the coordinator (and so Google ADK's ``Gemini``).

google-genai turns each call into an HTTP request in one method,
``google.genai._api_client.BaseApiClient._build_request``, for the sync and
the async client, httpx or aiohttp, streamed or not (ADK's ``Gemini`` model
and gemini-cli's Python peers build on the same client).
``instrument_gemini()`` puts the ``redirect`` layer (``_patches``) on it;
inside a rollout context a call the policy
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
value) for the policy. A generate call the rule passes through (a judge)
runs with no rollout current (``_selective.passing_by``), so it is left as
it was and reaches its own endpoint with the user's key; it is recorded on
the rollout as a non-policy model call (latency, tokens from its
``usageMetadata``, a stream's once read, its error), by wrappers of the
client's four request methods (``request``, ``async_request`` and their
streamed forms), each the ``selective`` layer of its method. Outside a rollout context the wrappers call the originals
unchanged.
It is installed only when called (the ``rollout`` decorator calls it), never
at import; without google-genai it does nothing.
"""

from __future__ import annotations

import functools
import itertools
import json
from typing import Any, Callable

from ._context import RolloutContext, current_rollout
from ._patches import PATCHES, Patch, Wrap
from ._selective import is_policy_call, passing_by
from .wire import HEADER_ROLLOUT_ID

_OWNER = "google.genai._api_client:BaseApiClient"
_KEY = "x-goog-api-key"
_GENERATE = (":generateContent", ":streamGenerateContent")
_SAMPLED = {"temperature": "temperature", "top_p": "topP", "max_tokens": "maxOutputTokens", "seed": "seed"}


def instrument_gemini() -> bool:
    """Install the redirect and the selective layers if google-genai is loaded, else the moment it is; True if
    installed now."""
    return PATCHES.install_when_imported(PATCHES_GEMINI)


def _redirecting(original: Callable[..., Any]) -> Callable[..., Any]:
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

    return _build_request


def _passing(self: Any, path: str) -> tuple[RolloutContext, str, str | None] | None:
    """``passing_by``'s arguments for a generate call inside a rollout that is not the policy's; else None."""
    ctx = current_rollout()
    if ctx is None or not path.split("?")[0].endswith(_GENERATE):
        return None
    model = model_of(path)
    return None if is_policy_call(ctx, "gemini", model, self._http_options.base_url) else (ctx, "gemini", model)


def _usage(call: Any, response: Any) -> None:
    """The tokens of one response (or stream chunk), from its body's ``usageMetadata``."""
    try:
        usage = json.loads(response.body).get("usageMetadata") if response.body else None
    except (TypeError, ValueError, AttributeError):
        return
    if isinstance(usage, dict):
        call.tokens(usage.get("promptTokenCount"), usage.get("candidatesTokenCount"))


def _answered(call: Any, response: Any) -> Any:
    """Record a whole answer's call (its tokens read from the body) and hand the answer on."""
    _usage(call, response)
    call.done()
    return response


def _wrap_request(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def request(self: Any, http_method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        passing = _passing(self, path)
        if passing is None:
            return original(self, http_method, path, *args, **kwargs)
        with passing_by(*passing) as call:
            response = original(self, http_method, path, *args, **kwargs)
        return _answered(call, response)

    return request


def _wrap_request_streamed(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def request_streamed(self: Any, http_method: str, path: str, *args: Any, **kwargs: Any) -> Any:
        passing = _passing(self, path)
        if passing is None:
            yield from original(self, http_method, path, *args, **kwargs)
            return
        chunks = original(self, http_method, path, *args, **kwargs)  # a generator: it sends on its first step
        with passing_by(*passing) as call:
            call.stream = True
            first = next(chunks, None)
        call.done()  # recorded now (a stream never read further still shows); completed as it is read
        yield from call.observe(itertools.chain(() if first is None else (first,), chunks),
                                functools.partial(_usage, call))

    return request_streamed


def _wrap_async(stream: bool) -> Wrap:
    """The wrap of ``async_request`` (``stream`` False: a whole answer) or of ``async_request_streamed`` (True: an
    async stream, its response open once awaited). Both send when awaited, unlike the sync stream, a generator
    that sends on its first step."""

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        async def async_request(self: Any, http_method: str, path: str, *args: Any, **kwargs: Any) -> Any:
            passing = _passing(self, path)
            if passing is None:
                return await original(self, http_method, path, *args, **kwargs)
            with passing_by(*passing) as call:
                call.stream = stream
                answer = await original(self, http_method, path, *args, **kwargs)
            if not stream:
                return _answered(call, answer)
            call.done()  # recorded now (a stream never read still shows); completed as it is read
            return call.aobserve(answer, functools.partial(_usage, call))

        return async_request

    return wrap


_PASSING = {"request": _wrap_request, "async_request": _wrap_async(stream=False),
            "request_streamed": _wrap_request_streamed, "async_request_streamed": _wrap_async(stream=True)}
PATCHES_GEMINI = (Patch(_OWNER, "_build_request", "redirect", _redirecting),
                  *(Patch(_OWNER, name, "selective", wrap) for name, wrap in _PASSING.items()))


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


__all__ = ["PATCHES_GEMINI", "instrument_gemini", "model_of", "redirect_request", "with_sampling"]
