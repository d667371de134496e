"""The dispatcher: runs ``group_size`` rollouts per task through a RolloutExecutor and forms groups.

For each task of a step it opens rollouts with the coordinator (id, token,
``step``, ``max_turns``), hands a RolloutSpec to the executor under one
concurrency limit (``advanced.max_concurrency``, shared by every step in
flight), and owns each rollout's one deadline, ``advanced.rollout_timeout_s``
(the spec's ``timeout_s``): at the deadline the executor's run is cancelled
and the coordinator told ``DeadlinePassed``. Whatever the executor returned
is told as ``ExecutorEnded``; the coordinator's state machine alone decides
the final status (the agent's own report, when it came first, stands). The
store's record is what counts; the group policy (``group_policies``) then keeps,
drops or retries the group. With a ``group_scorer`` (a group judge,
``types.GroupRescorer``) a training step's kept group is then rewarded anew,
once complete and before advantages; groups outside a step keep their reward.

Group ids are ``s<step>-g<index>`` (index in the step's batch), and
``s<step>-r<k>`` for the k-th extra task dynamic sampling drew for the step,
so a resumed run finds the rollouts a crashed run recorded for the same group.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Coroutine, Mapping, Sequence

from ..config import MtrlConfig
from ..group_policies import GROUP_POLICIES, GroupRound
from ..seeds import rollout_seed
from ..types import (
    DeadlinePassed,
    ExecutorEnded,
    GroupRescorer,
    Rollout,
    RolloutCoordinator,
    RolloutEvent,
    RolloutExecutor,
    RolloutSpec,
    RolloutStatus,
    RunStopped,
    Task,
)
from ._heartbeat import RolloutTally

log = logging.getLogger("mtrl.train")

ENVIRONMENT_PROBLEM_RATE = 0.01  # permanent failures above this share of a step's rollouts


SeedPlan = Callable[[Task, str, int], int]  # (task, group id, serial in the group) -> the rollout's seed


def training_seed(config: MtrlConfig, task: Task, group_id: str, serial: int) -> int:
    """A training rollout's seed: ``rollout_seed`` of the run's seed (``sampling_params.seed`` when set,
    else ``seed``), its group and its serial."""
    core = config.core
    return rollout_seed(core.seed if core.sampling_params.seed is None else core.sampling_params.seed, group_id, serial)


def group_id_for(step: int, index: int) -> str:
    return f"s{step}-g{index}"


def refill_group_id(step: int, index: int) -> str:
    """The group of the ``index``-th extra task drawn to refill step ``step`` (``TaskSchedule.refill``)."""
    return f"s{step}-r{index}"


@dataclass(frozen=True)
class GroupResult:
    """One task's group after the policy decided: ``kept`` holds the completed rollouts it trains on."""

    id: str
    task: Task
    kept: tuple[Rollout, ...]
    finished: tuple[Rollout, ...]  # every rollout of the group that ended (kept, failed, retried, reused)
    dropped: bool
    retries: int = 0
    reused: int = 0
    permanent_failures: int = 0


@dataclass(frozen=True)
class StepBatch:
    """The groups of one step, with what the dispatcher saw collecting them."""

    step: int
    groups: tuple[GroupResult, ...]
    group_size: int
    seconds: float
    first_version: int
    warnings: tuple[str, ...] = ()

    @property
    def rollouts(self) -> list[Rollout]:
        return [r for g in self.groups for r in g.finished]

    @property
    def kept_groups(self) -> list[GroupResult]:
        return [g for g in self.groups if not g.dropped]

    def extended(self, more: "StepBatch") -> "StepBatch":
        """This batch with ``more`` groups of the same step collected after it (times add up; warnings redone)."""
        if more.step != self.step:
            raise ValueError(f"extended: a batch of step {self.step} cannot take groups of step {more.step}")
        return _with_warnings(StepBatch(self.step, self.groups + more.groups, self.group_size,
                                        self.seconds + more.seconds, min(self.first_version, more.first_version)))

    def failure_metrics(self) -> dict[str, float]:
        statuses = Counter(r.status for r in self.rollouts)
        slots = max(len(self.groups) * self.group_size, 1)
        permanent = sum(g.permanent_failures for g in self.groups)
        rate = permanent / slots
        return {
            "failures/rollouts_failed": float(statuses[RolloutStatus.FAILED]),
            "failures/rollouts_timed_out": float(statuses[RolloutStatus.TIMED_OUT]),
            "failures/rollouts_interrupted": float(statuses[RolloutStatus.INTERRUPTED]),
            "failures/retries": float(sum(g.retries for g in self.groups)),
            "failures/groups_dropped": float(sum(g.dropped for g in self.groups)),
            "failures/permanent": float(permanent),
            "failures/permanent_rate": rate,
            "failures/environment_problem": float(rate > ENVIRONMENT_PROBLEM_RATE),
            "rollout/reused": float(sum(g.reused for g in self.groups)),
        }


class Dispatcher:
    """Collects a step's groups through an executor (see the module docstring).

    ``server_loop`` is the event loop the coordinator's server runs on;
    coordinator coroutines are run there (None: the caller's loop).
    """

    def __init__(
        self,
        coordinator: RolloutCoordinator,
        executor: RolloutExecutor,
        config: MtrlConfig,
        endpoint: str,
        server_loop: asyncio.AbstractEventLoop | None = None,
        group_scorer: GroupRescorer | None = None,
        base_model: bool = False,
        seeds: SeedPlan | None = None,
    ) -> None:
        self.coordinator = coordinator
        self.seeds: SeedPlan = seeds or partial(training_seed, config)  # (task, group id, serial) -> its seed
        self.base_model = base_model  # its rollouts are answered by the base model (``create_rollout``)
        self.executor = executor
        self.config = config
        self.endpoint = endpoint
        self.server_loop = server_loop
        self.group_scorer = group_scorer  # a group judge: rewards a training step's kept group anew (``_rescored``)
        self.policy = GROUP_POLICIES.get(config.advanced.group_policy.on_failure)
        self._slots: asyncio.Semaphore | None = None
        self.tally = RolloutTally()  # rollouts planned / ended per step, for progress lines

    def with_plan(
        self, config: MtrlConfig, executor: RolloutExecutor, base_model: bool = False, seeds: SeedPlan | None = None,
    ) -> "Dispatcher":
        """A dispatcher over the same coordinator and endpoint (and tally) with another config and executor
        (and its own concurrency limit); ``base_model``: its rollouts are the base model's; ``seeds``: their
        seeds (an evaluation plan's)."""
        planned = Dispatcher(self.coordinator, executor, config, self.endpoint, self.server_loop, self.group_scorer,
                             base_model, seeds)
        planned.tally = self.tally
        return planned

    @property
    def slots(self) -> asyncio.Semaphore:
        if self._slots is None:  # created on the loop that runs the dispatcher
            self._slots = asyncio.Semaphore(self.config.advanced.max_concurrency)
        return self._slots

    async def collect(
        self,
        step: int,
        tasks: Sequence[Task],
        reuse: Mapping[str, Sequence[Rollout]] | None = None,
        group_ids: Sequence[str] | None = None,
    ) -> StepBatch:
        """Run every group of ``step``; ``reuse[group_id]`` holds completed rollouts recorded earlier.

        ``group_ids``: one per task (default ``s<step>-g<index>``).
        """
        loop = asyncio.get_running_loop()
        started = loop.time()
        first_version = int(self.coordinator.policy_version)
        reuse = reuse or {}
        ids = list(group_ids) if group_ids is not None else [group_id_for(step, i) for i in range(len(tasks))]
        if len(ids) != len(tasks):
            raise ValueError(f"group_ids: {len(ids)} ids for {len(tasks)} tasks")
        groups = await asyncio.gather(
            *(self._group(step, group_id, task, [r for r in reuse.get(group_id, ()) if r.task_id == task.id])
              for group_id, task in zip(ids, tasks))
        )
        batch = StepBatch(step, tuple(groups), self.config.core.group_size, loop.time() - started, first_version)
        return _with_warnings(batch)

    async def run_group(self, group_id: str, task: Task) -> GroupResult:
        """One group of ``group_size`` rollouts of ``task`` outside any training step (``step`` None)."""
        return await self._group(None, group_id, task, ())

    async def _group(self, step: int | None, group_id: str, task: Task, reused: Sequence[Rollout]) -> GroupResult:
        size = self.config.core.group_size
        completed = [r for r in reused if r.status is RolloutStatus.COMPLETED][:size]
        finished, n_reused = list(completed), len(completed)
        need, rounds, retried, failed = size - n_reused, 0, 0, 0
        while True:
            if need > 0:
                self.tally.plan(step, need)
                first = len(finished)  # each rollout's serial in its group: its seed (``seeds.rollout_seed``)
                new = await asyncio.gather(*(self._rollout(step, group_id, task, first + i) for i in range(need)))
                ok = [r for r in new if r.status is RolloutStatus.COMPLETED]
                finished.extend(new)
                completed.extend(ok)
                failed = len(new) - len(ok)  # failures of earlier rounds were replaced by this round
            decision = self.policy(GroupRound(size, len(completed), failed, rounds), self.config.advanced.group_policy)
            if decision.action != "retry":
                break
            rounds += 1
            retried += decision.retry
            need = decision.retry
        dropped = decision.action == "drop"
        kept, ended = (() if dropped else tuple(completed)), tuple(finished)
        if kept and step is not None and self.group_scorer is not None:  # training only: evaluation keeps its reward
            kept, ended = await self._rescored(task, kept, ended)
        return GroupResult(
            id=group_id,
            task=task,
            kept=kept,
            finished=ended,
            dropped=dropped,
            retries=retried,
            reused=n_reused,
            permanent_failures=failed,
        )

    async def _rescored(
        self, task: Task, kept: tuple[Rollout, ...], finished: tuple[Rollout, ...]
    ) -> tuple[tuple[Rollout, ...], tuple[Rollout, ...]]:
        """``kept`` and ``finished`` with the kept rollouts as the group scorer stored them (its rewards)."""
        assert self.group_scorer is not None
        scored = tuple(await self.group_scorer.rescore(task, kept))
        if [r.id for r in scored] != [r.id for r in kept]:
            raise RuntimeError(f"group scorer {type(self.group_scorer).__name__} returned rollouts "
                               f"{[r.id for r in scored]!r} for {[r.id for r in kept]!r}")
        by_id = {r.id: r for r in scored}
        return scored, tuple(by_id.get(r.id, r) for r in finished)

    async def _rollout(self, step: int | None, group_id: str, task: Task, serial: int) -> Rollout:
        """Run the ``serial``-th rollout of ``group_id`` to its end and return it as the store recorded it.

        Its sampling seed is the plan's (``seeds``), else ``training_seed``: a run repeated with the same
        seed draws the same tokens. The coordinator holds it too, for calls that name no seed.
        """
        core, advanced = self.config.core, self.config.advanced
        seed = self.seeds(task, group_id, serial)
        sampling = replace(core.sampling_params.to_params(), seed=seed)
        async with self.slots:
            handle = await asyncio.to_thread(
                self.coordinator.create_rollout, task, group_id, step=step, max_turns=core.max_turns, seed=seed,
                **({"base_model": True} if self.base_model else {}),
            )
            spec = RolloutSpec(
                rollout_id=handle.rollout_id,
                group_id=group_id,
                task=task,
                token=handle.token,
                endpoint=self.endpoint,
                model_name=self.coordinator.model_name,
                sampling=sampling,
                max_turns=core.max_turns,
                timeout_s=advanced.rollout_timeout_s,
                policy_models=advanced.policy_model_ids,
            )
            event: RolloutEvent
            try:
                outcome = await asyncio.wait_for(self.executor.run(spec), spec.timeout_s)
                event = ExecutorEnded(outcome.status, outcome.error)
            except asyncio.TimeoutError:
                event = DeadlinePassed(spec.timeout_s)
            except asyncio.CancelledError:  # the run is stopping: end the rollout before leaving
                # shielded: a second cancel (the loop tearing down its steps) must not drop the event
                await asyncio.shield(self._on_server(self.coordinator.end(handle.rollout_id, RunStopped())))
                raise
            except Exception as exc:  # the executor itself broke: the rollout failed, the run goes on
                event = ExecutorEnded(RolloutStatus.FAILED, f"executor error: {type(exc).__name__}: {exc}")
            await self._on_server(self.coordinator.end(handle.rollout_id, event))
        rollout = await asyncio.to_thread(self.coordinator.recorded, handle.rollout_id)
        if rollout is None:  # pragma: no cover - the store lost a rollout it committed
            raise RuntimeError(f"rollout {handle.rollout_id!r} is missing from the store")
        self.tally.record(step, rollout.status)
        return rollout

    async def _on_server(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return await on_loop(self.server_loop, coro)


async def on_loop(loop: asyncio.AbstractEventLoop | None, coro: Coroutine[Any, Any, Any]) -> Any:
    """Await ``coro`` on ``loop`` (the coordinator's server loop, which owns its rollouts' locks); None: here."""
    if loop is None or loop is asyncio.get_running_loop():
        return await coro
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


def _with_warnings(batch: StepBatch) -> StepBatch:
    """Add the environment-problem warning when permanent failures exceed 1% of the step's rollouts."""
    metrics = batch.failure_metrics()
    if not metrics["failures/environment_problem"]:
        return batch
    errors = Counter((r.error or r.status.value)[:200] for g in batch.groups for r in g.finished
                     if r.status is not RolloutStatus.COMPLETED)
    common = "; ".join(f"{n}x {e!r}" for e, n in errors.most_common(3))
    line = (
        f"environment problem at step {batch.step}: {metrics['failures/permanent_rate']:.1%} of rollouts failed "
        f"for good (above {ENVIRONMENT_PROBLEM_RATE:.0%}); most common errors: {common}"
    )
    log.warning("mtrl: %s", line)
    return StepBatch(batch.step, batch.groups, batch.group_size, batch.seconds, batch.first_version, (line,))


__all__ = ["Dispatcher", "ENVIRONMENT_PROBLEM_RATE", "GroupResult", "StepBatch", "group_id_for", "refill_group_id"]
