"""Per-episode sandboxes for stateful tools, torn down exactly once however the episode ends.

A ``Sandbox`` is opened when a rollout starts: it owns a fresh temporary
folder, a ``state`` dict, and every resource its tools register with a
cleanup. Leaving its ``with`` / ``async with`` block tears it all down in
``finally``: after a terminal action, after max_turns, or when the agent
crashes. Teardown runs once even if ``close`` is called again, runs every
cleanup even when one fails (newest first, then the folder), and records why
the episode ended.

``SandboxPool`` keys sandboxes by rollout id so concurrent rollouts never share
one, and counts teardowns so tests and checks can assert nothing leaked.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import shutil
import tempfile
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Iterator

Cleanup = Callable[[Any], Any]  # called with the resource; may return an awaitable under aclose()


class SandboxError(RuntimeError):
    """A sandbox was used before it was opened or after it was torn down."""


class SandboxTeardownError(RuntimeError):
    """One or more cleanups failed; every other cleanup still ran."""

    def __init__(self, rollout_id: str, errors: list[str]) -> None:
        super().__init__(f"sandbox {rollout_id!r}: {len(errors)} cleanup(s) failed: " + "; ".join(errors))
        self.errors = errors


class Sandbox:
    """The state of one episode: ``workdir``, ``state`` and registered resources."""

    def __init__(self, rollout_id: str, *, root: str | Path | None = None) -> None:
        if not rollout_id:
            raise ValueError("rollout_id must be a non-empty string")
        self.rollout_id = rollout_id
        self.state: dict[str, Any] = {}
        self.end_reason: str | None = None  # "completed", "terminal: ...", "max_turns", "crash: ..."
        self.teardowns = 0  # 0 before close, 1 after; never more
        self.teardown_errors: list[str] = []
        self._root = root
        self._workdir: Path | None = None
        self._resources: list[tuple[Any, Cleanup | None]] = []
        self._closed = False
        self._on_teardown: list[Callable[["Sandbox"], None]] = []

    # -- life cycle ---------------------------------------------------------------------------

    def open(self) -> "Sandbox":
        """Allocate the episode's folder; called by ``with`` or by a pool."""
        if self._closed:
            raise SandboxError(f"sandbox {self.rollout_id!r} was torn down ({self.end_reason}); open a new one")
        if self._workdir is None:
            prefix = "mtrl-sandbox-" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.rollout_id)[:40] + "-"
            self._workdir = Path(tempfile.mkdtemp(prefix=prefix, dir=self._root))
        return self

    def end(self, reason: str) -> None:
        """Record why the episode ended (a terminal action, max_turns); the first reason wins."""
        if self.end_reason is None:
            self.end_reason = reason

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def workdir(self) -> Path:
        if self._workdir is None or self._closed:
            raise SandboxError(f"sandbox {self.rollout_id!r} has no folder: {'torn down' if self._closed else 'not opened'}")
        return self._workdir

    def register(self, resource: Any, cleanup: Cleanup | None = None) -> Any:
        """Track something the agent created; ``cleanup(resource)`` runs at teardown. Returns ``resource``."""
        if self._closed:
            raise SandboxError(f"sandbox {self.rollout_id!r} was torn down ({self.end_reason}); cannot register")
        if cleanup is None and not hasattr(resource, "close"):
            raise ValueError(f"register: {type(resource).__name__} has no close(); pass cleanup=")
        self._resources.append((resource, cleanup))
        return resource

    def close(self, reason: str = "completed") -> None:
        """Tear down synchronously; a cleanup that returns an awaitable is an error (use ``aclose``)."""
        if not self._begin_close(reason):
            return
        for resource, cleanup in reversed(self._resources):
            self._run(resource, cleanup, allow_async=False)
        self._finish_close()

    async def aclose(self, reason: str = "completed") -> None:
        """Tear down, awaiting async cleanups."""
        if not self._begin_close(reason):
            return
        for resource, cleanup in reversed(self._resources):
            result = self._run(resource, cleanup, allow_async=True)
            if inspect.isawaitable(result):
                try:
                    await result
                except Exception as exc:  # noqa: BLE001 - a failed cleanup must not stop the others
                    self.teardown_errors.append(_describe(resource, exc))
        self._finish_close()

    # -- context managers ---------------------------------------------------------------------

    def __enter__(self) -> "Sandbox":
        return self.open()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.close(_reason(exc))
        self._raise_teardown_errors(crashed=exc is not None)

    async def __aenter__(self) -> "Sandbox":
        return self.open()

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        await self.aclose(_reason(exc))
        self._raise_teardown_errors(crashed=exc is not None)

    # -- internals ----------------------------------------------------------------------------

    def _begin_close(self, reason: str) -> bool:
        if self._closed:
            return False
        self._closed = True  # set before any cleanup runs: a re-entrant close is a no-op
        self.end(reason)
        return True

    def _run(self, resource: Any, cleanup: Cleanup | None, *, allow_async: bool) -> Any:
        try:
            result = cleanup(resource) if cleanup is not None else resource.close()
        except Exception as exc:  # noqa: BLE001 - a failed cleanup must not stop the others
            self.teardown_errors.append(_describe(resource, exc))
            return None
        if inspect.isawaitable(result) and not allow_async:
            if inspect.iscoroutine(result):
                result.close()  # never awaited: close it so Python does not warn
            self.teardown_errors.append(f"{type(resource).__name__}: async cleanup needs 'async with' or aclose()")
            return None
        return result

    def _finish_close(self) -> None:
        self._resources.clear()
        if self._workdir is not None:
            try:
                shutil.rmtree(self._workdir)
            except OSError as exc:
                self.teardown_errors.append(f"workdir {self._workdir}: {exc}")
        self.teardowns += 1
        for hook in self._on_teardown:
            hook(self)

    def _raise_teardown_errors(self, *, crashed: bool) -> None:
        # After a crash the agent's exception is the one to see; the cleanup errors stay on the sandbox.
        if self.teardown_errors and not crashed:
            raise SandboxTeardownError(self.rollout_id, self.teardown_errors)


class SandboxPool:
    """Sandboxes by rollout id: one per live rollout, torn down and forgotten when it ends."""

    def __init__(self, *, root: str | Path | None = None, setup: Callable[[Sandbox], None] | None = None) -> None:
        self._root = root
        self._setup = setup  # fills a fresh sandbox (seed files, initial state) before the agent runs
        self._live: dict[str, Sandbox] = {}
        self.opened = 0
        self.teardowns = 0

    @property
    def active(self) -> list[str]:
        return sorted(self._live)

    def get(self, rollout_id: str) -> Sandbox:
        """The live sandbox of a rollout (what a tool calls to find its episode's state)."""
        try:
            return self._live[rollout_id]
        except KeyError:
            raise SandboxError(f"no live sandbox for rollout {rollout_id!r}; live: {self.active}") from None

    def open(self, rollout_id: str) -> Sandbox:
        if rollout_id in self._live:
            raise SandboxError(f"rollout {rollout_id!r} already has a live sandbox")
        sandbox = Sandbox(rollout_id, root=self._root).open()
        sandbox._on_teardown.append(self._forget)
        self._live[rollout_id] = sandbox
        self.opened += 1
        if self._setup is not None:
            try:
                self._setup(sandbox)
            except BaseException:
                sandbox.close("crash: setup failed")
                raise
        return sandbox

    @contextmanager
    def session(self, rollout_id: str) -> Iterator[Sandbox]:
        """``with pool.session(rollout_id) as sandbox:`` — opened here, torn down on any exit."""
        with self.open(rollout_id) as sandbox:
            yield sandbox

    @asynccontextmanager
    async def asession(self, rollout_id: str) -> AsyncIterator[Sandbox]:
        async with self.open(rollout_id) as sandbox:
            yield sandbox

    async def aclose_all(self, reason: str = "shutdown") -> None:
        """Tear down every live sandbox (the coordinator shutting down mid-step)."""
        for rollout_id in self.active:
            await self._live[rollout_id].aclose(reason)

    def _forget(self, sandbox: Sandbox) -> None:
        self._live.pop(sandbox.rollout_id, None)
        self.teardowns += 1


def _reason(exc: BaseException | None) -> str:
    if exc is None:
        return "completed"
    if isinstance(exc, asyncio.CancelledError):
        return "cancelled"  # the rollout's timeout or the coordinator stopping it
    return f"crash: {type(exc).__name__}: {exc}"


def _describe(resource: Any, exc: BaseException) -> str:
    return f"{type(resource).__name__}: {type(exc).__name__}: {exc}"
