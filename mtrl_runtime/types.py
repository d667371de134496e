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

import asyncio
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import (
    Any, AsyncIterator, Awaitable, Callable, Literal, Mapping, Protocol, Sequence, TypeVar, Union, runtime_checkable,
)

JSON = Any  # a value that round-trips through json.dumps / json.loads
R = TypeVar("R")  # what a function handed to an engine returns


class RolloutStatus(str, enum.Enum):
    """Where a rollout is in its life; every status but RUNNING is final."""

    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    INTERRUPTED = "interrupted"  # the run stopped (Ctrl-C, SIGTERM, a crash) before the rollout ended
    ABANDONED = "abandoned"  # mtrl serve: nothing came for the rollout within advanced.server.rollout_ttl_s

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
    # history: deployed, and the template renders the previous reply unlike the ids generated (dropped reasoning, ...)
    REPLY_RENDERED_DIFFERENTLY = "reply_rendered_differently"
    # the request's chat_template_kwargs (e.g. enable_thinking) differ from the previous turn's
    TEMPLATE_KWARGS_CHANGED = "template_kwargs_changed"
    # the agent compacted its context: the history is the summary the turn just before wrote (a model call of its
    # own) + the recent messages. The episode goes on in a new segment, linked to the old one (``Rollout.summary_turns``)
    COMPACTED = "compacted"


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
    max_tokens_requested: bool = False  # the client named max_tokens: over the context it is a 400, never shortened
    max_tokens_asked: int | None = None  # set: the client asked for this many, above the cap; served up to max_tokens


@dataclass(frozen=True)
class ChatOptions:
    """A chat call's settings beyond sampling: template variables and which tool call, if any, is required.

    ``template_kwargs`` is the request's ``chat_template_kwargs`` (e.g.
    ``{"enable_thinking": False}``). ``tool_choice`` is ``"auto"``,
    ``"required"`` (some tool must be called) or ``"function"`` (the tool
    ``tool_name`` must be called); ``"none"`` never reaches the coordinator
    (the endpoint drops the tools). ``token_ids``: the caller asked for token
    ids or logprobs back (a reference model's turn has none: such a call is refused).
    """

    template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    tool_choice: Literal["auto", "required", "function"] = "auto"
    tool_name: str | None = None
    token_ids: bool = False
    unserved_tools: tuple[str, ...] = ()  # tools the call declared that the policy is not offered (Responses' hosted)
    model: str | None = None  # the model the call named (a background model's calls are not the policy's)
    protocol: str | None = None  # the SDK family it came in by (openai, anthropic, bedrock): recorded with them


@dataclass(frozen=True)
class GenerationRequest:
    """Token-in: what the endpoint asks an engine for.

    ``adapter`` names the policy version whose weights must produce the
    tokens (None: the engine's current one). ``rollout_id`` and
    ``turn_index`` are for engines that need them (the scripted double, routing).
    ``stop_token_ids`` end the completion besides the engine's own eos: the
    chat format's stop tokens (gpt-oss ``<|call|>`` / ``<|return|>``, Llama
    ``<|eom_id|>``, ...); the stop id is the completion's last id, finish "stop".
    ``base_model``: produce the tokens with the engine's adapter switched off
    (the base model it was trained from), beside requests that use it; only
    an engine that ``MixesBaseRows`` takes it (others refuse it).
    ``role``: produce the tokens with that role's adapter (``roles``); only an
    engine that ``ServesRoles`` takes it.
    """

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams
    adapter: int | None = None
    rollout_id: str | None = None
    turn_index: int = 0
    stop_token_ids: frozenset[int] = frozenset()
    base_model: bool = False
    role: str | None = None  # the role whose adapter produces the tokens (``roles``); None: the one policy


@dataclass(frozen=True)
class Generation:
    """Token-out: ids and the behaviour logprob of each sampled id.

    ``finish_reason`` is "stop" (an eos or stop string was produced) or
    "length" (max_tokens reached). ``top_logprobs_T`` holds, per token, the
    top alternatives as (token_id, logprob) pairs when they were asked for.
    ``policy_version`` is the version that produced the first token;
    ``token_versions`` the version that produced each token when they differ
    (a partial rollout: new weights published while the turn was generated),
    None when every token is ``policy_version``'s.
    """

    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str
    policy_version: int = 0
    top_logprobs_T: tuple[tuple[tuple[int, float], ...], ...] | None = None
    token_versions: tuple[int, ...] | None = None


@dataclass(frozen=True)
class ChatResult:
    """One answered model call in the chat shape every wire protocol translates from: the OpenAI assistant
    ``message`` (content, ``tool_calls``, ``reasoning_content``), its ``finish_reason`` (``stop``, ``length``,
    ``tool_calls``, ``content_filter``), the prompt's ids and the generation behind it."""

    message: dict[str, Any]
    finish_reason: str
    prompt_ids: tuple[int, ...]
    generation: Generation
    completion_text: str


@dataclass(frozen=True)
class TokenDelta:
    """Token-out as it is decoded: the ids sampled since the previous delta and their behaviour logprobs.

    A ``StreamingEngine`` yields these while it generates; concatenated, they
    are the final ``Generation``'s ``completion_ids`` and ``logprobs``.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


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
    # where the tool ran: None for the agent's own tool (a function in its process); "mcp:<server>" for a tool an
    # MCP server served (the server's name as the framework knows it), "mcp" when the server's name is not known
    source: str | None = None


@dataclass(frozen=True)
class ModelCall:
    """A model call that was not the policy's (a judge, a planner): passed through, recorded, never trained on."""

    rollout_id: str
    protocol: str  # openai | anthropic | bedrock
    model: str | None = None
    latency_s: float = 0.0
    started_at: float = 0.0
    input_tokens: int | None = None
    output_tokens: int | None = None
    stream: bool = False
    status: str = "success"  # "success" | "error"
    error: str | None = None


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
    # the reply's reasoning as its format parsed it (``reasoning_content``; None: none, or a schema-1 store's turn)
    # and its length in tokens as the tokenizer splits that text (counted in the training and evaluation metrics)
    reasoning: str | None = None
    reasoning_tokens: int = 0
    # None: the policy wrote it (the ids above are what the engine saw and sampled). A name: a reference model
    # behind a closed endpoint wrote it, passed through by the coordinator (an evaluation's reference side); such a
    # turn has no token ids and is never trained on: consumers that need ids refuse it (``algorithms.samples``)
    model: str | None = None
    # the policy version that produced each completion id, when they differ (a partial rollout: new weights were
    # published while the turn was generated; ``policy_version`` is then the first token's). None: every id is
    # ``policy_version``'s (a turn within one version, or a turn of a store before schema 5)
    token_versions: tuple[int, ...] | None = None
    # the role whose model id the call named (``advanced.policy_models`` as a mapping, ``roles``); None: one policy
    role: str | None = None

    @property
    def versions_T(self) -> tuple[int, ...]:
        """The policy version that produced each completion id (one per ``completion_ids``)."""
        if self.token_versions is not None:
            return self.token_versions
        return (self.policy_version,) * len(self.completion_ids)


ROLE_REWARD_PREFIX = "role_reward/"
"""A rollout's metric ``role_reward/<role>`` holds that role's own reward (``Rollout.role_rewards``)."""


# The metrics the coordinator itself adds to a rollout as it ends (a count, or 1.0 for yes; the policy_calls_* ones
# as the agent's adapter reports them): what the run did not see or could not do, shown wherever a rollout is
# summarised (``mtrl collect`` lines, the trainer's ``rollout/flagged/<flag>``). Every other metric is the reward's.
ROLLOUT_FLAGS = (
    "reward_defaulted",  # the agent reported no reward: it got the configured default
    "hit_turn_limit",  # the rollout reached its max_turns
    "tool_calls_unrecorded",  # tool calls the model's results show ran, beyond those the adapter reported
    "tool_calls_undeclared",  # calls to a tool name the request did not declare (refused, no tool ran)
    "tool_results_failed",  # tool results the wire marked failed (Anthropic is_error, Bedrock status error)
    "policy_calls_ambiguous",  # a model call unlike the policy's, policy_models unset: refused (mtrl_adapters._policy_rule)
    "policy_calls_inferred",  # model calls passed through beside a policy client aimed at the coordinator (the same)
    "trajectory_header_stale",  # a reply reached an agent naming another rollout (SageMaker compat, coordinator._owner)
    "hosted_tools_unserved",  # calls that declared hosted tools (Responses' web_search, ...) the policy was not offered
    "max_tokens_clamped",  # turns whose max_tokens was above the cap, served up to it (advanced.server.max_tokens_over_cap)
    "tripwire_tripped",  # trips of advanced.tripwires (each wire's own count: tripwire/<name>; tripwires.TripwireWatch)
)


@dataclass(frozen=True)
class Rollout:
    """One episode of the agent on one task.

    Exactly one of ``reward`` and ``turn_rewards`` is set once the agent has
    reported; ``reward_defaulted`` marks a rollout that never reported and
    got the configured default. ``metrics`` holds the reward's metrics and
    the coordinator's flags (``ROLLOUT_FLAGS``).
    """

    id: str
    task_id: str
    group_id: str
    status: RolloutStatus = RolloutStatus.RUNNING
    turns: tuple[Turn, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    model_calls: tuple[ModelCall, ...] = ()  # non-policy calls (ModelCall): the trace only, never samples
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
    def role_rewards(self) -> dict[str, float]:
        """Each role's own reward where the agent reported one (``update_reward(..., role_rewards=...)``), kept in
        ``metrics`` as ``role_reward/<role>``; a role left out is rewarded with the episode's (``roles.role_view``)."""
        return {name[len(ROLE_REWARD_PREFIX):]: float(value) for name, value in self.metrics.items()
                if name.startswith(ROLE_REWARD_PREFIX)}

    @property
    def total_reward(self) -> float:
        """The scalar the group-based methods compare (sum of per-turn rewards)."""
        if self.turn_rewards is not None:
            return float(sum(self.turn_rewards))
        return float(self.reward if self.reward is not None else 0.0)

    @property
    def summary_turns(self) -> frozenset[int]:
        """Indexes of the turns that wrote a compaction's summary: each one just before a ``COMPACTED`` turn."""
        return frozenset(t.index - 1 for t in self.turns if t.break_reason is BreakReason.COMPACTED)

    @property
    def flags(self) -> tuple[str, ...]:
        """The :data:`ROLLOUT_FLAGS` this rollout carries, in that order."""
        carried = {f for f in ROLLOUT_FLAGS if self.metrics.get(f)} | ({"reward_defaulted"} if self.reward_defaulted else set())
        return tuple(f for f in ROLLOUT_FLAGS if f in carried)


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
    role: str | None = None  # the role whose adapter these tokens train (``roles``); None: the one policy


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
    policy_models: tuple[str, ...] | None = None  # advanced.policy_models; None: mtrl_adapters._policy_rule's


@dataclass(frozen=True)
class RolloutHandle:
    """What the creator of a rollout hands to whoever runs the agent: its id, its secret token, its group."""

    rollout_id: str
    token: str
    group_id: str
    task: Task


@dataclass(frozen=True)
class RolloutOutcome:
    """What an executor saw when the agent returned (or did not)."""

    rollout_id: str
    status: RolloutStatus
    error: str | None = None


# ---------------------------------------------------------------- a rollout's end, as typed events
# Whoever learns something about a rollout's end tells the coordinator with one
# of these (``RolloutCoordinator.end``); only the coordinator's state machine
# turns them into the final status and the default reward.


@dataclass(frozen=True)
class RewardReported:
    """The agent's reward was recorded."""


@dataclass(frozen=True)
class TurnLimitHit:
    """The agent asked for one turn more than ``max_turns`` allows (the call was refused)."""


@dataclass(frozen=True)
class AgentEnded:
    """The agent's side reports how the agent ended; ``awaits_reward``: end only once the reward is in."""

    status: RolloutStatus
    error: str | None = None
    awaits_reward: bool = False


@dataclass(frozen=True)
class ExecutorEnded:
    """The executor returned for this rollout; a status that is not final counts as a failure."""

    status: RolloutStatus
    error: str | None = None


@dataclass(frozen=True)
class DeadlinePassed:
    """The rollout ran past its deadline of ``limit_s`` seconds."""

    limit_s: float


@dataclass(frozen=True)
class RunStopped:
    """The run stopped (was cancelled) while the rollout was running: it ends ``interrupted``."""

    reason: str = "cancelled: the run stopped before the rollout ended"


@dataclass(frozen=True)
class Abandoned:
    """Nothing came for the rollout (no call, no report) for ``ttl_s`` seconds (``mtrl serve``'s TTL sweeper)."""

    ttl_s: float


@dataclass(frozen=True)
class AttributionBroken:
    """A model call proved that a reply recorded on this rollout reached an agent naming another rollout: its turns
    cannot be vouched for, so it ends failed with ``reason``, flagged ``flag`` in its metrics."""

    reason: str
    flag: str


RolloutEvent = Union[
    RewardReported, TurnLimitHit, AgentEnded, ExecutorEnded, DeadlinePassed, RunStopped, Abandoned, AttributionBroken
]


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
    context_length: int | None  # tokens of prompt + completion the model takes (None: unbounded or not known yet)

    async def generate(self, request: GenerationRequest) -> Generation: ...

    async def load_adapter(self, path: str, version: int) -> None: ...

    async def close(self) -> None: ...


@runtime_checkable
class SharedModelEngine(PolicyEngine, Protocol):
    """An engine an in-process trainer can train through: it serves the very model object the trainer updates.

    The trainer changes ``model``'s weights while holding ``weights_lock``
    (every forward pass of the engine holds it), then calls
    ``set_policy_version``; all of it runs on the engine's worker thread
    through ``on_worker`` / ``on_worker_sync``. ``lora_fold`` is the engine's
    LoRA folding (its ``unfolded()`` context gives the weights as peft
    computes them), or None for an engine that does not fold. Implementation:
    ``hf``.
    """

    model: Any
    weights_lock: Any  # a threading.RLock
    lora_fold: Any

    def set_policy_version(self, version: int) -> None:
        """Record that the shared weights now are policy ``version``."""

    async def on_worker(self, fn: Callable[[], R], *, drain: bool = False) -> R:
        """Run ``fn()`` on the engine's worker thread between forward passes; its result or its error.

        ``drain``: only once no generation is in flight, starting none meanwhile (a weight change then
        never reaches a turn being generated); otherwise a turn in flight continues under the new weights,
        each token labelled with the version that produced it (``Generation.token_versions``).
        """

    def on_worker_sync(self, fn: Callable[[], R]) -> R:
        """``on_worker`` for a caller outside an event loop: blocks until ``fn`` ran."""


@runtime_checkable
class MixesBaseRows(Protocol):
    """An engine that serves ``GenerationRequest.base_model`` requests with its adapter switched off for
    those rows only, in the same batches as requests that use it (an evaluation's base and fine-tuned
    sides at once). ``mixes_base_rows()``: whether it can now (it holds an adapter of a kind it can switch
    off per row). Such rows report policy version 0, as the base model. Implementation: ``hf``."""

    def mixes_base_rows(self) -> bool: ...


@runtime_checkable
class ServesRoles(Protocol):
    """An engine that serves ``GenerationRequest.role`` requests with that role's LoRA adapter (``roles``):
    ``serves_roles()`` names the roles it can serve now. ``hf`` holds every role's adapter on one base and decodes
    rows of different roles in one batch."""

    def serves_roles(self) -> frozenset[str]: ...


@runtime_checkable
class LoadsRoleAdapters(Protocol):
    """An engine that receives each role's adapter as a folder, each version loaded by the role's name
    (``vllm``: ``<role>-v<version>``); the trainer pushes every role's adapter after each update."""

    async def load_role_adapters(self, paths: Mapping[str, str], version: int) -> None: ...


@runtime_checkable
class StreamingEngine(PolicyEngine, Protocol):
    """An engine that hands out tokens as it decodes them (``hf``, ``scripted``, ``vllm``).

    ``generate_stream`` yields ``TokenDelta``s as tokens are sampled and, last,
    the complete ``Generation`` (equal to what ``generate`` returns for the
    same request: same ids, logprobs and finish reason). Closing the iterator
    early (``aclose``, or cancelling its consumer) stops the generation.
    Engines without it answer a streamed call in one burst.
    """

    def generate_stream(self, request: GenerationRequest) -> AsyncIterator[TokenDelta | Generation]: ...


@runtime_checkable
class NamesServedModel(Protocol):
    """An engine that serves something other than ``core.model`` (the scripted double) and says what, for /health."""

    served_model: str


@runtime_checkable
class RecordsTrips(Protocol):
    """A coordinator that watches ``advanced.tripwires`` and keeps each tripped rollout's trips (``tripwires.Trip``)."""

    def tripwire_trips(self, rollout_id: str) -> Sequence[Any]: ...


@runtime_checkable
class MeasuresTemplateDrift(Protocol):
    """A coordinator that can re-render recorded rollouts as deployment would (the endpoint's own ``Coordinator``).

    ``template_drift`` is the fraction of the rollouts' trained tokens that
    differ from that rendering (``mtrl check template``'s figure).
    """

    def template_drift(self, rollouts: Sequence[Rollout]) -> float: ...


@runtime_checkable
class RolloutExecutor(Protocol):
    """Runs the user's agent for one rollout: in-process, over HTTP, or on Ray."""

    async def run(self, spec: RolloutSpec) -> RolloutOutcome: ...

    async def close(self) -> None: ...


# ---------------------------------------------------------------- sandboxes: where a rollout's code runs
# One per rollout, from the ``mtrl_runtime.sandboxes`` registry (bubblewrap,
# docker, podman, tempdir); agents' tools, harness CLIs and verifiers run
# their commands through it. docs/sandboxes.md says what each kind enforces.


@dataclass(frozen=True)
class CommandResult:
    """What one command in a sandbox did: its exit, its output (capped), and why it stopped.

    ``exit_code`` is None when the command was killed at its timeout or the
    sandbox's deadline (``timed_out``); a negative code is the signal that
    ended it otherwise (a CPU or file-size limit). Output past the sandbox's
    cap was read and thrown away: ``stdout_dropped`` / ``stderr_dropped``
    bytes, so flooding costs the caller nothing and is still reported.
    """

    argv: tuple[str, ...]
    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    stdout_dropped: int = 0
    stderr_dropped: int = 0
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    @property
    def truncated(self) -> bool:
        return bool(self.stdout_dropped or self.stderr_dropped)

    def describe(self) -> str:
        """One line for a log or a tool result: how it ended, and what output was dropped."""
        if self.timed_out:
            ended = f"killed at its deadline after {self.duration_s:.1f} s"
        elif self.exit_code is not None and self.exit_code < 0:
            ended = f"killed by signal {-self.exit_code}"
        else:
            ended = f"exit {self.exit_code}"
        if self.truncated:
            ended += f"; output over the cap dropped ({self.stdout_dropped} bytes of stdout, " \
                     f"{self.stderr_dropped} of stderr)"
        return ended


@runtime_checkable
class SandboxProcess(Protocol):
    """A long-lived process inside a sandbox (a harness CLI, an MCP server), with pipes to it.

    ``stdin`` / ``stdout`` / ``stderr`` are asyncio streams (None where not
    piped). ``output`` reads both outputs up to the sandbox's cap until the
    process exits or ``timeout_s`` passes (then kills it). ``kill`` ends the
    whole process tree; the sandbox kills whatever is left at its deadline
    and when it closes.
    """

    argv: tuple[str, ...]
    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader | None
    stderr: asyncio.StreamReader | None

    @property
    def returncode(self) -> int | None: ...

    async def wait(self, timeout_s: float | None = None) -> int | None: ...

    async def output(self, timeout_s: float | None = None) -> CommandResult: ...

    async def kill(self) -> None: ...


@runtime_checkable
class Sandbox(Protocol):
    """One rollout's isolated place to run code, removed with everything in it by ``close``.

    ``workdir`` is the workspace as commands inside see it (``/workspace``
    in the namespace and container kinds); ``host_workspace`` is where it
    lives on this machine (write there only before anything ran inside:
    afterwards a sandboxed process may have planted links; the file methods
    go through the sandbox and are safe). ``coordinator_url`` is how code
    inside reaches the coordinator, the one address it may reach (None: no
    network at all). A string command runs with ``sh -c``; a sequence runs
    as is. Paths are relative to ``workdir`` unless absolute.

    Example::

        async with Sandboxes({"kind": "bubblewrap"}).sandbox("r1") as box:
            await box.write_file("a.py", "print(6 * 7)")
            result = await box.run(["python3", "a.py"], timeout_s=10)
            assert result.stdout == "42\n"
    """

    kind: str
    name: str
    workdir: str
    host_workspace: Path
    coordinator_url: str | None

    async def run(
        self, command: str | Sequence[str], *, timeout_s: float | None = None, stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None, cwd: str | None = None,
    ) -> CommandResult: ...

    async def start(
        self, command: str | Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None,
    ) -> SandboxProcess: ...

    async def read_file(self, path: str) -> bytes: ...

    async def write_file(self, path: str, data: bytes | str) -> None: ...

    async def list_files(self, path: str = ".") -> list[str]: ...

    async def close(self) -> None: ...


@runtime_checkable
class GroupRescorer(Protocol):
    """Rewards a training step's finished group anew (a group judge) before advantages are computed.

    ``rescore`` stores each rollout's new reward (the store's record is what
    counts) and returns the group's rollouts as stored now, in the given order;
    it raises rather than leave a rollout with a reward it did not give.
    """

    async def rescore(self, task: Task, rollouts: Sequence[Rollout]) -> Sequence[Rollout]: ...


@runtime_checkable
class RunTracker(Protocol):
    """Where a run's records go besides its store (MLflow: ``tracking.Tracker``; none: ``tracking.NullTracker``).

    ``run_id`` and ``tracking_uri`` are None when nothing is tracked.
    ``log_rollouts`` may return before the rollouts are written (traces go
    out in the background); ``close`` writes what is queued and ends the run.
    """

    run_id: str | None
    tracking_uri: str | None

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def log_rollouts(self, rollouts: Sequence[Rollout], step: int) -> None: ...

    def log_artifacts(self, folder: str | Path, artifact_path: str) -> None: ...

    def set_tag(self, key: str, value: str) -> None: ...

    def close(self, status: str = "FINISHED") -> None: ...


@runtime_checkable
class RolloutCoordinator(Protocol):
    """What the rollout dispatcher, the evaluation and the server may call on the coordinator, and nothing else.

    ``chat`` answers and records one model call; ``create_rollout`` opens a
    rollout (thread-safe); ``end`` feeds an end event; ``recorded`` reads a
    rollout back as the store holds it.
    """

    @property
    def model_name(self) -> str: ...

    @property
    def policy_version(self) -> int: ...

    def create_rollout(
        self, task: Task, group_id: str | None = None, *, step: int | None = None, max_turns: int | None = None,
        base_model: bool = False, seed: int | None = None,
    ) -> RolloutHandle: ...

    async def chat(
        self,
        rollout_id: str | None,
        token: str | None,
        messages: list[Mapping[str, JSON]],
        tools: list[Mapping[str, JSON]] | None,
        sampling: SamplingParams,
        options: ChatOptions | None = None,
    ) -> Any: ...

    async def end(self, rollout_id: str, event: RolloutEvent) -> bool: ...

    def recorded(self, rollout_id: str, with_turns: bool = True) -> Rollout | None: ...

    def live_rollout_ids(self) -> list[str]: ...


@runtime_checkable
class TrajectoryStore(Protocol):
    """Everything a run records: tasks, rollouts, turns, tool calls, training history, checkpoint meta.

    The methods the runtime calls. A write returns (or its ``a``-prefixed
    async twin resolves) once it is durable; a write the store refuses (a bad
    value, an unknown id, a turn for a finished rollout, a trained rollout
    changed) raises ValueError naming the field and changes nothing.
    Implementations: ``SQLiteStore`` (``mtrl_runtime.store``), the in-memory
    test double ``MemoryStore``; ``mtrl_runtime.store.open_store`` builds one by name.
    """

    def put_task(self, task: Task) -> None:
        """Record a task; a task already recorded under the same id is replaced."""

    def create_rollout(self, rollout: Rollout, token_hash: str) -> None:
        """A new rollout of a recorded task; ``token_hash`` is the sha256 hex of its bearer token."""

    async def aadd_turn(self, turn: Turn) -> None:
        """A turn of a running rollout; its index must be new to the rollout."""

    async def aadd_tool_call(self, call: ToolCall) -> int:
        """A tool call of a rollout not yet trained; returns its sequence number in the rollout."""

    async def aadd_model_call(self, call: ModelCall) -> int:
        """A non-policy model call of a rollout not yet trained; returns its sequence number in the rollout."""

    async def aset_reward(
        self,
        rollout_id: str,
        reward: float | None = None,
        turn_rewards: Sequence[float] | None = None,
        metrics: Mapping[str, float] | None = None,
        defaulted: bool = False,
    ) -> bool:
        """Exactly one of ``reward`` / ``turn_rewards``; a ``defaulted`` one only if none was reported."""

    def finish_rollout(self, rollout_id: str, status: RolloutStatus | str, error: str | None = None) -> bool:
        """Give a running rollout its final status; False (nothing changed) if it had one."""

    async def afinish_rollout(self, rollout_id: str, status: RolloutStatus | str, error: str | None = None) -> bool:
        """``finish_rollout`` from an event loop."""

    def mark_trained(self, rollout_ids: Sequence[str], step: int) -> None:
        """Record that update ``step`` consumed these final rollouts: all or nothing, never twice."""

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append training metrics of ``step`` to the history."""

    def set_meta(self, key: str, value: JSON) -> None:
        """Store a JSON value under ``key`` (checkpoint data: step counter, run ids...)."""

    def flush(self) -> None:
        """Block until every write made so far is durable."""

    def get_task(self, task_id: str) -> Task | None:
        """The recorded task, or None."""

    def get_rollout(self, rollout_id: str, with_turns: bool = True) -> Rollout | None:
        """The rollout (with its turns and tool calls unless ``with_turns`` is False), or None."""

    def rollouts(
        self,
        step: int | None = None,
        status: RolloutStatus | str | None = None,
        group_id: str | None = None,
        untrained_only: bool = False,
        with_turns: bool = True,
    ) -> list[Rollout]:
        """Rollouts matching every filter given, in creation order."""

    def count_turns(self, rollout_id: str) -> int:
        """How many turns the rollout has recorded."""

    def count_tool_calls(self, rollout_id: str) -> int:
        """How many tool calls the rollout has recorded."""

    def token_hash(self, rollout_id: str) -> str | None:
        """The sha256 of the rollout's bearer token, or None for an unknown rollout."""

    def trained_step(self, rollout_id: str) -> int | None:
        """The update step that consumed the rollout, None if not trained yet; an unknown id raises ValueError."""

    def metric_history(self, name: str | None = None) -> list[tuple[int, str, float]]:
        """``(step, name, value)`` in step order, of one metric or of all."""

    def get_meta(self, key: str, default: JSON = None) -> JSON:
        """The JSON value stored under ``key``, or ``default``."""

    def export_jsonl(self, path: str | Path, step: int | None = None) -> int:
        """One JSON line per rollout (of ``step``, if given); returns how many were written."""

    def close(self) -> None:
        """Make every write durable and release the store; idempotent."""


AgentFn = Callable[..., Any | Awaitable[Any]]
"""A user's agent entrypoint, called with a Task (decorated with ``mtrl_adapters.rollout``)."""


__all__ = [
    "LoadsRoleAdapters",
    "ROLE_REWARD_PREFIX",
    "ServesRoles",
    "Abandoned",
    "AgentEnded",
    "AgentFn",
    "AttributionBroken",
    "BreakReason",
    "ChatOptions",
    "ChatResult",
    "CommandResult",
    "DeadlinePassed",
    "ExecutorEnded",
    "Generation",
    "GenerationRequest",
    "GroupRescorer",
    "MixesBaseRows",
    "ModelCall",
    "NamesServedModel",
    "PolicyEngine",
    "ROLLOUT_FLAGS",
    "RewardReported",
    "Rollout",
    "RolloutCoordinator",
    "RolloutEvent",
    "RolloutExecutor",
    "RolloutHandle",
    "RolloutOutcome",
    "RolloutSpec",
    "RolloutStatus",
    "RunStopped",
    "RunTracker",
    "Sample",
    "SamplingParams",
    "Sandbox",
    "SandboxProcess",
    "SharedModelEngine",
    "StreamingEngine",
    "Task",
    "TokenDelta",
    "ToolCall",
    "TrajectoryStore",
    "Turn",
    "TurnLimitHit",
]
