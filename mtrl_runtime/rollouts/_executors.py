"""Which executor runs the agent, chosen from what the user passed as ``agent_env``.

A small registry of kinds, tried in order: an object that already is a
``RolloutExecutor``, an agent server URL (``HttpExecutor``), a function
(``InProcessExecutor``, decorated with ``@rollout`` when it is not). A new
kind is one ``ExecutorKind`` line in ``EXECUTOR_KINDS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..executors import HttpExecutor, InProcessExecutor
from ..sandboxes import Sandboxes
from ..types import RolloutExecutor


@dataclass(frozen=True)
class ExecutorKind:
    """One kind of ``agent_env``: how to recognise it and how to build its executor."""

    name: str
    accepts: Callable[[Any], bool]
    build: Callable[[Any, int, Sandboxes | None], RolloutExecutor]  # (agent_env, max_concurrency, sandboxes)


def _is_executor(agent_env: Any) -> bool:
    return isinstance(agent_env, RolloutExecutor) and not callable(agent_env)


EXECUTOR_KINDS: tuple[ExecutorKind, ...] = (
    ExecutorKind("executor", _is_executor, lambda agent_env, _, __: agent_env),
    ExecutorKind("url", lambda agent_env: isinstance(agent_env, str), lambda url, _, __: HttpExecutor(url)),
    ExecutorKind("function", callable,
                 lambda fn, threads, sandboxes: InProcessExecutor(fn, max_threads=threads, sandboxes=sandboxes)),
)


def executor_kind(agent_env: Any) -> ExecutorKind:
    """The kind of ``agent_env``; anything else is a TypeError naming the value and the known kinds.

    The trainer and the evaluator call this when they are constructed, so a
    wrong ``agent_env`` fails before any model is loaded.
    """
    for kind in EXECUTOR_KINDS:
        if kind.accepts(agent_env):
            return kind
    names = ", ".join(k.name for k in EXECUTOR_KINDS)
    raise TypeError(f"agent_env: expected a function, a RolloutExecutor or a URL ({names}), got {agent_env!r}")


def executor_for(agent_env: Any, max_concurrency: int, sandboxes: Sandboxes | None = None) -> RolloutExecutor:
    """A RolloutExecutor from a ``@rollout`` function, an agent server URL, or an executor.

    ``sandboxes``: the run's provider, put in scope for an in-process agent (``rollout_sandbox``).
    """
    return executor_kind(agent_env).build(agent_env, max_concurrency, sandboxes)


__all__ = ["EXECUTOR_KINDS", "ExecutorKind", "executor_for", "executor_kind"]
