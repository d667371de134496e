"""Several servers behind one engine: per-rollout affinity, adapters on every server, a dead server leaves rotation.

``EnginePool`` wraps one engine per server (``PoolMember``: a name, the
engine, a probe that says whether the server still serves) through the
``PolicyEngine`` interface only, so any engine can be pooled (the vllm
factory pools ``VLLMEngine``s; the tests pool the scripted double).

- Affinity: a request carrying ``rollout_id`` goes to the server its rollout
  is pinned to, so every turn of a rollout reaches the server that holds its
  prefix in cache. A rollout's first call is pinned to the live server with
  the fewest requests in flight (then the fewest pinned rollouts). Calls
  without a rollout id (evaluation of plain prompts) go to the least loaded.
  Pins are kept for the newest ``max_pins`` rollouts.
- Adapters: ``load_adapter`` loads the version on every live server at once
  and returns when all have it; a request naming that version waits for the
  load, so no request for a version reaches a server before every server has
  it. A server that fails the load leaves rotation (logged as a warning with
  the error, ``ServerStats.down_reason``); if every server fails, the call
  fails naming each.
- Death: when a request fails, the server's probe is asked; a server that no
  longer serves leaves rotation and the request fails with
  ``ServerDownError`` naming the server. Requests in flight on other servers
  are untouched; the rollouts pinned to the dead server are re-pinned on
  their next call (counted: ``stats.repins``, their prefix cache is lost).
  With no server left every request fails naming each server and why.
- Streaming: when the servers' engines are ``StreamingEngine``s the pool is
  one too (``StreamingEnginePool``), passing the tokens through as they come.

State is a few counters and dicts under one ``threading.Lock`` (callers come
from several threads and event loops); waits use ``concurrent.futures``
futures, which any loop can await.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, fields, replace
from typing import AsyncGenerator, AsyncIterator, Awaitable, Callable, Protocol, Sequence, runtime_checkable

from ...types import Generation, GenerationRequest, PolicyEngine, StreamingEngine, TokenDelta
from .._stats import EngineClosedError, EngineStats, ServerStats
from ._server import VLLMServerError

log = logging.getLogger(__name__)

Probe = Callable[[], Awaitable[bool]]
"""Asked after a failed request: True while the server still serves."""


class ServerDownError(VLLMServerError):
    """A server of the pool stopped serving while the request was in flight, or no server is left."""


@runtime_checkable
class Startable(Protocol):
    """An engine that can be brought up before its first request (``VLLMEngine.start``)."""

    async def start(self) -> None: ...


@runtime_checkable
class CountsStats(Protocol):
    """An engine that keeps ``EngineStats``."""

    stats: EngineStats


@dataclass(frozen=True)
class PoolMember:
    """One server of a pool: its name (in errors and stats), its URL if it has one, its engine and its probe."""

    name: str
    engine: PolicyEngine
    probe: Probe
    url: str = ""


class _Slot:
    def __init__(self, index: int, member: PoolMember) -> None:
        self.index = index
        self.member = member
        self.engine = member.engine
        self.stats = ServerStats(member.name, member.url)

    def label(self) -> str:
        return f"{self.member.name} ({self.member.url})" if self.member.url else self.member.name


class EnginePool:
    """One engine over several servers (see the module docstring)."""

    def __init__(self, members: Sequence[PoolMember], *, max_pins: int = 100_000) -> None:
        if not members:
            raise ValueError("members: a pool needs at least one server")
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ValueError(f"members: server names must differ, got {names}")
        if max_pins < 1:
            raise ValueError(f"max_pins: must be >= 1, got {max_pins}")
        self.name = members[0].engine.name
        self.tokenizer = members[0].engine.tokenizer
        self.policy_version = max(int(m.engine.policy_version) for m in members)
        self.max_pins = max_pins
        self._slots = [_Slot(i, m) for i, m in enumerate(members)]
        self._pins: OrderedDict[str, _Slot] = OrderedDict()  # rollout id -> its server, oldest first
        self._lock = threading.Lock()
        self._loading: dict[int, concurrent.futures.Future] = {}  # version -> done when every server has it
        self._loaded: set[int] = set()
        self._started: concurrent.futures.Future | None = None
        self._repins = 0
        self._closed = False

    # ------------------------------------------------------------------ PolicyEngine
    @property
    def context_length(self) -> int | None:
        """The smallest context of the servers that report one (None until one does)."""
        known = [s.engine.context_length for s in self._slots if s.engine.context_length is not None]
        return min(known) if known else None

    @property
    def members(self) -> list[PoolMember]:
        return [s.member for s in self._slots]

    @property
    def stats(self) -> EngineStats:
        """The servers' counters summed, with one ``ServerStats`` per server and the re-pins."""
        total = EngineStats()
        for slot in self._slots:
            if not isinstance(slot.engine, CountsStats):
                continue
            for f in fields(EngineStats):
                if f.name in ("servers", "repins"):
                    continue
                mine, theirs = getattr(total, f.name), getattr(slot.engine.stats, f.name)
                setattr(total, f.name, max(mine, theirs) if f.name == "max_rows" else mine + theirs)
        with self._lock:
            total.repins = self._repins
            total.servers = [replace(s.stats) for s in self._slots]
        return total

    async def start(self) -> None:
        """Bring every server up (those that can be started); a server that fails to start fails the call."""
        started = self._started
        if started is not None and started.done():
            started.result()  # raises the start's error
            return
        with self._lock:
            first = self._started is None
            if first:
                self._started = concurrent.futures.Future()
            started = self._started
        assert started is not None
        if not first:
            await asyncio.shield(asyncio.wrap_future(started))
            return
        slots = [s for s in self._slots if isinstance(s.engine, Startable)]
        results = await asyncio.gather(*(s.engine.start() for s in slots), return_exceptions=True)
        failed = [(s, r) for s, r in zip(slots, results) if isinstance(r, BaseException)]
        if failed:
            error = ServerDownError("; ".join(f"server {s.label()} did not start: {type(r).__name__}: {r}"
                                              for s, r in failed))
            started.set_exception(error)
            raise error
        started.set_result(None)

    async def generate(self, request: GenerationRequest) -> Generation:
        slot = await self._acquire(request)
        try:
            return await slot.engine.generate(request)
        except Exception as exc:
            raise await self._failed(slot, exc) from exc
        finally:
            self._release(slot)

    async def load_adapter(self, path: str, version: int) -> None:
        """Load ``version`` on every live server; return when all have it (a server that fails leaves rotation)."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ValueError(f"version: expected an int >= 0, got {version!r}")
        self._check_open()
        await self.start()
        done: concurrent.futures.Future = concurrent.futures.Future()
        with self._lock:
            if version in self._loaded or version in self._loading:
                raise ValueError(f"version: {version} is already loaded; each adapter version is loaded once")
            self._loading[version] = done
            targets = [s for s in self._slots if s.stats.live]
        try:
            if not targets:
                raise self._none_left()
            results = await asyncio.gather(*(s.engine.load_adapter(path, version) for s in targets),
                                           return_exceptions=True)
            failed = [(s, r) for s, r in zip(targets, results) if isinstance(r, BaseException)]
            if len(failed) == len(targets):
                raise ServerDownError(
                    f"loading adapter {path!r} as version {version} failed on every server: "
                    + "; ".join(f"{s.label()}: {type(r).__name__}: {r}" for s, r in failed)
                ) from failed[0][1]
            for slot, error in failed:
                self._take_out(slot, f"loading adapter {path!r} as version {version} failed: "
                                     f"{type(error).__name__}: {error}")
            with self._lock:
                self._loaded.add(version)
                self.policy_version = version
        finally:
            with self._lock:
                del self._loading[version]
            done.set_result(None)

    async def close(self) -> None:
        """Close every server's engine (an owned server stops; one given by URL keeps running)."""
        self._closed = True
        results = await asyncio.gather(*(s.engine.close() for s in self._slots), return_exceptions=True)
        for slot, result in zip(self._slots, results):
            if isinstance(result, BaseException):
                log.warning("closing server %s failed: %s: %s", slot.label(), type(result).__name__, result)

    def pinned_server(self, rollout_id: str) -> str | None:
        """The name of the server ``rollout_id`` is pinned to (None: not pinned)."""
        with self._lock:
            slot = self._pins.get(rollout_id)
            return slot.member.name if slot is not None else None

    # ------------------------------------------------------------------ routing
    async def _acquire(self, request: GenerationRequest) -> _Slot:
        """Wait until the request may go out, then pick its server and count it in flight there."""
        self._check_open()
        await self.start()
        if request.adapter is not None:
            with self._lock:
                loading = self._loading.get(request.adapter)
            if loading is not None:  # the version is being loaded: wait until every server has it
                await asyncio.shield(asyncio.wrap_future(loading))
        self._check_open()
        with self._lock:
            slot = self._pick(request.rollout_id)
            slot.stats.in_flight += 1
            slot.stats.requests += 1
            return slot

    def _pick(self, rollout_id: str | None) -> _Slot:
        live = [s for s in self._slots if s.stats.live]
        if not live:
            raise self._none_left()
        moved = False
        if rollout_id is not None:
            pinned = self._pins.get(rollout_id)
            if pinned is not None and pinned.stats.live:
                self._pins.move_to_end(rollout_id)
                return pinned
            if pinned is not None:  # its server left rotation: re-pin, its prefix cache is lost
                del self._pins[rollout_id]
                pinned.stats.pinned -= 1
                moved = True
        slot = min(live, key=lambda s: (s.stats.in_flight, s.stats.pinned, s.index))
        if rollout_id is not None:
            self._pins[rollout_id] = slot
            slot.stats.pinned += 1
            if moved:
                slot.stats.repins += 1
                self._repins += 1
            while len(self._pins) > self.max_pins:
                _, old = self._pins.popitem(last=False)
                old.stats.pinned -= 1
        return slot

    def _release(self, slot: _Slot) -> None:
        with self._lock:
            slot.stats.in_flight -= 1

    async def _failed(self, slot: _Slot, error: Exception) -> Exception:
        """The error for a request that failed on ``slot``: ``error``, or, if the server stopped serving, that."""
        with self._lock:
            slot.stats.failures += 1
        if self._closed or isinstance(error, (ValueError, TypeError)):  # closed, or bad input: not the server
            return error
        try:
            serving = await slot.member.probe()
        except Exception as probe_error:  # noqa: BLE001 - a probe that cannot tell counts as down
            log.warning("probing server %s failed: %s: %s", slot.label(), type(probe_error).__name__, probe_error)
            serving = False
        if serving:
            return error
        reason = f"it stopped serving: {type(error).__name__}: {error}"
        self._take_out(slot, reason)
        return ServerDownError(f"server {slot.label()} stopped serving while this turn was in flight "
                               f"({type(error).__name__}: {error}); the rollouts pinned to it move to the other "
                               f"servers on their next call")

    def _take_out(self, slot: _Slot, reason: str) -> None:
        with self._lock:
            if not slot.stats.live:
                return
            slot.stats.live = False
            slot.stats.down_reason = reason
            left = [s.label() for s in self._slots if s.stats.live]
        log.warning("server %s left rotation: %s; %d server(s) left: %s", slot.label(), reason, len(left),
                    ", ".join(left) or "none")

    def _none_left(self) -> ServerDownError:
        return ServerDownError("no server is left in rotation: " + "; ".join(
            f"{s.label()}: {s.stats.down_reason}" for s in self._slots))

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError(f"the {self.name} engine pool is closed")


class StreamingEnginePool(EnginePool):
    """A pool of ``StreamingEngine``s: ``generate_stream`` passes each server's tokens through as they come."""

    async def generate_stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | Generation]:
        slot = await self._acquire(request)
        try:
            engine = slot.engine
            assert isinstance(engine, StreamingEngine)
            stream: AsyncGenerator = engine.generate_stream(request)  # type: ignore[assignment]
            async with contextlib.aclosing(stream):  # closing this stream early stops the server's generation
                async for item in stream:
                    yield item
        except Exception as exc:
            raise await self._failed(slot, exc) from exc
        finally:
            self._release(slot)


def make_pool(members: Sequence[PoolMember], *, max_pins: int = 100_000) -> EnginePool:
    """A ``StreamingEnginePool`` when every server's engine streams, else an ``EnginePool``."""
    streaming = all(isinstance(m.engine, StreamingEngine) for m in members)
    return (StreamingEnginePool if streaming else EnginePool)(members, max_pins=max_pins)


__all__ = ["CountsStats", "EnginePool", "PoolMember", "Probe", "ServerDownError", "Startable",
           "StreamingEnginePool", "make_pool"]
