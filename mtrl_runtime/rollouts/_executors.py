"""Which executor runs the agent, chosen from what the user passed as ``agent_env``.

A small registry of kinds, tried in order: an object that already is a
``RolloutExecutor``, an AgentCore Runtime ARN (``AgentCoreExecutor``, set
up by ``advanced.agentcore``), an agent server URL (``HttpExecutor``), a
function (``InProcessExecutor``, decorated with ``@rollout`` when it is
not). A new kind is one ``ExecutorKind`` line in ``EXECUTOR_KINDS``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..executors import AgentCoreExecutor, AgentCoreSettings, HttpExecutor, InProcessExecutor, is_arn, parse_runtime_arn
from ..sandboxes import Sandboxes
from ..types import RolloutExecutor


@dataclass(frozen=True)
class ExecutorOptions:
    """What a kind may build its executor with: the run's concurrency, sandboxes and ``advanced.agentcore``."""

    max_concurrency: int
    sandboxes: Sandboxes | None = None
    agentcore: AgentCoreSettings | None = None


@dataclass(frozen=True)
class ExecutorKind:
    """One kind of ``agent_env``: how to recognise it, check it (raising ValueError), and build its executor."""

    name: str
    accepts: Callable[[Any], bool]
    build: Callable[[Any, ExecutorOptions], RolloutExecutor]
    check: Callable[[Any], object] | None = None


def _is_executor(agent_env: Any) -> bool:
    return isinstance(agent_env, RolloutExecutor) and not callable(agent_env)


EXECUTOR_KINDS: tuple[ExecutorKind, ...] = (
    ExecutorKind("executor", _is_executor, lambda agent_env, _: agent_env),
    ExecutorKind("agentcore", is_arn,
                 lambda arn, o: AgentCoreExecutor(parse_runtime_arn(arn, "agent_env"), o.agentcore,
                                                  max_connections=o.max_concurrency),
                 check=lambda arn: parse_runtime_arn(arn, "agent_env")),
    ExecutorKind("url", lambda agent_env: isinstance(agent_env, str), lambda url, _: HttpExecutor(url)),
    ExecutorKind("function", callable,
                 lambda fn, o: InProcessExecutor(fn, max_threads=o.max_concurrency, sandboxes=o.sandboxes)),
)


def executor_kind(agent_env: Any) -> ExecutorKind:
    """The kind of ``agent_env``, its value checked; anything else is a TypeError naming the value and the kinds.

    The trainer and the evaluator call this when they are constructed, so a
    wrong ``agent_env`` (or a malformed ARN: a ValueError naming it) fails
    before any model is loaded.
    """
    for kind in EXECUTOR_KINDS:
        if kind.accepts(agent_env):
            if kind.check is not None:
                kind.check(agent_env)
            return kind
    names = ", ".join(k.name for k in EXECUTOR_KINDS)
    raise TypeError(f"agent_env: expected a function, a RolloutExecutor, an AgentCore Runtime ARN or a URL "
                    f"({names}), got {agent_env!r}")


def executor_for(
    agent_env: Any,
    max_concurrency: int,
    sandboxes: Sandboxes | None = None,
    agentcore: AgentCoreSettings | None = None,
) -> RolloutExecutor:
    """A RolloutExecutor from a ``@rollout`` function, an AgentCore Runtime ARN, an agent server URL, or an executor.

    ``sandboxes``: the run's provider, put in scope for an in-process agent (``rollout_sandbox``).
    ``agentcore``: ``advanced.agentcore``, for an ARN.
    """
    return executor_kind(agent_env).build(agent_env, ExecutorOptions(max_concurrency, sandboxes, agentcore))


__all__ = ["EXECUTOR_KINDS", "ExecutorKind", "ExecutorOptions", "executor_for", "executor_kind"]
