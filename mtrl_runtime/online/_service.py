"""``OnlineService``: serve users with the promoted adapter, record a share of sessions, learn from their feedback.

The composition ``mtrl online`` runs, in one process:

- the serving stack (``rollouts.RolloutStack``: engine, store, coordinator)
  behind one loopback-or-public server, in inference mode: every user call is
  answered with the adapter promoted last, whether its session is recorded or not;
- the session book (``_book``), persisted in the store;
- the learner (``_learner``), a policy of its own on a thread of its own;
- the gate (``_gates``), on a stack of its own.

A background task on an event loop of its own (thread ``mtrl-online-learner``;
the server's loop only answers requests) ticks every ``online.tick_s``:
it drops expired sessions, takes up to ``groups_per_step`` full groups of
rewarded sessions whose rollouts have ended, drops the stale ones (tokens
more than ``max_staleness`` versions from the learner's), and trains one
step on the learner's thread; the gate's rollouts run on that loop too.
Every ``steps_per_candidate`` steps the learner's weights become a
candidate; the gate measures it against the serving adapter and the engine
loads it only when it passes. ``rollback`` serves the adapter promoted
before the current one again. The promoted adapters (``online/adapters``),
the serving version (``online/serving``) and the step count are meta keys
of the store: a restart serves what was served and loses no session.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from mtrl_adapters.online import Feedback, FeedbackTaken, OpenSession, SessionOpened
from mtrl_adapters.wire import trajectory_id

from ..config import MtrlConfig
from ..errors import BadRequest, Conflict
from ..evaluation import StrictScorer
from ..rollouts import GroupResult, RolloutStack, load_tasks
from ..server import ServerHandle, create_app, start_server
from ..task_sources import task_from_row
from ..types import Rollout, RolloutStatus
from ._book import SessionBook, task_key
from ._gates import GateRunner
from ._learner import Learner, rollout_staleness
from ._routes import build_online_router
from ._settings import OnlineSettings

_log = logging.getLogger("mtrl_runtime.online")

ADAPTERS_KEY = "online/adapters"
SERVING_KEY = "online/serving"
STEP_KEY = "online/step"
ONLINE_GROUP = "online"  # the group id every recorded session's rollout is created with
SERVE_ROLLOUT_TTL_S = 3600.0  # a recorded session idle this long is abandoned (advanced.server.rollout_ttl_s)


class OnlineService:
    """See the module docstring. Build it with ``start``; ``close`` stops it."""

    def __init__(self, config: MtrlConfig, settings: OnlineSettings, stack: RolloutStack, book: SessionBook,
                 learner: Learner | None, gates: GateRunner | None, clock: Callable[[], float]) -> None:
        self.config = config
        self.settings = settings
        self.stack = stack
        self.book = book
        self.learner = learner
        self.gates = gates
        self.clock = clock
        self.server: ServerHandle | None = None
        store = stack.store
        self.history: list[dict[str, Any]] = list(store.get_meta(ADAPTERS_KEY, []) or [])
        self.step = int(store.get_meta(STEP_KEY, 0) or 0)
        self.last_gate: dict[str, Any] | None = None
        self.steps_since_candidate = 0
        self.trained_since_promotion: list[Rollout] = []
        self._lock: asyncio.Lock | None = None
        self._ticker: asyncio.Task | None = None
        # the learner's loop: ticks, gates, promotions and rollbacks run here, never on the server's loop
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mtrl-online-learner", daemon=True)
        self._thread.start()

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    def start(cls, config: MtrlConfig, settings: OnlineSettings, *, agent_env: Any = None,
              strict: StrictScorer | None = None, engine: Any = None, learn: bool = True,
              clock: Callable[[], float] = time.time, tick: bool = True) -> "OnlineService":
        """Build everything, serve on ``advanced.server`` (port 0: a free one), restore what was served.

        ``learn`` False: sessions and feedback are recorded, nothing is trained (an engine without weights to
        train, such as ``scripted``). ``tick`` False: the caller drives ``tick()`` (tests).
        """
        server_cfg = config.advanced.server
        config = config.with_overrides({
            "advanced.server.inference_mode": True,
            "advanced.server.rollout_ttl_s": server_cfg.rollout_ttl_s or SERVE_ROLLOUT_TTL_S,
        })
        stack = RolloutStack.build(config, store_path=config.run_folder.store, engine=engine, serve=False)
        learner = gates = service = None
        try:
            book = SessionBook(stack.store, settings)
            if learn:
                learner = Learner.build(config, config.run_folder.online / "adapters", settings.max_staleness)
            if settings.holdout is not None:
                gates = _gate_runner(config, settings, agent_env, strict)
            service = cls(config, settings, stack, book, learner, gates, clock)
            app = create_app(stack.coordinator)
            app.include_router(build_online_router(service, server_cfg.api_key))
            service.server = start_server(app, server_cfg.host, server_cfg.port, server_cfg.api_key)
            service.call(service._begin(tick))
        except BaseException:
            if service is not None:
                service._stop_loop()
            _close_parts(stack, learner, gates, service.server if service is not None else None)
            raise
        return service

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    def call(self, coro: Any, timeout: float | None = None) -> Any:
        """Run ``coro`` on the learner's loop from another thread and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    async def _on_learner_loop(self, coro: Any) -> Any:
        if asyncio.get_running_loop() is self._loop:
            return await coro
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def _begin(self, tick: bool) -> None:
        self._lock = asyncio.Lock()
        if self.history:  # a restart: serve what was served, and learn on from it
            current = self.history[-1]
            await self.stack.engine.load_adapter(current["folder"], current["version"])
            if self.learner is not None:
                await self.learner.restore(Path(current["folder"]), current["version"])
        elif self.learner is not None:  # the untrained LoRA (the base model's answers) is version 0's adapter
            folder = await self.learner.save()
            await self._promote(folder, self.learner.version, {"reason": "initial"})
        if tick:
            self._ticker = asyncio.create_task(self._tick_forever())

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.tick_s)
            try:
                await self.tick()
            except Exception:  # a failed tick is logged; the next one tries again, users keep being served
                _log.exception("mtrl online: a tick failed")

    def close(self) -> None:
        """Stop ticking (after the step in flight), stop serving, close the stacks and the learner."""
        self.call(self._stop_ticker())
        self._stop_loop()
        _close_parts(self.stack, self.learner, self.gates, self.server)

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(60)
        self._loop.close()

    async def _stop_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)

    # -- sessions and feedback (from the server's request threads) ---------------------------------

    def open_session(self, body: OpenSession, endpoint: str) -> SessionOpened:
        """Draw the session; a drawn one becomes a rollout, answered as the request to run its turn in."""
        sid = body.session_id
        if not self.book.draws(sid):
            self.book.count_not_sampled()
            return SessionOpened(session_id=sid, sampled=False)
        if self.book.get(sid) is not None:
            raise Conflict(f"session_id {sid!r}: already recorded; each session id opens once", param="session_id")
        task = replace(task_from_row(body.instance), id=f"online-{sid}", split="online")
        prompt = task.prompt if task.prompt is not None else json.dumps(task.messages, sort_keys=True)
        handle = self.stack.coordinator.create_rollout(task, ONLINE_GROUP)
        self.book.open(sid, handle.rollout_id, task_key(prompt or "", body.group_key), self.clock())
        request = {"instance": dict(body.instance), "metadata": {
            "trajectory_id": trajectory_id(handle.rollout_id, handle.token), "rollout_id": handle.rollout_id,
            "endpoint": endpoint, "rollout_token": handle.token, "group_id": handle.group_id,
            "session_id": sid}}
        return SessionOpened(session_id=sid, sampled=True, request=request)

    def feedback(self, body: Feedback) -> FeedbackTaken:
        """``update_reward`` by session id (see ``SessionBook.feedback`` for the errors)."""
        low, high = self.config.advanced.reward_range
        if not low <= body.reward <= high:
            raise BadRequest(f"reward: {body.reward!r} is outside advanced.reward_range [{low}, {high}]",
                             param="reward")
        session = self.book.feedback(body.session_id, body.reward, body.group_key, self.clock())
        if session is None:
            return FeedbackTaken(session_id=body.session_id, recorded=False)
        return FeedbackTaken(session_id=body.session_id, recorded=True, state=session.state)

    def status(self) -> dict[str, Any]:
        serving = self.history[-1] if self.history else None
        return {"serving_version": serving["version"] if serving else None, "adapters": self.history,
                "step": self.step, "learner_version": self.learner.version if self.learner else None,
                "last_gate": self.last_gate, **self.book.snapshot()}

    # -- learning (the background task) -----------------------------------------------------------

    async def tick(self) -> dict[str, float]:
        """Sweep expired sessions, train one step on the ready groups, gate a candidate when one is due."""
        assert self._lock is not None
        async with self._lock:
            expired = self.book.sweep(self.clock())
            metrics: dict[str, float] = {}
            groups, sessions = self._ready_groups()
            if groups and self.learner is not None:
                metrics = await self._train(groups, sessions)
            if expired or metrics:
                self.stack.store.log_metrics(self.step, {**metrics, **self._counter_metrics()})
            return metrics

    def _ready_groups(self) -> tuple[list[GroupResult], list[Any]]:
        store, version = self.stack.store, self.learner.version if self.learner else 0
        results: list[GroupResult] = []
        used: list[Any] = []
        for members in self.book.ready_groups()[: self.settings.groups_per_step]:
            rollouts, ok = [], True
            for s in members:
                rollout = store.get_rollout(s.rollout_id)
                if rollout is None or rollout.status == RolloutStatus.RUNNING:
                    ok = False  # the user's turn has not ended yet: the group waits
                elif rollout.status != RolloutStatus.COMPLETED:
                    self.book.drop([s], "failed")
                    ok = False
                elif rollout_staleness(rollout, version) > self.settings.max_staleness:
                    self.book.drop([s], "stale")
                    ok = False
                else:  # the feedback is the reward; the default the rollout got at its end is replaced
                    rollouts.append(replace(rollout, reward=s.reward, turn_rewards=None, reward_defaulted=False))
            if ok:
                task = store.get_task(rollouts[0].task_id)
                assert task is not None
                group = GroupResult(f"online-s{self.step + 1}-g{len(results)}", task, tuple(rollouts),
                                    tuple(rollouts), False)
                results.append(group)
                used.extend(members)
        return results, used

    async def _train(self, groups: list[GroupResult], sessions: list[Any]) -> dict[str, float]:
        assert self.learner is not None
        batch = self.learner.prepare(groups)
        metrics = dict(batch.metrics)
        if batch.samples:
            metrics.update(await self.learner.step(batch))
        self.step += 1
        rollouts = [r for g in groups for r in g.kept]
        self.stack.store.mark_trained([r.id for r in rollouts], self.step)
        self.stack.store.set_meta(STEP_KEY, self.step)
        self.book.mark_trained(sessions)
        self.trained_since_promotion.extend(rollouts)
        metrics["online/reward/mean"] = sum(r.total_reward for r in rollouts) / len(rollouts)
        self.steps_since_candidate += 1
        serving = self.history[-1]["version"] if self.history else -1
        if self.steps_since_candidate >= self.settings.steps_per_candidate and self.learner.version > serving:
            self.steps_since_candidate = 0
            metrics.update(await self._consider_candidate())
        return metrics

    async def _consider_candidate(self) -> dict[str, float]:
        assert self.learner is not None
        candidate = await self.learner.save()
        version = self.learner.version
        if self.gates is None or not self.history:
            self.last_gate = {"candidate_version": version, "passed": False,
                              "reasons": ["online.holdout is unset: no candidate is promoted without a gate"]}
            return {"gate/passed": 0.0}
        serving = self.history[-1]
        verdict = await self.gates.check(candidate, version, Path(serving["folder"]), serving["version"],
                                         self.trained_since_promotion)
        self.last_gate = verdict.to_json()
        if verdict.passed:
            await self._promote(candidate, version, self.last_gate)
        else:
            _log.warning("mtrl online: candidate v%d not promoted: %s", version, "; ".join(verdict.reasons))
        return {"gate/passed": float(verdict.passed), "gate/candidate_success": verdict.candidate_success,
                "gate/serving_success": verdict.serving_success}

    async def _promote(self, folder: Path, version: int, gate: dict[str, Any]) -> None:
        await self.stack.engine.load_adapter(str(folder), version)
        self.history.append({"version": version, "folder": str(folder), "at": self.clock(), "gate": gate})
        self.stack.store.set_meta(ADAPTERS_KEY, self.history)
        self.stack.store.set_meta(SERVING_KEY, version)
        self.trained_since_promotion = []
        _log.warning("mtrl online: serving adapter v%d", version)

    async def rollback(self) -> dict[str, Any]:
        """Serve the adapter promoted before the current one again (the learner restarts from it too)."""
        return await self._on_learner_loop(self._rollback())

    async def _rollback(self) -> dict[str, Any]:
        assert self._lock is not None
        async with self._lock:
            if len(self.history) < 2:
                raise Conflict("rollback: no earlier adapter to go back to (the serving one is the first)",
                               param="rollback")
            current, earlier = self.history.pop(), self.history.pop()
            # the restored weights get a new version: a version always names one set of weights
            new_version = max(current["version"], self.learner.version if self.learner else 0) + 1
            if self.learner is not None:
                await self.learner.restore(Path(earlier["folder"]), new_version)
            entry = {**earlier, "version": new_version, "at": self.clock(), "restores": earlier["version"],
                     "rolled_back": current["version"]}
            await self.stack.engine.load_adapter(entry["folder"], new_version)
            self.history.append(entry)
            self.stack.store.set_meta(ADAPTERS_KEY, self.history)
            self.stack.store.set_meta(SERVING_KEY, new_version)
            self.trained_since_promotion = []
            self.steps_since_candidate = 0
            return {"serving_version": new_version, "restores": earlier["version"],
                    "rolled_back": current["version"]}

    def _counter_metrics(self) -> dict[str, float]:
        return {f"online/{name}": float(n) for name, n in self.book.counters.items()}


def _gate_runner(config: MtrlConfig, settings: OnlineSettings, agent_env: Any,
                 strict: StrictScorer | None) -> GateRunner:
    """The gate's own stack (engine, store ``online/gates.db``, loopback server, executor) over the held-out set."""
    if agent_env is None:
        raise ValueError(f"online.agent: the gate runs the held-out set {settings.holdout!r} through an agent; "
                         "none was given")
    gate_config = config.with_overrides({"advanced.server.port": 0, "advanced.server.host": "127.0.0.1",
                                         "advanced.server.inference_mode": False})
    tasks = load_tasks(settings.holdout)
    stack = RolloutStack.build(gate_config, store_path=config.run_folder.online / "gates.db",
                               agent_env=agent_env)  # an engine of its own: the serving one never evaluates
    return GateRunner(stack, tasks, settings.holdout_samples, strict)


def _close_parts(stack: RolloutStack, learner: Learner | None, gates: GateRunner | None,
                 server: ServerHandle | None) -> None:
    if server is not None:
        server.stop()
    if learner is not None:
        learner.close()
    if gates is not None:
        asyncio.run(gates.close())
    asyncio.run(stack.close())


__all__ = ["ADAPTERS_KEY", "ONLINE_GROUP", "OnlineService", "SERVING_KEY"]
