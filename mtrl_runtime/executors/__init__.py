"""Rollout executors: where the user's agent runs for a rollout (this process, an agent server, a Ray cluster)."""

from ._http import HttpExecutor, task_instance
from ._inprocess import InProcessExecutor
from ._ray import RayExecutor, endpoint_problem  # imports ray only when constructed

__all__ = ["HttpExecutor", "InProcessExecutor", "RayExecutor", "endpoint_problem", "task_instance"]
