"""What names a deployed AgentCore Runtime and how to call it: the ARN, its parts, ``advanced.agentcore``.

No AWS SDK here: the config validates ARNs and qualifiers with these
patterns, which are the service model's own (botocore's
``bedrock-agentcore-control``: ``AgentRuntimeArn``, ``EndpointName``), so a
bad value fails when the config loads, naming the field and the value,
rather than at the first rollout.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

_ARN = re.compile(r"arn:(?P<partition>aws(-[^:]+)?):(?P<service>[^:]*):(?P<region>[^:]*):(?P<account>[^:]*):(?P<resource>.*)")
_REGION = re.compile(r"[a-z0-9-]+")
_ACCOUNT = re.compile(r"[0-9]{12}")
_RUNTIME_ID = re.compile(r"[a-zA-Z][a-zA-Z0-9_]{0,47}-[a-zA-Z0-9]{10}")
_ENDPOINT_NAME = re.compile(r"[a-zA-Z][a-zA-Z0-9_]{0,47}")
SERVICE = "bedrock-agentcore"
EXAMPLE_ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/my_agent-a1B2c3D4e5"


@dataclass(frozen=True)
class RuntimeArn:
    """A parsed AgentCore Runtime ARN: ``arn:<partition>:bedrock-agentcore:<region>:<account>:runtime/<id>``."""

    arn: str
    partition: str
    region: str
    account: str
    runtime_id: str

    def __str__(self) -> str:
        return self.arn


def is_arn(value: object) -> bool:
    """True for a string that claims to be an ARN (``arn:...``); whether it is a good one is ``parse_runtime_arn``'s."""
    return isinstance(value, str) and value.startswith("arn:")


def parse_runtime_arn(value: str, field: str = "runtime_arn") -> RuntimeArn:
    """``value`` as an AgentCore Runtime ARN; anything else is a ValueError naming ``field``, the value and the part."""
    problem = _arn_problem(value)
    if problem is not None:
        raise ValueError(f"{field}: {value!r} is not an AgentCore Runtime ARN: {problem} (expected the form {EXAMPLE_ARN})")
    match = _ARN.fullmatch(value)
    assert match is not None
    return RuntimeArn(value, match["partition"], match["region"], match["account"],
                      match["resource"].removeprefix("runtime/"))


def _arn_problem(value: object) -> str | None:
    if not isinstance(value, str):
        return f"expected a string, got {type(value).__name__}"
    match = _ARN.fullmatch(value)
    if match is None:
        return "an ARN has six ':'-separated parts starting 'arn:aws' (or 'arn:aws-cn', 'arn:aws-us-gov')"
    if match["service"] != SERVICE:
        return f"its service is {match['service']!r}, not {SERVICE!r}"
    if not _REGION.fullmatch(match["region"]):
        return f"its region {match['region']!r} is not a region name (e.g. us-west-2)"
    if not _ACCOUNT.fullmatch(match["account"]):
        return f"its account {match['account']!r} is not a 12-digit account id"
    kind, sep, runtime_id = match["resource"].partition("/")
    if kind != "runtime" or not sep:
        return f"its resource {match['resource']!r} is not 'runtime/<id>' (an agent runtime, not a {kind!r})"
    if not _RUNTIME_ID.fullmatch(runtime_id):
        return f"its runtime id {runtime_id!r} is not '<name>-<10 letters or digits>'"
    return None


class AgentCoreSettings(BaseModel):
    """How rollouts reach a deployed AgentCore Runtime (``advanced.agentcore``; docs/scaling.md).

    ``runtime_arn``: the runtime to train (``mtrl train/eval --agent ARN`` gives it too).
    ``qualifier``: the runtime endpoint (``DEFAULT`` is the runtime's default endpoint).
    ``coordinator_url``: the coordinator's URL as the runtime reaches it (a public
    address, a tunnel or a load balancer in front of ``advanced.server``); None:
    the server's own URL, which only a runtime on this network can reach.
    ``auth``: ``sigv4`` (boto3's credential chain, ``profile`` if given) or
    ``bearer`` (a runtime configured for OAuth: the token from the environment
    variable ``bearer_token_env``, read at each call so a refreshed token is used).
    ``endpoint_url``: the service's URL; None: the region's
    (``https://bedrock-agentcore.<region>.amazonaws.com``).
    ``throttle_retries``: a ThrottlingException (refused before the runtime
    runs, so nothing of the rollout happened) is retried this often with
    backoff; any other error fails the rollout at once.
    ``stop_sessions``: end each rollout's runtime session (StopRuntimeSession)
    when the rollout ends, so idle sessions do not pile up.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    runtime_arn: str | None = None
    qualifier: str = "DEFAULT"
    coordinator_url: str | None = None
    auth: Literal["sigv4", "bearer"] = "sigv4"
    bearer_token_env: str = "MTRL_AGENTCORE_BEARER_TOKEN"
    profile: str | None = None
    endpoint_url: str | None = None
    runtime_user_id: str | None = None  # sent as X-Amzn-Bedrock-AgentCore-Runtime-User-Id (needs InvokeAgentRuntimeForUser)
    throttle_retries: int = Field(default=2, ge=0, le=10)
    stop_sessions: bool = True

    @field_validator("runtime_arn")
    @classmethod
    def _check_arn(cls, value: str | None) -> str | None:
        if value is not None:
            problem = _arn_problem(value)
            if problem is not None:
                raise ValueError(f"not an AgentCore Runtime ARN: {problem} (expected the form {EXAMPLE_ARN})")
        return value

    @field_validator("qualifier")
    @classmethod
    def _check_qualifier(cls, value: str) -> str:
        if not _ENDPOINT_NAME.fullmatch(value):
            raise ValueError("not a runtime endpoint name (a letter, then up to 47 letters, digits or '_'; e.g. DEFAULT)")
        return value

    @field_validator("coordinator_url", "endpoint_url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("expected an http(s) URL")
        return value.rstrip("/") if value is not None else None


__all__ = ["AgentCoreSettings", "EXAMPLE_ARN", "RuntimeArn", "SERVICE", "is_arn", "parse_runtime_arn"]
