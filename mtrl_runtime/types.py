"""The contract: every data type and every seam of mtrl in one module.

Data are frozen dataclasses; what users or backends implement are Protocols.
This module imports nothing of the project, so every other module can depend
on it without depending on each other.

Shape suffixes on sequences: ``_T`` is per token of a sequence, ``_G`` per
rollout of a group.

Example of a custom engine (the seam the hf, vllm and scripted engines fill)::

    class EchoEngine:
        name = "echo"
        def __init__(self, tokenizer):
            self.tokenizer = tokenizer
            self.policy_version = 0
        async def generate(self, request: GenerationRequest) -> Generation:
            ids = tuple(request.prompt_ids[-3:]) + (self.tokenizer.eos_token_id,)
            return Generation(completion_ids=ids, logprobs=(0.0,) * len(ids),
                              finish_reason="stop")
        async def load_adapter(self, path: str, version: int) -> None:
            self.policy_version = version
        async def close(self) -> None:
            pass
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Mapping, Protocol, runtime_checkable

JSON = Any  # a value that round-trips through json.dumps / json.loads


class RolloutStatus(str, enum.Enum):
    """Where a rollout is in its life; every status but RUNNING is final."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"

    @property
    def is_final(self) -> bool:
        return self is not RolloutStatus.RUNNING


class BreakReason(str, enum.Enum):
    """Why a turn's prompt did not extend the rollout's previous prompt + reply.

    A break starts a new segment (a new training sequence) for the rollout.
    """

    HISTORY_REWRITTEN = "history_rewritten"  # earlier messages differ from the last request
    REPLY_EDITED = "reply_edited"  # the agent sent back a different assistant reply
    TOOLS_CHANGED = "tools_changed"  # the tool list changed between calls
    TEMPLATE_NOT_PREFIX = "template_not_prefix"  # the chat template re-rendered the past differently
    REPLY_MISSING = "reply_missing"  # the request does not contain the previous reply


@dataclass(frozen=True)
class Task:
    """One dataset row. ``messages`` (OpenAI chat format) or ``prompt`` holds the input."""

    id: str
    prompt: str | None = None
    messages: tuple[Mapping[str, JSON], ...] | None = None
    ground_truth: JSON = None
    split: str = "train"
    data: Mapping[str, JSON] = field(default_factory=dict)


@dataclass(frozen=True)
class SamplingParams:
    """How one completion is sampled. ``max_tokens`` is per turn."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 4096
    stop: tuple[str, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0


@dataclass(frozen=True)
class GenerationRequest:
    """Token-in: what the endpoint asks an engine for.

    ``adapter`` names the policy version whose weights must produce the
    tokens (None: the engine's current one). ``rollout_id`` and
    ``turn_index`` are for engines that need them (the scripted double, routing).
    """

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    adapter: int | None = None
    rollout_id: str | None = None
    turn_index: int = 0


@dataclass(frozen=True)
class Generation:
    """Token-out: ids and the behaviour logprob of each sampled id.

    ``finish_reason`` is "stop" (an eos or stop string was produced) or
    "length" (max_tokens reached). ``top_logprobs_T`` holds, per token, the
    top alternatives as (token_id, logprob) pairs when they were asked for.
    """

    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    policy_version: int = 0
    top_logprobs_T: tuple[tuple[tuple[int, float], ...], ...] | None = None


@dataclass(frozen=True)
class ToolCall:
    """One tool invocation by the agent, as its adapter observed it."""

    rollout_id: str
    name: str
    arguments: JSON
    call_id: str | None = None
    result: JSON = None
    error: str | None = None
    status: str = "success"  # "success" | "error"
    latency_s: float = 0.0
    turn_index: int | None = None
    started_at: float = 0.0


@dataclass(frozen=True)
class Turn:
    """One LLM call of a rollout, captured by the endpoint.

    ``prompt_ids`` is the full prompt the engine saw. When the turn extends
    the previous one (``break_reason`` is None and ``index`` > 0),
    ``prompt_ids`` starts with the previous turn's prompt_ids + completion_ids.
    """

    rollout_id: str
    index: int
    messages: tuple[Mapping[str, JSON], ...]
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    completion_text: str
    tool_calls: tuple[Mapping[str, JSON], ...] = ()  # OpenAI format, as sent to the agent
    tools: tuple[Mapping[str, JSON], ...] = ()
    policy_version: int = 0
    segment: int = 0
    break_reason: BreakReason | None = None
    malformed_tool_call: bool = False
    started_at: float = 0.0
    latency_s: float = 0.0


@dataclass(frozen=True)
class Rollout:
    """One episode of the agent on one task.

    Exactly one of ``reward`` and ``turn_rewards`` is set once the agent has
    reported; ``reward_defaulted`` marks a rollout that never reported and
    got the configured default.
    """

    id: str
    task_id: str
    group_id: str
    status: RolloutStatus = RolloutStatus.RUNNING
    turns: tuple[Turn, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    reward: float | None = None
    turn_rewards: tuple[float, ...] | None = None
    reward_defaulted: bool = False
    metrics: Mapping[str, float] = field(default_factory=dict)
    error: str | None = None
    policy_version: int = 0
    step: int | None = None  # the training step whose batch this rollout belongs to
    created_at: float = 0.0
    finished_at: float | None = None

    @property
    def total_reward(self) -> float:
        """The scalar the group-based methods compare (sum of per-turn rewards)."""
        if self.turn_rewards is not None:
            return float(sum(self.turn_rewards))
        return float(self.reward if self.reward is not None else 0.0)


@dataclass(frozen=True)
class Group:
    """The ``group_size`` rollouts of one task started at one policy version."""

    id: str
    task_id: str
    policy_version: int
    rollouts: tuple[Rollout, ...]


@dataclass(frozen=True)
class Sample:
    """One training sequence: a rollout, or one segment of a rollout that broke its prefix.

    All ``_T`` fields have the length of ``token_ids``. ``loss_mask_T`` is 1 on
    tokens the policy generated and 0 on everything else (system, user, tool
    text, template glue). ``behaviour_logprobs_T`` and ``advantages_T`` are 0
    where the mask is 0. ``policy_version_T`` is the version that produced each
    generated token (-1 where masked).
    """

    rollout_id: str
    group_id: str
    segment: int
    token_ids_T: tuple[int, ...]
    loss_mask_T: tuple[int, ...]
    behaviour_logprobs_T: tuple[float, ...]
    advantages_T: tuple[float, ...]
    policy_version_T: tuple[int, ...]


@dataclass(frozen=True)
class RolloutSpec:
    """What an executor needs to run the agent once: the task and where to reach the coordinator."""

    rollout_id: str
    group_id: str
    task: Task
    token: str
    endpoint: str  # base URL of the coordinator, e.g. http://127.0.0.1:8731
    model_name: str
    sampling: SamplingParams
    max_turns: int
    timeout_s: float


@dataclass(frozen=True)
class RolloutOutcome:
    """What an executor saw when the agent returned (or did not)."""

    rollout_id: str
    status: RolloutStatus
    error: str | None = None


@runtime_checkable
class PolicyEngine(Protocol):
    """Generates completions token-in-token-out and serves adapter versions.

    Implementations: ``hf`` (transformers, in-process), ``vllm`` (server
    subprocess), ``scripted`` (a test double). ``tokenizer`` is a Hugging Face
    tokenizer whose chat template the endpoint renders.
    """

    name: str
    tokenizer: Any
    policy_version: int

    async def generate(self, request: GenerationRequest) -> Generation: ...

    async def load_adapter(self, path: str, version: int) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class RolloutExecutor(Protocol):
    """Runs the user's agent for one rollout: in-process, over HTTP, or on Ray."""

    async def run(self, spec: RolloutSpec) -> RolloutOutcome: ...

    async def close(self) -> None: ...


AgentFn = Callable[..., Any | Awaitable[Any]]
"""A user's agent entrypoint, called with a Task (decorated with ``mtrl_adapters.rollout``)."""


__all__ = [
    "AgentFn",
    "BreakReason",
    "Generation",
    "GenerationRequest",
    "Group",
    "PolicyEngine",
    "Rollout",
    "RolloutExecutor",
    "RolloutOutcome",
    "RolloutSpec",
    "RolloutStatus",
    "Sample",
    "SamplingParams",
    "Task",
    "ToolCall",
    "Turn",
]
