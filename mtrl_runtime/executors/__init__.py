"""Rollout executors: where the user's agent runs for a rollout (this process, an agent server, a Ray cluster,
a deployed AgentCore Runtime)."""

from ._agentcore import AgentCoreCounters, AgentCoreExecutor, default_payload, runtime_session_id  # boto3: on use
from ._agentcore_settings import AgentCoreSettings, RuntimeArn, is_arn, parse_runtime_arn
from ._http import HttpExecutor, rollout_request_body, task_instance
from ._inprocess import InProcessExecutor
from ._ray import RayExecutor, endpoint_problem  # imports ray only when constructed

__all__ = [
    "AgentCoreCounters",
    "AgentCoreExecutor",
    "AgentCoreSettings",
    "HttpExecutor",
    "InProcessExecutor",
    "RayExecutor",
    "RuntimeArn",
    "default_payload",
    "endpoint_problem",
    "is_arn",
    "parse_runtime_arn",
    "rollout_request_body",
    "runtime_session_id",
    "task_instance",
]
