"""Selective capture: only the policy's model calls go to the coordinator; the rest pass through, recorded.

Inside a rollout the redirects (``_openai``, ``_anthropic``, ``_bedrock``)
send a client's calls to the policy endpoint. An agent may also call other
models: an LLM-as-judge inside the reward computation, a GPT planner beside a
policy worker. Such calls must reach their real endpoint with the user's own
key, and must not be trained on.

Which calls are the policy's is :func:`is_policy_call`, by the rule
``_policy_rule`` states: with ``policy_models`` named, by the model id the
call names; with none named, a rollout's calls are the policy's while they
are alike, and a call unlike them passes through only when the policy's
client was aimed at the coordinator, else is refused (never guessed).

A passing call runs with no rollout current, so the redirects leave it alone
(the user's key, base URL, AWS signature and sampling fields stay as they
were). It is recorded on the rollout (:meth:`RolloutContext.record_model_call`):
protocol, model, latency, input/output tokens when the response says them
(a stream's when it has been read), error. The buffer is sent with the
rollout's end (``/rollouts/{id}/model_calls/batch``); the coordinator stores
it apart from turns, so it is shown in the trace and never trained on.

Installed by the ``rollout`` decorator (:func:`instrument_selective`), never
at import; installing again does nothing. Each wrapper is the ``selective``
layer of its method (``_patches``), the outermost: on botocore's
``_make_api_call`` it sits outside the Bedrock redirect, whatever order the
two are installed in, so a passing call reaches the redirect with no rollout.
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Any, AsyncIterable, AsyncIterator, Callable, Iterable, Iterator

from ._bedrock import is_bedrock_runtime
from ._context import RolloutContext, activate, current_rollout, deactivate
from ._patches import PATCHES, Patch
from ._policy_rule import UnresolvedModelCall, call_kind
from .wire import ModelCallReport

_SDKS = ("openai", "anthropic")  # Stainless-built SDKs: every call goes through {Sync,Async}APIClient.request
_BEDROCK_MODEL_OPERATIONS = ("Converse", "ConverseStream", "InvokeModel", "InvokeModelWithResponseStream")
_ERROR_CHARS = 2000


def is_policy_call(ctx: RolloutContext, protocol: str, model: str | None, base_url: Any = None) -> bool:
    """Whether a call of ``model`` from a client built for ``base_url`` inside ``ctx`` is the policy's
    (``_policy_rule`` states the rule); raises :class:`UnresolvedModelCall` where it cannot tell."""
    names = ctx.policy_models
    if names is None:
        return not model or ctx.unnamed_policy.is_policy(call_kind(protocol, model, base_url, ctx.endpoint),
                                                         ctx.rollout_id)
    if not model:
        raise UnresolvedModelCall(
            f"a {protocol} call inside rollout {ctx.rollout_id!r} names no model id, and this rollout captures only "
            f"the policy models {sorted(names)!r}; mtrl cannot tell whether to train on it. Name the model in the "
            "call, or make it outside the rollout (or unset policy_models to capture every call)"
        )
    return model in names or (ctx.model_name is not None and model == ctx.model_name)


def instrument_selective() -> list[str]:
    """Install the pass-through for the SDKs loaded, and for the others the moment they are; returns the protocols
    installed now."""
    installed = [sdk for sdk in _SDKS if PATCHES.install_when_imported(SDK_PATCHES[sdk])]
    if PATCHES.install_when_imported((BEDROCK_PATCH,)):
        installed.append("bedrock")
    return installed


# ---------------------------------------------------------------------- openai / anthropic
def _body_model(options: Any) -> str | None:
    body = getattr(options, "json_data", None)
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) else None


@contextlib.contextmanager
def passing_by(ctx: RolloutContext, protocol: str, model: str | None) -> Iterator["_Watch"]:
    """Run a non-policy call inside the block: watched (its failure recorded), with no rollout current, so the
    redirects leave it alone and it reaches its own endpoint with the user's credentials."""
    call = _Watch(ctx, protocol, model)
    reset = activate(None)
    try:
        yield call
    except Exception as exc:
        call.failed(exc)
        raise
    finally:
        deactivate(reset)


def _sync_request(protocol: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def request(self: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = current_rollout()
        model = _body_model(options)
        if ctx is None or is_policy_call(ctx, protocol, model, self.base_url):
            return original(self, cast_to, options, *args, **kwargs)
        with passing_by(ctx, protocol, model) as call:
            result = original(self, cast_to, options, *args, **kwargs)
        return call.answered(result)

    return request


def _async_request(protocol: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def request(self: Any, cast_to: Any, options: Any, *args: Any, **kwargs: Any) -> Any:
        ctx = current_rollout()
        model = _body_model(options)
        if ctx is None or is_policy_call(ctx, protocol, model, self.base_url):
            return await original(self, cast_to, options, *args, **kwargs)
        with passing_by(ctx, protocol, model) as call:
            result = await original(self, cast_to, options, *args, **kwargs)
        return call.answered(result)

    return request


SDK_PATCHES = {
    sdk: (Patch(f"{sdk}._base_client:SyncAPIClient", "request", "selective", functools.partial(_sync_request, sdk)),
          Patch(f"{sdk}._base_client:AsyncAPIClient", "request", "selective", functools.partial(_async_request, sdk)))
    for sdk in _SDKS
}


# ---------------------------------------------------------------------- bedrock (botocore)
def _botocore_call(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def _make_api_call(self: Any, operation_name: str, api_params: Any) -> Any:
        passing = bedrock_passing(self, operation_name, api_params)
        if passing is None:
            return original(self, operation_name, api_params)
        with passing_by(*passing) as call:
            result = original(self, operation_name, api_params)
        if isinstance(result, dict) and result.get("stream") is not None:  # ConverseStream: usage in its metadata
            call.stream = True
            call.done()  # recorded now; completed as the stream is read
            result["stream"] = _ObservedEventStream(result["stream"], call)
            return result
        call.converse_usage(result)
        call.done()
        return result

    return _make_api_call


def bedrock_passing(client: Any, operation_name: str, api_params: Any) -> tuple[RolloutContext, str, str | None] | None:
    """``passing_by``'s arguments for a Bedrock model call (botocore's or aiobotocore's ``_make_api_call``) made
    inside a rollout that is not the policy's; None for any other call."""
    ctx = current_rollout()
    if ctx is None or operation_name not in _BEDROCK_MODEL_OPERATIONS or not is_bedrock_runtime(client):
        return None
    model = api_params.get("modelId") if isinstance(api_params, dict) else None
    model = model if isinstance(model, str) else None
    return None if is_policy_call(ctx, "bedrock", model, client.meta.endpoint_url) else (ctx, "bedrock", model)


BEDROCK_PATCH = Patch("botocore.client:BaseClient", "_make_api_call", "selective", _botocore_call)


class _ObservedEventStream:
    """A botocore ``EventStream`` that notes the ``metadata`` event's usage as the caller reads it."""

    def __init__(self, stream: Any, call: "_Watch") -> None:
        self._stream = stream
        self._call = call

    def __iter__(self) -> Any:
        return self._call.observe(self._stream, self._note)

    def _note(self, event: Any) -> None:
        if isinstance(event, dict):
            self._call.converse_usage(event.get("metadata"))

    def __getattr__(self, name: str) -> Any:  # close(), get_initial_response(): the stream's own
        return getattr(self._stream, name)


# ---------------------------------------------------------------------- one passing call
class _Watch:
    """Times one passing call and records it on its rollout once (tokens of a stream as they pass)."""

    def __init__(self, ctx: RolloutContext, protocol: str, model: str | None) -> None:
        self.ctx = ctx
        self.protocol = protocol
        self.model = model
        self.started_at = time.time()
        self.t0 = time.perf_counter()
        self.input_tokens: int | None = None
        self.output_tokens: int | None = None
        self.stream = False
        self.report: ModelCallReport | None = None  # recorded once; a stream's is completed as it is read

    def tokens(self, input_tokens: Any, output_tokens: Any) -> None:
        if isinstance(input_tokens, int) and not isinstance(input_tokens, bool):
            self.input_tokens = input_tokens
        if isinstance(output_tokens, int) and not isinstance(output_tokens, bool):
            self.output_tokens = output_tokens

    def converse_usage(self, holder: Any) -> None:
        """Tokens from the ``usage`` of a Bedrock Converse answer (or of a ConverseStream ``metadata`` event)."""
        usage = holder.get("usage") if isinstance(holder, dict) else None
        if isinstance(usage, dict):
            self.tokens(usage.get("inputTokens"), usage.get("outputTokens"))

    def usage_of(self, obj: Any) -> None:
        """Tokens from a response, a stream chunk or a stream event, wherever its SDK put them."""
        for holder in (obj, getattr(obj, "response", None), getattr(obj, "message", None)):
            usage = getattr(holder, "usage", None)
            if usage is not None:
                self.tokens(_first(usage, "prompt_tokens", "input_tokens"),
                            _first(usage, "completion_tokens", "output_tokens"))

    def answered(self, result: Any) -> Any:
        iterator = getattr(result, "_iterator", None)
        if iterator is not None and (hasattr(iterator, "__anext__") or hasattr(iterator, "__next__")):
            self.stream = True
            self.done()  # recorded now (a stream never read still shows); completed as it is read
            observe = self.aobserve if hasattr(iterator, "__anext__") else self.observe
            result._iterator = observe(iterator, self.usage_of)
            return result
        self.usage_of(result)
        self.done()
        return result

    def observe(self, items: Iterable[Any], note: Callable[[Any], None]) -> Iterator[Any]:
        """Hand on a stream's items, each ``note``d (its tokens) first; the call is completed when the reading ends."""
        with self._reading():
            for item in items:
                note(item)
                yield item

    async def aobserve(self, items: AsyncIterable[Any], note: Callable[[Any], None]) -> AsyncIterator[Any]:
        """:meth:`observe` for an async stream."""
        with self._reading():
            async for item in items:
                note(item)
                yield item

    @contextlib.contextmanager
    def _reading(self) -> Iterator[None]:
        """Around reading a stream: its call completed when the reading ends, with the error that ended it (none
        when the reader stopped early)."""
        error = None
        try:
            yield
        except Exception as exc:
            error = exc
            raise
        finally:
            self.done(error)

    def failed(self, exc: BaseException) -> None:
        self.done(exc)

    def done(self, error: BaseException | None = None) -> None:
        text = None if error is None else f"{type(error).__name__}: {error}"[:_ERROR_CHARS]
        if self.report is not None:  # a stream read to its end (or broken off): its totals
            self.report.latency_s = max(time.perf_counter() - self.t0, 0.0)
            self.report.input_tokens, self.report.output_tokens = self.input_tokens, self.output_tokens
            if text is not None:
                self.report.status, self.report.error = "error", text
            return
        self.report = ModelCallReport(
            protocol=self.protocol,
            model=self.model,
            latency_s=max(time.perf_counter() - self.t0, 0.0),
            started_at=self.started_at,
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            stream=self.stream,
            status="error" if text is not None else "success",
            error=text,
        )
        self.ctx.record_model_call(self.report)


def _first(usage: Any, *names: str) -> Any:
    for name in names:
        value = usage.get(name) if isinstance(usage, dict) else getattr(usage, name, None)
        if value is not None:
            return value
    return None


__all__ = ["BEDROCK_PATCH", "SDK_PATCHES", "UnresolvedModelCall", "bedrock_passing", "instrument_selective",
           "is_policy_call", "passing_by"]
