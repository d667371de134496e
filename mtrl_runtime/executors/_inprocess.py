"""The in-process executor: runs a decorated agent function on this process's event loop.

Each rollout runs inside ``rollout_scope(spec)``, so the ``@rollout``
decorator finds it, instruments the agent's model clients and reports the
end. An async agent runs as a task on the loop; a sync agent runs in a thread
of the executor's own pool (``max_threads``, so sync agents are not capped
by asyncio's small default pool), with the rollout context copied in.
A function that is not decorated is decorated here. With ``sandboxes`` (the
run's provider, built from ``advanced.sandbox``), each rollout runs inside
``sandboxes_scope``, where ``rollout_sandbox()`` finds it.

The executor keeps no deadline of its own: the dispatcher owns the rollout's
one deadline and cancels ``run`` when it passes, and the decorator cancels an
async agent at the spec's ``timeout_s`` (a sync one cannot be interrupted: its
thread is left to finish, and its later reports are refused once the
rollout has ended).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mtrl_adapters import is_decorated, rollout, rollout_scope

from ..sandboxes import Sandboxes, sandboxes_scope
from ..types import AgentFn, RolloutOutcome, RolloutSpec, RolloutStatus

_STATUSES = {s.value: s for s in RolloutStatus}


class InProcessExecutor:
    """Runs ``agent_fn(task)`` for each RolloutSpec, in this process (see the module docstring)."""

    def __init__(self, agent_fn: AgentFn, max_threads: int = 64, sandboxes: Sandboxes | None = None) -> None:
        if not callable(agent_fn):
            raise TypeError(f"agent_fn: expected a function taking a task, got {agent_fn!r}")
        if max_threads < 1:
            raise ValueError(f"max_threads: must be >= 1, got {max_threads}")
        self.agent_fn = agent_fn if is_decorated(agent_fn) else rollout(agent_fn)
        self._async = inspect.iscoroutinefunction(self.agent_fn)
        self.max_threads = max_threads
        self.sandboxes = sandboxes
        self._pool: ThreadPoolExecutor | None = None

    async def run(self, spec: RolloutSpec) -> RolloutOutcome:
        with rollout_scope(spec) as ctx, sandboxes_scope(self.sandboxes):
            try:
                await self._call(spec)
            except Exception as exc:  # the agent failed: the rollout is data, the run goes on
                return RolloutOutcome(spec.rollout_id, RolloutStatus.FAILED, f"{type(exc).__name__}: {exc}")
        reported = ctx.outcome
        status = _STATUSES.get(reported.status, RolloutStatus.COMPLETED) if reported is not None else RolloutStatus.COMPLETED
        return RolloutOutcome(spec.rollout_id, status, reported.error if reported is not None else None)

    def _call(self, spec: RolloutSpec) -> Any:
        if self._async:
            return self.agent_fn(spec.task)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_threads, thread_name_prefix="mtrl-agent")
        context = contextvars.copy_context()  # carries the rollout into the thread
        return asyncio.get_running_loop().run_in_executor(self._pool, context.run, self.agent_fn, spec.task)

    async def close(self) -> None:
        """Release the thread pool of sync agents (threads still running finish on their own)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


__all__ = ["InProcessExecutor"]
