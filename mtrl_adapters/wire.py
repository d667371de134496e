"""Wire schemas shared by the agent side and the coordinator.

They live on the light side (no torch, no server) so an agent process can
import them; the runtime imports them from here. Every name that crosses the
HTTP boundary between an agent and the coordinator is defined once, here.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Headers a model call may carry to attribute itself to a rollout.
HEADER_ROLLOUT_ID = "x-mtrl-rollout-id"
HEADER_TURN_HINT = "x-mtrl-turn"  # optional: the agent's own turn counter, for diagnostics
# SageMaker AI multi-turn RL's headers, accepted in compatibility mode.
HEADER_SM_TRAJECTORY_ID = "x-amzn-sagemaker-trajectory-id"
HEADER_SM_JOB_ARN = "x-amzn-sagemaker-job-arn"

# Path prefix that attributes any OpenAI route to a rollout: /rollouts/{id}/v1/chat/completions
ROLLOUT_PREFIX = "/rollouts/{rollout_id}"


def rollout_base_url(endpoint: str, rollout_id: str) -> str:
    """The OpenAI ``base_url`` that attributes every call of a client to one rollout."""
    return f"{endpoint.rstrip('/')}/rollouts/{rollout_id}/v1"


# Each SDK family's base URL setting, as that SDK takes it: the OpenAI SDKs append ``/chat/completions`` or
# ``/responses`` to a base that ends in ``/v1``; Anthropic's SDK and Claude Code (``ANTHROPIC_BASE_URL``) append
# ``/v1/messages``; boto3's ``endpoint_url`` appends ``/model/{id}/converse``; google-genai's ``base_url`` appends
# ``/v1beta/models/...``. An Anthropic client handed the OpenAI URL reached ``/v1/v1/messages``: a 404.
BASE_URL_SUFFIXES = {"openai": "/v1", "anthropic": "", "bedrock": "", "gemini": ""}


def rollout_base_urls(endpoint: str, rollout_id: str) -> dict[str, str]:
    """The base URL for each SDK family (``BASE_URL_SUFFIXES``) that attributes its calls to one rollout."""
    root = f"{endpoint.rstrip('/')}/rollouts/{rollout_id}"
    return {family: root + suffix for family, suffix in BASE_URL_SUFFIXES.items()}


# A SageMaker trajectory id as mtrl hands it to agents: ``<rollout_id>.<mac>``. The MAC
# binds a SageMaker SigV4 token (which stands for the run) to one rollout; see trajectory_id.
TRAJECTORY_MAC_SEPARATOR = "."
TRAJECTORY_MAC_HEX = 32


def trajectory_mac(rollout_id: str, token_hash: str) -> str:
    """The MAC of ``rollout_id`` under its token's sha256 hex digest (what the coordinator stores)."""
    digest = hmac.new(token_hash.encode(), b"mtrl-trajectory:" + rollout_id.encode(), hashlib.sha256)
    return digest.hexdigest()[:TRAJECTORY_MAC_HEX]


def trajectory_id(rollout_id: str, token: str) -> str:
    """The trajectory id a SageMaker-shaped agent gets for a rollout: ``<rollout_id>.<mac>``.

    The MAC is keyed by the rollout's token (through its sha256, which the
    coordinator keeps), so only whoever was handed the rollout (its executor,
    then its agent) can name it this way; the id itself grants nothing
    without a credential (the rollout's token, or a verified SigV4 token).
    """
    token_hash = hashlib.sha256(token.encode("utf-8")).hexdigest()
    return f"{rollout_id}{TRAJECTORY_MAC_SEPARATOR}{trajectory_mac(rollout_id, token_hash)}"


def split_trajectory_id(value: str) -> tuple[str, str | None]:
    """``(rollout_id, mac)`` of a trajectory id; ``mac`` is None for a bare rollout id."""
    rollout_id, sep, mac = value.partition(TRAJECTORY_MAC_SEPARATOR)
    return (rollout_id, mac) if sep else (value, None)


class _Strict(BaseModel):
    """Unknown fields are refused, and so are wrong types: no string read as a bool, no bool as a number."""

    model_config = ConfigDict(extra="forbid", strict=True)


METRIC_LIMIT = 1e12
"""The bound on a reward metric's magnitude: averaged over a step's rollouts it stays a finite number."""

INT64_MAX = 2**63 - 1
"""The largest integer a report may carry: the store (SQLite) keeps integers as signed 64 bits."""


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return value


class ToolCallReport(_Strict):
    """One tool call the agent made, reported by its adapter."""

    name: str = Field(min_length=1, max_length=256)
    arguments: Any = None
    call_id: str | None = Field(default=None, max_length=256)
    result: Any = None
    error: str | None = Field(default=None, max_length=65536)
    status: Literal["success", "error"] = "success"
    latency_s: float = Field(default=0.0, ge=0.0)
    turn_index: int | None = Field(default=None, ge=0, le=INT64_MAX)
    started_at: float = 0.0
    source: str | None = Field(default=None, min_length=1, max_length=256)  # "mcp:<server>"; None: a local tool

    @field_validator("latency_s", "started_at")
    @classmethod
    def _check_finite(cls, v: float, info: Any) -> float:
        return _finite(info.field_name, v)


class RewardReport(_Strict):
    """``update_reward``: a scalar reward or per-turn rewards, plus named float metrics."""

    reward: float | None = None
    turn_rewards: list[float] | None = Field(default=None, max_length=10000)
    metrics: dict[str, float] = Field(default_factory=dict, max_length=1000)
    # each role's own reward (a run whose policy_models maps roles to model ids); a role left out gets the episode's
    role_rewards: dict[str, float] | None = Field(default=None, max_length=64)

    @field_validator("role_rewards")
    @classmethod
    def _roles_finite(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None:
            if not v:
                raise ValueError("role_rewards is empty; give {role: float, ...} for the roles rewarded apart, or "
                                 "leave it out")
            for role, r in v.items():
                if not role:
                    raise ValueError(f"role_rewards names an empty role, got {v!r}")
                _finite(f"role_rewards[{role!r}]", r)
        return v

    @field_validator("reward")
    @classmethod
    def _reward_finite(cls, v: float | None) -> float | None:
        return None if v is None else _finite("reward", v)

    @field_validator("turn_rewards")
    @classmethod
    def _turns_finite(cls, v: list[float] | None) -> list[float] | None:
        if v is not None:
            if not v:  # no value at all: the rollout would end with no reward, and not flagged as defaulted
                raise ValueError("turn_rewards is empty; give one float per turn, or reward (one float) for the "
                                 "whole rollout")
            for i, r in enumerate(v):
                _finite(f"turn_rewards[{i}]", r)
        return v

    @field_validator("metrics")
    @classmethod
    def _metrics_finite(cls, v: dict[str, float]) -> dict[str, float]:
        for k, m in v.items():
            _finite(f"metrics[{k!r}]", m)
            if abs(m) > METRIC_LIMIT:
                raise ValueError(f"metrics[{k!r}] is {m!r}; a metric's magnitude must be at most {METRIC_LIMIT:g}")
        return v

    @model_validator(mode="after")
    def _one_of(self) -> "RewardReport":
        if (self.reward is None) == (self.turn_rewards is None):
            raise ValueError("give exactly one of reward (a float) or turn_rewards (a list of floats)")
        return self


class ToolCallBatch(_Strict):
    """Several tool calls of one rollout in one request (adapters send their buffer at the end)."""

    calls: list[ToolCallReport] = Field(max_length=10000)


class ModelCallReport(_Strict):
    """A model call that was not the policy's: it went to its own endpoint (see ``mtrl_adapters._selective``).

    Recorded so the trace stays whole; never trained on. Tokens are None where the response did not say them.
    Assignment is not validated: a stream's record is completed in place as the stream is read.
    """

    protocol: str = Field(min_length=1, max_length=64)  # openai | anthropic | bedrock
    model: str | None = Field(default=None, max_length=512)
    latency_s: float = Field(default=0.0, ge=0.0)
    started_at: float = 0.0
    input_tokens: int | None = Field(default=None, ge=0, le=INT64_MAX)
    output_tokens: int | None = Field(default=None, ge=0, le=INT64_MAX)
    stream: bool = False
    status: Literal["success", "error"] = "success"
    error: str | None = Field(default=None, max_length=65536)

    @field_validator("latency_s", "started_at")
    @classmethod
    def _check_finite(cls, v: float, info: Any) -> float:
        return _finite(info.field_name, v)


class ModelCallBatch(_Strict):
    """A rollout's non-policy model calls (``POST /rollouts/{id}/model_calls/batch``, sent at its end)."""

    calls: list[ModelCallReport] = Field(max_length=10000)


AgentFlag = Literal["policy_calls_ambiguous", "policy_calls_inferred"]
"""Flags the agent's side sets on its rollout (``mtrl_adapters._policy_rule``); stored in the rollout's metrics."""


class CompletionReport(_Strict):
    """The agent finished (or failed); the coordinator closes the rollout. ``flags``: what the agent's side noted."""

    status: Literal["completed", "failed", "timed_out"] = "completed"
    error: str | None = Field(default=None, max_length=65536)
    flags: dict[AgentFlag, float] = Field(default_factory=dict)
    # the agent ran tools no adapter saw (a CLI harness): store each tool call from the conversation on the wire
    # (the model's call in one turn, its result in a later request) as the rollout's tool calls
    tool_calls_from_wire: bool = False

    @field_validator("flags")
    @classmethod
    def _flags_counts(cls, v: dict[str, float]) -> dict[str, float]:
        for name, value in v.items():
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"flags[{name!r}] must be a finite count >= 0, got {value!r}")
        return v


class CreateRolloutRequest(_Strict):
    """``POST /v1/rollouts``: open a rollout for a task (remote orchestration, ``mtrl serve``)."""

    task_id: str = Field(min_length=1, max_length=256)
    prompt: str | None = Field(default=None, max_length=1_000_000)
    ground_truth: Any = None
    data: dict[str, Any] = Field(default_factory=dict)
    group_id: str | None = Field(default=None, min_length=1, max_length=256)
    max_turns: int | None = Field(default=None, ge=1, le=1000)
    # what the rollout's calls sample with when they name no seed (turn t > 0: a seed derived from it); without
    # one, the run's sampling_params.seed and the rollout id give it one. 63 bits: what engines and clients take
    seed: int | None = Field(default=None, ge=0, le=INT64_MAX)


class CreatedRollout(BaseModel):
    """The new rollout's id, its secret token, and the base URLs that attribute calls to it: ``base_url`` for
    the OpenAI SDKs, ``base_urls`` one per SDK family as that SDK takes it (``rollout_base_urls``).

    ``trajectory_id`` is what to hand an agent written for SageMaker's adapters
    (``metadata.trajectory_id``): the rollout id with its MAC (see ``trajectory_id``).
    """

    rollout_id: str
    token: str
    group_id: str
    base_url: str
    trajectory_id: str | None = None
    base_urls: dict[str, str] = Field(default_factory=dict)


class RolloutState(BaseModel):
    """What the coordinator says about a rollout (``GET /rollouts/{rollout_id}``)."""

    rollout_id: str
    task_id: str
    group_id: str
    status: str
    turns: int
    tool_calls: int
    reward: float | None = None
    turn_rewards: list[float] | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    error: str | None = None


class RolloutServerRequest(BaseModel):
    """``POST /rollout`` on an agent server, in SageMaker AI MTRL's rollout-server shape.

    ``metadata`` carries ``job_arn``, ``trajectory_id`` (``<rollout_id>.<mac>``,
    see ``trajectory_id``), ``endpoint`` and ``region`` as SageMaker sends
    them; mtrl adds ``rollout_id``, ``rollout_token``, ``group_id``,
    ``max_turns`` and ``timeout_s``. ``instance`` is the dataset row.
    """

    model_config = ConfigDict(extra="allow")

    instance: dict[str, Any]
    metadata: dict[str, Any] = Field(default_factory=dict)
    inference_params: dict[str, Any] = Field(default_factory=dict)
    model_name: str | None = None
    model_endpoint: str | None = None


class SageMakerCompleteRollout(BaseModel):
    """``POST /complete-rollout`` as SageMaker AI MTRL's feedback client sends it."""

    model_config = ConfigDict(extra="allow", strict=True)

    JobArn: str | None = None
    TrajectoryId: str
    Status: str = "COMPLETED"


class SageMakerUpdateReward(BaseModel):
    """``POST /update-reward`` as SageMaker AI MTRL's feedback client sends it."""

    model_config = ConfigDict(extra="allow", strict=True)

    JobArn: str | None = None
    TrajectoryId: str
    Rewards: list[float] | float


__all__ = [
    "AgentFlag",
    "HEADER_ROLLOUT_ID",
    "HEADER_SM_JOB_ARN",
    "HEADER_SM_TRAJECTORY_ID",
    "HEADER_TURN_HINT",
    "INT64_MAX",
    "METRIC_LIMIT",
    "ROLLOUT_PREFIX",
    "TRAJECTORY_MAC_HEX",
    "TRAJECTORY_MAC_SEPARATOR",
    "CompletionReport",
    "CreateRolloutRequest",
    "CreatedRollout",
    "ModelCallBatch",
    "ModelCallReport",
    "RewardReport",
    "RolloutServerRequest",
    "RolloutState",
    "SageMakerCompleteRollout",
    "SageMakerUpdateReward",
    "ToolCallBatch",
    "ToolCallReport",
    "rollout_base_url",
    "split_trajectory_id",
    "trajectory_id",
    "trajectory_mac",
]
