"""The run's ``Sandboxes`` as the agent reaches it, and a rollout's own sandbox.

The in-process executor runs each rollout inside ``sandboxes_scope(provider)``
(the provider the run built from ``advanced.sandbox``), so an agent
function, which is called with its task alone, finds it:

    @rollout
    async def run(task):
        async with rollout_sandbox() as box:     # named after the rollout, killed at its deadline
            result = await box.run("python3 -m unittest")

Outside a run, pass one: ``rollout_sandbox(sandboxes=Sandboxes({...}))``.
"""

from __future__ import annotations

from contextlib import asynccontextmanager, contextmanager
from contextvars import ContextVar
from typing import AsyncIterator, Iterator

from mtrl_adapters import current_rollout

from ._base import BaseSandbox
from ._provider import Sandboxes

_CURRENT: ContextVar[Sandboxes | None] = ContextVar("mtrl_sandboxes", default=None)


@contextmanager
def sandboxes_scope(provider: Sandboxes | None) -> Iterator[Sandboxes | None]:
    """Make ``provider`` the current run's sandboxes inside the block (None: leave it as it is)."""
    if provider is None:
        yield current_sandboxes()
        return
    token = _CURRENT.set(provider)
    try:
        yield provider
    finally:
        _CURRENT.reset(token)


def current_sandboxes() -> Sandboxes | None:
    """The sandboxes of the run this code runs in, or None outside one."""
    return _CURRENT.get()


@asynccontextmanager
async def rollout_sandbox(*, coordinator: bool = False, sandboxes: Sandboxes | None = None,
                          name: str | None = None) -> AsyncIterator[BaseSandbox]:
    """A sandbox for the current rollout, closed on exit (also when the rollout is cancelled at its deadline).

    Named after the rollout and killed at its deadline (``timeout_s`` of the
    rollout). ``coordinator``: code inside may reach the coordinator (a
    harness CLI making the rollout's model calls) at ``box.coordinator_url``;
    without it the sandbox has no network at all.
    """
    provider = sandboxes or current_sandboxes()
    if provider is None:
        raise RuntimeError("rollout_sandbox: no sandboxes in scope; run the agent under mtrl (advanced.sandbox "
                           "picks the kind) or pass sandboxes=Sandboxes({...})")
    ctx = current_rollout()
    if ctx is None and name is None:
        raise RuntimeError("rollout_sandbox: no rollout in scope; call it inside a @rollout agent or pass name=")
    label = name or (ctx.rollout_id if ctx is not None else "sandbox")
    endpoint = ctx.endpoint if coordinator and ctx is not None else None
    if coordinator and endpoint is None:
        raise RuntimeError("rollout_sandbox(coordinator=True): no rollout in scope to take the coordinator from")
    timeout_s = ctx.timeout_s if ctx is not None else None
    async with provider.sandbox(label, coordinator=endpoint, timeout_s=timeout_s) as box:
        yield box


__all__ = ["current_sandboxes", "rollout_sandbox", "sandboxes_scope"]
