"""The Ray executor: runs each rollout on a Ray cluster; the agent reaches the coordinator over HTTP.

In the Ray worker the agent function (decorated with ``@rollout`` here if
it is not) runs inside ``rollout_scope(spec)``, so its model calls go to
``spec.endpoint`` (the coordinator, which must be reachable from the
cluster's nodes) with the rollout's own token, and it reports its tool
calls, reward and end itself, exactly as an agent server would.

Two ways to place rollouts:

- tasks (default): one Ray task per rollout (``num_cpus`` each, no
  retries). A worker that dies (a crash, ``os._exit``, the OOM killer, a
  lost node) fails only its own rollout, recorded with Ray's reason; the
  group policy then keeps, drops or retries the group.
- ``actors=N``: N async actors, each running up to ``actor_concurrency``
  rollouts on its own event loop (cheaper per rollout for agents that
  mostly wait on the model). An actor that dies fails the rollouts it was
  running and is restarted by Ray for the next ones.

The agent function travels to the workers by pickle (cloudpickle): a
function defined in a module is pickled by reference, so that module must
be importable on every node (install it, or ship it with
``init_options={"runtime_env": {"py_modules": [...]}}``).

``RayExecutor(agent_fn, address="ray://head:10001")`` or ``address="auto"``
joins an existing cluster; without an address, Ray starts a local one
(``init_options`` go to ``ray.init``). If Ray is already initialized in
this process, that connection is used and left open at ``close()``.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
from urllib.parse import urlsplit
from typing import Any, Mapping

from mtrl_adapters import is_decorated, rollout, rollout_scope

from ..types import AgentFn, RolloutOutcome, RolloutSpec, RolloutStatus

_STATUSES = {s.value: s for s in RolloutStatus}
_TIMEOUT_MARGIN_S = 5.0  # the agent's own timeout (the decorator's) fires first; this catches a stuck worker


async def run_agent(agent_fn: AgentFn, spec: RolloutSpec) -> tuple[str, str | None]:
    """Run the agent for ``spec`` in this (worker) process, decorated here if it is not; returns (status, error).

    Decorating on the worker side keeps what travels picklable: a decorated
    module-level function goes by reference, a plain one by value.
    """
    if not is_decorated(agent_fn):
        agent_fn = rollout(agent_fn)
    with rollout_scope(spec) as ctx:
        try:
            if inspect.iscoroutinefunction(agent_fn):
                await agent_fn(spec.task)
            else:
                await asyncio.to_thread(agent_fn, spec.task)
        except Exception as exc:  # the decorator has recorded it; the rollout is data
            return RolloutStatus.FAILED.value, f"{type(exc).__name__}: {exc}"
    reported = ctx.outcome
    if reported is None:
        return RolloutStatus.COMPLETED.value, None
    return reported.status, reported.error


def run_agent_task(agent_fn: AgentFn, spec: RolloutSpec) -> tuple[str, str | None]:
    """The body of one rollout task (a Ray worker runs it with its own event loop)."""
    return asyncio.run(run_agent(agent_fn, spec))


class _RolloutActor:
    """The body of one async actor: rollouts run concurrently on the actor's event loop."""

    def __init__(self, agent_fn: AgentFn) -> None:
        self.agent_fn = agent_fn

    async def run(self, spec: RolloutSpec) -> tuple[str, str | None]:
        return await run_agent(self.agent_fn, spec)

    def ready(self) -> bool:
        return True


class RayExecutor:
    """Runs ``agent_fn(task)`` for each RolloutSpec on a Ray cluster (see the module docstring)."""

    def __init__(
        self,
        agent_fn: AgentFn,
        *,
        address: str | None = None,
        init_options: Mapping[str, Any] | None = None,
        num_cpus: float = 1.0,
        actors: int = 0,
        actor_concurrency: int = 16,
        remote_options: Mapping[str, Any] | None = None,
    ) -> None:
        """``remote_options`` go to ``.options(...)`` of each task or actor (resources, scheduling, runtime_env)."""
        import ray

        if not callable(agent_fn):
            raise TypeError(f"agent_fn: expected a function taking a task, got {agent_fn!r}")
        if num_cpus < 0:
            raise ValueError(f"num_cpus: must be >= 0, got {num_cpus}")
        if actors < 0 or actor_concurrency < 1:
            raise ValueError(f"actors / actor_concurrency: expected >= 0 / >= 1, got {actors} / {actor_concurrency}")
        self.agent_fn = agent_fn  # decorated in the worker (see run_agent)
        self.owns_ray = not ray.is_initialized()
        if self.owns_ray:
            ray.init(address=address, **dict(init_options or {}))
        elif address is not None or init_options:
            raise ValueError("address / init_options: Ray is already initialized in this process; drop them")
        options = {"num_cpus": num_cpus, **dict(remote_options or {})}
        self._agent_ref = ray.put(self.agent_fn)  # shipped once; each task gets the reference
        self._task = ray.remote(run_agent_task).options(max_retries=0, retry_exceptions=False, **options)
        self._actors: list[Any] = []
        self._load: list[int] = []  # rollouts in flight per actor
        self._down: set[int] = set()  # actors that died and are not yet answering again
        self._revivals: set[asyncio.Task] = set()
        if actors:
            actor_class = ray.remote(_RolloutActor).options(
                max_concurrency=actor_concurrency, max_restarts=-1, max_task_retries=0, **options
            )
            # the function itself (not its object-store reference) goes with each actor, so a restart can rebuild it
            self._actors = [actor_class.remote(self.agent_fn) for _ in range(actors)]
            self._load = [0] * actors
        self._closed = False
        self._endpoints_checked: set[str] = set()

    async def run(self, spec: RolloutSpec) -> RolloutOutcome:
        import ray

        if self._closed:
            raise RuntimeError("the Ray executor is closed")
        if spec.endpoint not in self._endpoints_checked:
            problem = endpoint_problem(spec.endpoint, _node_addresses())
            if problem is not None:
                raise ValueError(problem)
            self._endpoints_checked.add(spec.endpoint)
        slot = await self._pick_actor() if self._actors else None
        if slot is None:
            ref = self._task.remote(self._agent_ref, spec)
        else:
            self._load[slot] += 1
            ref = self._actors[slot].run.remote(spec)
        try:
            status, error = await asyncio.wait_for(asyncio.wrap_future(ref.future()), spec.timeout_s + _TIMEOUT_MARGIN_S)
        except asyncio.TimeoutError:
            ray.cancel(ref, force=slot is None)
            return RolloutOutcome(spec.rollout_id, RolloutStatus.TIMED_OUT,
                                  f"the Ray {'task' if slot is None else 'actor'} did not finish within "
                                  f"timeout_s={spec.timeout_s:g} (+{_TIMEOUT_MARGIN_S:g} s) and was cancelled")
        except asyncio.CancelledError:
            ray.cancel(ref, force=slot is None)
            raise
        except ray.exceptions.RayError as exc:
            if slot is not None:
                self._watch_revival(slot)
            return RolloutOutcome(spec.rollout_id, RolloutStatus.FAILED, _died(exc, slot is None))
        finally:
            if slot is not None:
                self._load[slot] -= 1
        return RolloutOutcome(spec.rollout_id, _STATUSES.get(status, RolloutStatus.FAILED), error)

    async def _pick_actor(self) -> int:
        """The least loaded actor that is up; waits while every actor is restarting."""
        while True:
            up = [i for i in range(len(self._actors)) if i not in self._down]
            if up:
                return min(up, key=self._load.__getitem__)
            await asyncio.sleep(0.2)

    def _watch_revival(self, slot: int) -> None:
        """Keep new rollouts off a dead actor until Ray has restarted it and it answers."""
        if slot in self._down or self._closed:
            return
        self._down.add(slot)
        task = asyncio.get_running_loop().create_task(self._revive(slot))
        self._revivals.add(task)
        task.add_done_callback(self._revivals.discard)

    async def _revive(self, slot: int) -> None:
        import ray

        while not self._closed:
            try:
                await asyncio.wrap_future(self._actors[slot].ready.remote().future())
                self._down.discard(slot)
                return
            except ray.exceptions.RayError:
                await asyncio.sleep(0.5)

    async def close(self) -> None:
        """Stop the actors; shut Ray down if this executor started it."""
        import ray

        if self._closed:
            return
        self._closed = True
        for task in list(self._revivals):
            task.cancel()
        for actor in self._actors:
            ray.kill(actor)
        if self.owns_ray:
            await asyncio.to_thread(ray.shutdown)


def endpoint_problem(endpoint: str, node_addresses: set[str]) -> str | None:
    """Why Ray workers on ``node_addresses`` could not reach the coordinator at ``endpoint``; None when they can.

    A rollout is told to call ``endpoint``: a wildcard bind (0.0.0.0) sends a
    worker to its own machine, and a loopback one cannot be reached from a
    node on another machine.
    """
    host = urlsplit(endpoint).hostname or ""
    fix = ("bind advanced.server.host to this machine's address the Ray nodes reach (e.g. 10.0.0.1), "
           "with advanced.server.api_key (docs/scaling.md)")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return None  # a host name: resolved on each node
    if address.is_unspecified:
        return f"the coordinator's endpoint {endpoint!r} is a wildcard address, which a Ray worker reads as its own machine; {fix}"
    remote = sorted(a for a in node_addresses if not _is_this_machine(a))
    if address.is_loopback and remote:
        return (f"the coordinator's endpoint {endpoint!r} is a loopback address, and Ray nodes on other machines "
                f"({', '.join(remote[:4])}) cannot reach it; {fix}")
    return None


def _node_addresses() -> set[str]:
    import ray

    return {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}


def _is_this_machine(address: str) -> bool:
    """Whether ``address`` is loopback or one of this machine's interfaces (unknown without psutil: assumed so)."""
    try:
        if ipaddress.ip_address(address).is_loopback:
            return True
    except ValueError:
        return True
    try:
        import psutil
    except ImportError:  # pragma: no cover - ray[default] brings psutil
        return True
    return any(a.address == address for addrs in psutil.net_if_addrs().values() for a in addrs)


def _died(exc: BaseException, task: bool) -> str:
    """Why a rollout's Ray work failed, in one line (Ray's own text can run to many lines)."""
    import ray

    where = "worker" if task else "actor"
    if isinstance(exc, ray.exceptions.RayTaskError):  # it ran and raised outside the agent (e.g. an import error)
        cause = exc.cause if exc.cause is not None else exc
        return f"the Ray {where} running this rollout raised {type(cause).__name__}: {_first_line(cause)}"
    return f"the Ray {where} running this rollout died: {type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:500] if text else ""


__all__ = ["RayExecutor", "endpoint_problem", "run_agent", "run_agent_task"]
