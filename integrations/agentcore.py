"""AgentCore-hosted agents: make a ``BedrockAgentCoreApp`` entrypoint trainable.

Put :func:`trainable` under ``@app.entrypoint``::

    app = BedrockAgentCoreApp()

    @app.entrypoint
    @trainable
    async def invoke(payload):
        task = current_rollout().task if current_rollout() else None
        ...

An invocation whose payload is a rollout request (``instance`` plus
``metadata`` with mtrl's ``rollout_token``, as ``HttpExecutor.for_agentcore``
sends it to ``/invocations``) runs inside that rollout: model calls go to
the coordinator, tool calls and the reward are recorded, and the rollout
is closed when the entrypoint returns; the response is the rollout's
result (``rollout_id``, ``status``, ``error``, ``reward``, ``result``).
Any other payload runs the entrypoint exactly as before, so the deployed
agent keeps serving its users. The entrypoint still receives the payload
(and the AgentCore context when it takes one); the task is
``current_rollout().task`` or ``payload["instance"]``.

Streaming entrypoints (an async or sync generator, which AgentCore answers
as server-sent events) are trainable too: a user's invocation still streams
every event as before; a rollout invocation runs the generator to its end
inside the rollout (its model calls, tool calls and reward recorded as
usual) and answers the rollout's result as JSON, whose ``result`` is the
last event the generator yielded (None if it yielded none).

Online learning (``mtrl online``, docs/online.md): put :func:`learn_online`
under ``@app.entrypoint`` instead. Each user invocation opens its session
with the coordinator (the AgentCore session id, or ``payload["session_id"]``);
a session drawn for recording runs inside its rollout, the others run as
they are; every user gets the entrypoint's own answer either way, from the
adapter the coordinator serves now. Rollout payloads still run as rollouts.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any, Callable, Mapping

from mtrl_adapters import context_from_request, describe_error, rollout, rollout_result, rollout_scope
from mtrl_adapters.online import OnlineClient


def is_rollout_payload(payload: Any) -> bool:
    """True for an invocation payload that names an mtrl rollout."""
    metadata = payload.get("metadata") if isinstance(payload, Mapping) else None
    return isinstance(metadata, Mapping) and bool(metadata.get("rollout_token")) and "instance" in payload


def trainable(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap an AgentCore entrypoint (sync, async, or a streaming generator) so rollout payloads run as rollouts."""
    target = _drained(fn)
    agent = rollout(target)
    if inspect.iscoroutinefunction(target):

        @functools.wraps(fn)
        async def async_entry(payload: Any, *args: Any, **kwargs: Any) -> Any:
            if not is_rollout_payload(payload):
                answer = fn(payload, *args, **kwargs)  # an async generator is returned as is: AgentCore streams it
                return answer if inspect.isasyncgen(answer) else await answer
            ctx = context_from_request(payload)
            result, error = None, None
            with rollout_scope(ctx):
                try:
                    result = await agent(payload, *args, **kwargs)
                except Exception as exc:  # recorded as the rollout's failure; the runtime keeps serving
                    error = describe_error(exc)
            return rollout_result(ctx, result, error)

        return async_entry

    @functools.wraps(fn)
    def entry(payload: Any, *args: Any, **kwargs: Any) -> Any:
        if not is_rollout_payload(payload):
            return fn(payload, *args, **kwargs)
        ctx = context_from_request(payload)
        result, error = None, None
        with rollout_scope(ctx):
            try:
                result = agent(payload, *args, **kwargs)
            except Exception as exc:
                error = describe_error(exc)
        return rollout_result(ctx, result, error)

    return entry


def _drained(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, or for a generator function one that runs its generator to the end and returns its last item."""
    if inspect.isasyncgenfunction(fn):

        async def drain_async(*args: Any, **kwargs: Any) -> Any:
            last = None
            async for last in fn(*args, **kwargs):
                pass
            return last

        drain_async.__name__ = drain_async.__qualname__ = getattr(fn, "__name__", "entrypoint")
        return drain_async
    if inspect.isgeneratorfunction(fn):

        def drain(*args: Any, **kwargs: Any) -> Any:
            last = None
            for last in fn(*args, **kwargs):
                pass
            return last

        drain.__name__ = drain.__qualname__ = getattr(fn, "__name__", "entrypoint")
        return drain
    return fn


def session_of(payload: Any, context: Any = None) -> str | None:
    """The user's session id: AgentCore's (``context.session_id``), else ``payload["session_id"]``."""
    sid = getattr(context, "session_id", None)
    if not sid and isinstance(payload, Mapping):
        sid = payload.get("session_id")
    return str(sid) if sid else None


def learn_online(client: OnlineClient, *, group_key: Callable[[Any], str | None] | None = None
                 ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap an AgentCore entrypoint (sync or async; not a generator) for ``mtrl online`` (module docstring).

    ``group_key(payload)``: what groups this session with similar tasks (``online.group_by: task``);
    None: the prompt, normalised. An invocation without a session id is served and not recorded.
    """

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isasyncgenfunction(fn) or inspect.isgeneratorfunction(fn):
            raise TypeError(f"learn_online: {getattr(fn, '__name__', fn)!r} is a streaming entrypoint; online "
                            "recording takes entrypoints that return their answer (use trainable for training runs)")
        training = trainable(fn)
        agent = rollout(fn)

        def opened(payload: Any, context: Any) -> Any:
            sid = session_of(payload, context)
            if sid is None or not isinstance(payload, Mapping):
                return None
            key = group_key(payload) if group_key is not None else None
            answer = client.open_session(sid, _instance(payload), key)
            return context_from_request(answer.request) if answer.sampled and answer.request else None

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_entry(payload: Any, *args: Any, **kwargs: Any) -> Any:
                if is_rollout_payload(payload):
                    return await training(payload, *args, **kwargs)
                ctx = await asyncio.to_thread(opened, payload, args[0] if args else kwargs.get("context"))
                if ctx is None:
                    return await fn(payload, *args, **kwargs)
                with rollout_scope(ctx):  # the user's answer is the entrypoint's; an error reaches the user too
                    return await agent(payload, *args, **kwargs)

            return async_entry

        @functools.wraps(fn)
        def entry(payload: Any, *args: Any, **kwargs: Any) -> Any:
            if is_rollout_payload(payload):
                return training(payload, *args, **kwargs)
            ctx = opened(payload, args[0] if args else kwargs.get("context"))
            if ctx is None:
                return fn(payload, *args, **kwargs)
            with rollout_scope(ctx):
                return agent(payload, *args, **kwargs)

        return entry

    return wrap


def _instance(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The session's task row: the payload's ``prompt`` / ``messages`` (and any other fields it carries)."""
    return {k: v for k, v in payload.items() if k != "session_id"}


__all__ = ["is_rollout_payload", "learn_online", "session_of", "trainable"]
