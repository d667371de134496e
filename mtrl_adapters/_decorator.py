"""The ``rollout`` decorator and context manager: open, run, close one rollout.

The executor (or agent server) makes a rollout current with
``rollout_scope(spec)`` and calls the decorated function with the task; the
decorator claims the rollout, instruments the model clients, runs the
function and reports how it ended: ``completed``, ``failed`` (the exception's
text is recorded and the exception re-raised) or ``timed_out``. Outside any
rollout the decorated function runs exactly as it would undecorated, so the
same agent serves production traffic. A decorated function called inside an
already-open rollout (nesting) runs as part of it and closes nothing.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import logging
import sys
import time
from contextvars import ContextVar, Token
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, TypeVar

from ._aiobotocore import instrument_aiobotocore
from ._anthropic import instrument_anthropic
from ._bedrock import instrument_bedrock
from ._gemini import instrument_gemini
from ._litellm import instrument_litellm
from .mcp import instrument_mcp
from ._client import RolloutError, describe_error
from ._context import RolloutContext, activate, current_rollout, deactivate
from ._values import policy_model_ids
from ._openai import instrument_openai
from ._patches import PATCHES
from ._selective import instrument_selective

log = logging.getLogger("mtrl_adapters")

F = TypeVar("F", bound=Callable[..., Any])


class RolloutTimeout(TimeoutError):
    """The agent ran past the rollout's ``timeout_s``; the rollout ended as timed out."""


def rollout(
    fn: F | None = None, /, *, context: Any = None, timeout_s: float | None = None, policy_models: Any = None,
) -> Any:
    """Make an agent entrypoint trainable; use as ``@rollout``, ``@rollout(...)`` or ``with rollout():``.

    ``context`` names the rollout explicitly (a ``RolloutSpec`` or
    :class:`RolloutContext`); without it the decorator uses the rollout made
    current by ``rollout_scope``. ``timeout_s`` overrides the rollout's own
    timeout (async functions are cancelled at the deadline; sync functions
    cannot be interrupted and are marked timed out when they return late).
    ``policy_models`` (a model id or a list of them) names the models whose
    calls are the policy's; given here it replaces the run's setting, and
    every other model's calls pass through to their own endpoints, recorded
    but never trained on (``mtrl_adapters._selective`` states the rule).
    """
    runner = _Rollout(context, timeout_s, policy_model_ids(policy_models))
    if fn is None:
        return runner
    if not callable(fn):
        raise TypeError(f"rollout: expected a function to decorate, got {fn!r}; name a rollout with rollout(context=spec)")
    return runner(fn)


def instrument() -> None:
    """Install the model-call redirects (openai, anthropic, google-genai, botocore, aiobotocore), LiteLLM's guard
    when it is loaded, and the tool-call capture of the frameworks loaded: LangChain's callbacks, Strands' hooks on
    every Agent built inside a rollout, and the names of the MCP servers their tools come from (``mtrl_adapters.mcp``).
    Each is a declared layer of ``_patches.PATCHES``: where two share a method (botocore's ``_make_api_call``:
    selective capture outside the Bedrock redirect) their order is the set's, not the order of the calls below.
    No SDK or framework is imported here: one the process has not loaded is instrumented the moment it loads
    (``_on_import``), so an agent that imports its client or framework inside the rollout is captured from its
    first call or Agent."""
    instrument_openai()
    instrument_anthropic()
    instrument_gemini()
    instrument_bedrock()
    instrument_aiobotocore()
    instrument_litellm()
    instrument_selective()
    for module_name, action in _FRAMEWORKS:
        PATCHES.call_when_imported(module_name, action)


def _adapter(name: str) -> ModuleType | None:
    """``mtrl_adapters.<name>``; None while it is being imported: its own import loaded the framework (the user
    imported mtrl's adapter before the framework), so its names are not defined yet, and the next rollout's
    ``instrument()`` installs it, as every rollout start did before the import hook."""
    module = sys.modules.get(f"{__package__}.{name}")
    if module is not None and getattr(getattr(module, "__spec__", None), "_initializing", False):
        return None
    return importlib.import_module(f".{name}", __package__)


def _langchain(_: ModuleType) -> None:
    if (adapter := _adapter("langgraph")) is not None:
        adapter.instrument_langchain()


def _strands(_: ModuleType) -> None:
    if (adapter := _adapter("strands")) is not None:
        adapter.instrument_strands()


def _mcp_session(module: ModuleType) -> None:
    instrument_mcp(module.ClientSession)


def _langchain_mcp(_: ModuleType) -> None:
    if (adapter := _adapter("langgraph")) is not None:
        adapter.instrument_langchain_mcp()


def _openai_agents(_: ModuleType) -> None:
    if "agents.mcp.util" in sys.modules and (adapter := _adapter("openai_agents")) is not None:
        adapter.instrument_openai_agents_mcp()  # the SDK's MCP support, loaded by its package (or not at all)


_FRAMEWORKS: tuple[tuple[str, Callable[[ModuleType], None]], ...] = (
    # the module whose load means the framework's objects can exist -> what instruments them (its adapter module
    # imports the framework, so it is imported only then); a package is watched where the adapter imports names
    # its __init__ defines, so it runs once that __init__ has
    ("langchain_core", _langchain),
    ("strands", _strands),
    ("mcp.client.session", _mcp_session),  # no MCP client can exist before it is loaded
    ("langchain_mcp_adapters.tools", _langchain_mcp),
    ("agents", _openai_agents),
)


@dataclass
class _Opened:
    """A rollout entered by one call: whether this call owns its end, and since when it runs."""

    ctx: RolloutContext
    reset: Any  # ContextVar token when this call made ctx current, else None
    owned: bool
    started: float
    timeout_s: float | None

    def outcome(self, exc: BaseException | None) -> tuple[str, str | None]:
        elapsed = time.monotonic() - self.started
        late = self.timeout_s is not None and elapsed > self.timeout_s
        if isinstance(exc, RolloutTimeout) or (exc is None and late):
            return "timed_out", f"the agent ran {elapsed:.1f}s, past timeout_s={self.timeout_s}"
        if exc is not None:
            return "failed", describe_error(exc)
        if self.ctx.refusal is not None:  # a refused model call the agent caught: its calls cannot be trained
            return "failed", self.ctx.refusal
        return "completed", None

    def close(self, exc: BaseException | None) -> None:
        if self.owned:
            status, error = self.outcome(exc)
            _settle(lambda: self.ctx.complete(status, error), exc)

    async def aclose(self, exc: BaseException | None) -> None:
        if self.owned:
            late_errors = await self.ctx.drain()  # rewards reported in the background
            status, error = self.outcome(exc)
            try:
                await self.ctx.acomplete(status, error)
            except RolloutError as err:
                _refused(err, exc)
            if late_errors and exc is None:
                raise late_errors[0]

    def release(self) -> None:
        if self.reset is not None:
            deactivate(self.reset)


def _settle(complete: Callable[[], Any], exc: BaseException | None) -> None:
    try:
        complete()
    except RolloutError as err:
        _refused(err, exc)


def _refused(err: RolloutError, exc: BaseException | None) -> None:
    """A refused completion: the coordinator ended the rollout already (409), or is unreachable."""
    if err.status == 409:
        log.warning("%s", err.message)
        return
    if exc is not None:  # the agent's own exception is the one to see; log ours
        log.error("could not record the rollout's failure: %s", err.message)
        return
    raise err


class _Rollout:
    """The object ``rollout(...)`` returns: a decorator and a (sync or async) context manager."""

    def __init__(self, context: Any, timeout_s: float | None, policy_models: frozenset[str] | None = None) -> None:
        if timeout_s is not None and not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0 seconds, got {timeout_s!r}")
        self._context = context
        self._timeout_s = timeout_s
        self._policy_models = policy_models
        # what each `with` entered, per task/thread: one object may serve concurrent `with` blocks
        self._entered: ContextVar[tuple[tuple[_Opened | None, Token], ...]] = ContextVar("mtrl_rollout_with", default=())

    def _enter(self, loop: asyncio.AbstractEventLoop | None = None) -> _Opened | None:
        ctx = RolloutContext.from_spec(self._context) if self._context is not None else current_rollout()
        if ctx is None:
            return None
        owned = ctx.claim(loop)
        if owned and self._policy_models is not None:
            ctx.policy_models = self._policy_models
        reset = activate(ctx) if current_rollout() is not ctx else None
        if owned:
            instrument()
        timeout = self._timeout_s if self._timeout_s is not None else ctx.timeout_s
        return _Opened(ctx, reset, owned, time.monotonic(), timeout)

    # ------------------------------------------------------------------ decorator
    def __call__(self, fn: F) -> F:
        if _is_async(fn):

            @functools.wraps(fn)
            async def arun(*args: Any, **kwargs: Any) -> Any:
                opened = self._enter(asyncio.get_running_loop())
                if opened is None or not opened.owned:
                    return await _released(opened, fn(*args, **kwargs))
                try:
                    result = await _deadline(fn(*args, **kwargs), opened.timeout_s)
                except Exception as exc:
                    await opened.aclose(exc)
                    raise
                except BaseException:
                    raise  # cancelled: whoever cancelled decides how the rollout ends
                else:
                    await opened.aclose(None)
                    return result
                finally:
                    opened.release()

            wrapper: Any = arun
        else:

            @functools.wraps(fn)
            def run(*args: Any, **kwargs: Any) -> Any:
                opened = self._enter()
                if opened is None or not opened.owned:
                    try:
                        return fn(*args, **kwargs)
                    finally:
                        if opened is not None:
                            opened.release()
                try:
                    result = _not_awaitable(fn(*args, **kwargs))
                except Exception as exc:
                    opened.close(exc)
                    raise
                else:
                    opened.close(None)
                    return result
                finally:
                    opened.release()

            wrapper = run
        wrapper.__mtrl_rollout__ = True
        return wrapper  # type: ignore[return-value]

    # ------------------------------------------------------------------ context manager
    def __enter__(self) -> RolloutContext | None:
        return self._push(self._enter())

    def _push(self, opened: _Opened | None) -> RolloutContext | None:
        stack = self._entered.get()
        token = self._entered.set(stack + ((opened, None),))
        self._entered.set(stack + ((opened, token),))
        return opened.ctx if opened is not None else None

    def _pop(self) -> _Opened | None:
        opened, token = self._entered.get()[-1]
        self._entered.reset(token)
        return opened

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        opened = self._pop()
        if opened is not None:
            try:
                if exc is None or isinstance(exc, Exception):
                    opened.close(exc)
            finally:
                opened.release()
        return False

    async def __aenter__(self) -> RolloutContext | None:
        return self._push(self._enter(asyncio.get_running_loop()))

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        opened = self._pop()
        if opened is not None:
            try:
                if exc is None or isinstance(exc, Exception):
                    await opened.aclose(exc)
            finally:
                opened.release()
        return False


def _is_async(fn: Any) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one (a class-based agent)."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _not_awaitable(result: Any) -> Any:
    """A sync agent's result; an awaitable would never run, so the rollout must fail rather than end empty."""
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()  # never awaited: close it without the "never awaited" warning
        raise TypeError(
            f"the agent returned {type(result).__name__} {result!r:.80}, an awaitable nobody awaits; "
            "make the agent an `async def` (or give its class an `async def __call__`)"
        )
    return result


async def _released(opened: _Opened | None, awaitable: Any) -> Any:
    try:
        return await awaitable
    finally:
        if opened is not None:
            opened.release()


async def _deadline(awaitable: Any, timeout_s: float | None) -> Any:
    if timeout_s is None:
        return await awaitable
    started = time.monotonic()
    try:
        return await asyncio.wait_for(awaitable, timeout_s)
    except asyncio.TimeoutError:
        if time.monotonic() - started < timeout_s:
            raise  # a timeout of the agent's own, before the deadline: a failure, not ours
        raise RolloutTimeout(f"the agent did not finish within timeout_s={timeout_s}") from None


def is_decorated(fn: Any) -> bool:
    """True for a function wrapped by :func:`rollout`."""
    return bool(getattr(fn, "__mtrl_rollout__", False))


__all__ = ["RolloutTimeout", "instrument", "is_decorated", "rollout"]
