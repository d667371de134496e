"""The parts that run rollouts outside training: engine, store, coordinator on loopback, executor.

Evaluation and the checks run the agent exactly as training does (the same
endpoint, adapters and dispatcher), so what they measure is what training
will see. During training the trainer's own parts are reused
(``RolloutStack.from_dispatcher``); standalone, ``open_stack`` builds them
and closes them in reverse order.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from ..config import MtrlConfig
from ..types import RolloutExecutor


@dataclass
class RolloutStack:
    """A coordinator served on ``endpoint``, an executor that runs the agent, and the run's config."""

    coordinator: Any
    executor: RolloutExecutor
    config: MtrlConfig
    endpoint: str
    server_loop: asyncio.AbstractEventLoop | None = None
    _closers: list[Callable[[], Any]] = field(default_factory=list, repr=False)

    @property
    def engine(self) -> Any:
        return self.coordinator.engine

    @property
    def store(self) -> Any:
        return self.coordinator.store

    @classmethod
    def from_dispatcher(cls, dispatcher: Any) -> "RolloutStack":
        """The trainer's parts, borrowed (closing this stack closes nothing)."""
        return cls(dispatcher.coordinator, dispatcher.executor, dispatcher.config, dispatcher.endpoint,
                   dispatcher.server_loop)

    async def close(self) -> None:
        while self._closers:
            result = self._closers.pop()()
            if asyncio.iscoroutine(result):
                await result


def executor_for(agent_env: Any, max_concurrency: int) -> RolloutExecutor:
    """A RolloutExecutor from a ``@rollout`` function, an agent server URL, or an executor."""
    from ..training._trainer import _executor  # the trainer's rule, so both accept the same agent_env

    return _executor(agent_env, max_concurrency)


@asynccontextmanager
async def open_stack(
    config: MtrlConfig,
    agent_env: Any,
    store_path: str | Path,
    engine: Any = None,
) -> AsyncIterator[RolloutStack]:
    """Build engine (unless given), store, coordinator, loopback server and executor; close on exit."""
    from ..coordinator import Coordinator
    from ..server import create_app, start_server
    from ..store import TrajectoryStore

    closers: list[Callable[[], Any]] = []
    stack: RolloutStack | None = None
    try:
        if engine is None:
            from ..engines import create_engine

            engine = await asyncio.to_thread(
                create_engine, config.core.engine, config.core.model, **config.advanced.engine_options
            )
            closers.append(engine.close)
        Path(store_path).parent.mkdir(parents=True, exist_ok=True)
        store = TrajectoryStore(store_path)
        closers.append(store.close)
        coordinator = Coordinator(engine, store, config)
        server_cfg = config.advanced.server
        server = await asyncio.to_thread(
            start_server, create_app(coordinator), server_cfg.host, server_cfg.port, server_cfg.api_key
        )
        closers.append(lambda: asyncio.to_thread(server.stop))
        executor = executor_for(agent_env, config.advanced.max_concurrency)
        closers.append(executor.close)
        stack = RolloutStack(coordinator, executor, config, server.url, server.loop, closers)
        yield stack
    finally:
        if stack is not None:
            await stack.close()
        else:
            await RolloutStack(None, None, config, "", None, closers).close()  # type: ignore[arg-type]


__all__ = ["RolloutStack", "executor_for", "open_stack"]
