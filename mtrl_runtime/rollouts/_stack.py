"""The one composition that runs rollouts: engine, store, coordinator, loopback server and executor.

Training, evaluation, the checks and ``mtrl serve`` all build their parts
here, so an agent is run the same way (the same endpoint, adapters and
dispatcher) wherever it is measured::

    stack = RolloutStack.build(config, store_path=config.run_folder.store, agent_env=my_agent)
    try:
        batch = await stack.dispatcher().collect(0, tasks)
    finally:
        await stack.close()

``open_stack`` is the same as an async context manager. A part given by the
caller (an engine) is borrowed: closing the stack closes only what it built.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from ..config import MtrlConfig
from ..coordinator import Coordinator
from ..engines import create_engine
from ..sandboxes import Sandboxes
from ..server import ServerHandle, create_app, start_server
from ..store import open_store
from ..torch_support import on_own_thread
from ..types import GroupRescorer, PolicyEngine, RolloutExecutor, RunStopped, TrajectoryStore
from ._dispatcher import Dispatcher, on_loop
from ._executors import executor_for

_log = logging.getLogger("mtrl.train")


@dataclass
class RolloutStack:
    """A coordinator over an engine and a store, served on ``endpoint``, and the executor that runs the agent."""

    config: MtrlConfig
    engine: PolicyEngine
    store: TrajectoryStore
    coordinator: Coordinator
    executor: RolloutExecutor | None = None
    server: ServerHandle | None = None
    _closers: list[Callable[[], Any]] = field(default_factory=list, repr=False)

    @classmethod
    def build(
        cls,
        config: MtrlConfig,
        *,
        store_path: str | Path,
        engine: PolicyEngine | None = None,
        agent_env: Any = None,
        serve: bool = True,
    ) -> "RolloutStack":
        """Build the parts in order (blocking: loads the model unless ``engine`` is given).

        ``serve``: start the coordinator on ``advanced.server`` in a background
        thread (False: the caller serves ``create_app(stack.coordinator)`` itself).
        ``agent_env``: a ``@rollout`` function, an AgentCore Runtime ARN, an agent server URL or an executor.
        On failure, what was built is closed again.
        """
        closers: list[Callable[[], Any]] = []
        try:
            if engine is None:
                engine = create_engine(config.core.engine, config.core.model, **config.advanced.engine_options)
                closers.append(engine.close)
            store = store_for(config, store_path)
            closers.append(store.close)
            coordinator = Coordinator(engine, store, config)
            server = None
            if serve:
                server_cfg = config.advanced.server
                server = start_server(create_app(coordinator), server_cfg.host, server_cfg.port, server_cfg.api_key)
                closers.append(server.stop)
            executor = None
            if agent_env is not None:
                sandboxes = Sandboxes(config.advanced.sandbox)  # prepared at the first rollout that opens one
                closers.append(sandboxes.close)
                executor = executor_for(agent_env, config.advanced.max_concurrency, sandboxes, config.advanced.agentcore)
                closers.append(executor.close)
        except BaseException:
            _close_now(closers)
            raise
        return cls(config, engine, store, coordinator, executor, server, closers)

    @property
    def endpoint(self) -> str:
        if self.server is None:
            raise RuntimeError("this stack serves no endpoint (built with serve=False)")
        return self.server.url

    @property
    def server_loop(self) -> asyncio.AbstractEventLoop | None:
        return self.server.loop if self.server is not None else None

    def dispatcher(
        self,
        config: MtrlConfig | None = None,
        executor: RolloutExecutor | None = None,
        group_scorer: GroupRescorer | None = None,
    ) -> Dispatcher:
        """A dispatcher over this stack's coordinator (``config`` and ``executor`` override the stack's).

        ``group_scorer``: rewards each training step's finished group anew (a group judge).
        """
        runner = executor if executor is not None else self.executor
        if runner is None:
            raise RuntimeError("this stack has no executor: build it with agent_env")
        return Dispatcher(self.coordinator, runner, config or self.config, self.endpoint, self.server_loop,
                          group_scorer)

    async def stop_live_rollouts(self) -> int:
        """End every rollout still live with ``RunStopped`` (stored ``interrupted``), on the server's loop.

        Called before the server stops, so a rollout whose dispatcher was torn
        down before it could say so still ends as interrupted rather than
        failing later on a closed connection; then waits for the ends decided
        before (their writes run on) to reach the store. Returns how many it ended.
        """
        ended = 0
        for rollout_id in self.coordinator.live_rollout_ids():
            ended += await on_loop(self.server_loop, self.coordinator.end(rollout_id, RunStopped()))
        unwritten = await on_loop(self.server_loop, self.coordinator.settle_ends())  # ends decided earlier
        if unwritten:  # their model call in flight never returned: said, not left silently `running`
            _log.warning("%d rollout end(s) could not be written before the server stopped; still 'running' in "
                         "the store: %s", len(unwritten), ", ".join(unwritten))
        return ended

    async def close(self) -> None:
        """End live rollouts (``stop_live_rollouts``), then close what this stack built, in reverse order."""
        if self.server is not None and self.server_loop is not None:
            await self.stop_live_rollouts()
        while self._closers:
            closer = self._closers.pop()
            if asyncio.iscoroutinefunction(closer):
                await closer()
            else:
                result = await asyncio.to_thread(closer)
                if asyncio.iscoroutine(result):
                    await result


def store_for(config: MtrlConfig, path: str | Path | None = None) -> TrajectoryStore:
    """The store a run records into: backend ``core.store`` at ``path`` (default the run folder's store), its
    folder made."""
    path = Path(path) if path is not None else config.run_folder.store
    path.parent.mkdir(parents=True, exist_ok=True)
    return open_store(path, config.core.store)


def _close_now(closers: list[Callable[[], Any]]) -> None:
    """Close what was built so far, from a thread with no running loop (a failed ``build``)."""
    while closers:
        result = closers.pop()()
        if asyncio.iscoroutine(result):
            asyncio.run(result)


@asynccontextmanager
async def open_stack(
    config: MtrlConfig,
    agent_env: Any,
    store_path: str | Path,
    engine: PolicyEngine | None = None,
) -> AsyncIterator[RolloutStack]:
    """``RolloutStack.build`` (on a thread) as an async context manager; closed on exit."""
    stack = await on_own_thread(  # it may load a model: torch_support says why on a thread of its own
        lambda: RolloutStack.build(config, store_path=store_path, engine=engine, agent_env=agent_env)
    )
    try:
        yield stack
    finally:
        await stack.close()


__all__ = ["RolloutStack", "open_stack", "store_for"]
