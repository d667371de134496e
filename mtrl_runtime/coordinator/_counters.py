"""What the coordinator counts: one field per event, incremented by name, and tallies keyed by a registry name.

Every part of the coordinator and the server that counts writes a named
field (``counters.turns += 1``), so a misspelt counter is an
``AttributeError`` where it is written, not a new key nobody reads. Counts
per reason are ``Counter``s keyed by the reason's own type: a prefix break
by its ``BreakReason``, a malformed tool call by the chat format's registry
name, a rollout's end by its final ``RolloutStatus``.

Turns and tool calls are also tallied per training step (``turns_by_step``,
``tool_calls_by_step``; ``count_turns`` and ``count_tool_calls`` write both),
so a step's progress line counts its own rollouts' turns, those collected
ahead of it under asynchronous training included.

Read as a mapping under the names the heartbeat, ``/health``-style reports,
logs and tests have always read (``counters["turns"]``,
``counters["prefix_break/reply_edited"]``, ``counters["rollouts_completed"]``,
``counters["malformed_tool_calls/hermes"]``); an unknown name is a
``KeyError`` listing the known ones. Iterating yields every field's name and
each tallied key that was counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields

from ..chat.formats import CHAT_FORMATS
from ..types import BreakReason, RolloutStatus

PREFIX_BREAK = "prefix_break/"  # + BreakReason value
MALFORMED_BY_FORMAT = "malformed_tool_calls/"  # + chat format name
ROLLOUTS_ENDED = "rollouts_"  # + final RolloutStatus value


@dataclass(eq=False, slots=True)
class CoordinatorCounters(Mapping[str, int]):
    """The coordinator's counts (see the module docstring); one object per ``Coordinator``, shared with the server."""

    # rollouts
    rollouts_created: int = 0
    task_conflicts: int = 0  # a task id sent again with other content (409)
    turn_limit_hits: int = 0  # a call past max_turns ended its rollout
    rewards_defaulted: int = 0  # a rollout ended with no reward: advanced.default_reward stored
    reward_out_of_range: int = 0  # a reported reward outside advanced.reward_range (refused)
    rewards_refused: int = 0  # every reward report refused (out of range, more values than turns, after the end)
    rollouts_with_no_policy_call: int = 0  # every model call passed through: none was the policy's
    # policy calls
    turns: int = 0
    inference_calls: int = 0  # calls that name no rollout (server.inference_mode)
    forced_tool_calls: int = 0  # tool_choice required or a named function: the call opener forced
    context_exceeded: int = 0  # prompt + max_tokens over the model's context
    # a request shaped like a compaction (a summary + recent messages) whose summary no call of the rollout wrote:
    # refused, naming the fix (chat.find_compaction); the attributed ones are prefix_break/compacted
    compactions_unattributed: int = 0
    tool_calls_from_wire: int = 0  # tool calls stored from the conversation (``CompletionReport.tool_calls_from_wire``)
    background_calls: int = 0  # a harness's calls naming a background model: served, recorded, never trained
    max_tokens_clamped: int = 0  # turns served up to the cap below the max_tokens their call asked for
    engine_failures: int = 0
    streams_closed: int = 0  # the client hung up mid-stream: generation stopped, no turn recorded
    stream_divergences: int = 0  # streamed text that differs from the final reply's
    answers_unwritable: int = 0  # an answer that could not be built: the call failed, nothing recorded
    reasoning_replies: int = 0
    reasoning_tokens: int = 0
    malformed_tool_calls: int = 0  # every format's; per format in ``malformed_by_format``
    # a reference model's calls (coordinator._reference)
    reference_turns: int = 0
    reference_template_kwargs_dropped: int = 0  # the policy's template variables, not sent to another model
    # tools and other models' calls an agent reports
    tool_calls: int = 0
    tool_calls_unrecorded: int = 0  # answered in the conversation but never reported by the agent
    tool_calls_undeclared: int = 0  # a call of a tool the request did not declare
    tool_results_failed: int = 0
    model_calls_passed_through: int = 0
    # flags the agent's side reports at its end (mtrl_adapters.wire.AgentFlag), counted under their own names
    policy_calls_ambiguous: int = 0  # a model call unlike the policy's was refused (policy_models unset)
    policy_calls_inferred: int = 0  # model calls passed through beside a policy client aimed at the coordinator
    # the door: authentication and attribution
    auth_rejected: int = 0
    attribution_header_over_path: int = 0  # a rollout header named another rollout than the URL path
    compat_sigv4_accepted: int = 0  # SageMaker-compat SigV4 bearer tokens verified
    compat_reattributed: int = 0  # a SageMaker-compat call moved to the rollout that owns its conversation
    compat_stale_header_refused: int = 0  # a SageMaker-compat call refused: its messages prove its header stale
    compat_failures_without_text: int = 0  # a SageMaker-compat rollout failed with no error text
    # per reason
    prefix_breaks: Counter[BreakReason] = field(default_factory=Counter)
    malformed_by_format: Counter[str] = field(default_factory=Counter)  # key: a CHAT_FORMATS name
    rollouts_ended: Counter[RolloutStatus] = field(default_factory=Counter)  # key: a final status
    # per training step (key: the rollout's step, None outside training)
    turns_by_step: Counter[int | None] = field(default_factory=Counter)
    tool_calls_by_step: Counter[int | None] = field(default_factory=Counter)

    def count_turns(self, step: int | None, n: int) -> None:
        """``n`` policy turns of a rollout of ``step``: counted in all and for the step."""
        self.turns += n
        self.turns_by_step[step] += n

    def count_tool_calls(self, step: int | None, n: int) -> None:
        """``n`` tool calls an agent reported for a rollout of ``step``: counted in all and for the step."""
        self.tool_calls += n
        self.tool_calls_by_step[step] += n

    # -------------------------------------------------------------- read as a mapping of names
    def __getitem__(self, name: str) -> int:
        if name in _SCALARS:
            return getattr(self, name)
        tally, key = self._tallied(name)
        return tally[key]

    def __iter__(self) -> Iterator[str]:
        yield from _SCALARS
        yield from (PREFIX_BREAK + reason.value for reason in self.prefix_breaks)
        yield from (MALFORMED_BY_FORMAT + name for name in self.malformed_by_format)
        yield from (ROLLOUTS_ENDED + status.value for status in self.rollouts_ended)

    def __len__(self) -> int:
        return len(_SCALARS) + len(self.prefix_breaks) + len(self.malformed_by_format) + len(self.rollouts_ended)

    def _tallied(self, name: str) -> tuple[Counter, object]:
        """The tally a per-reason name reads and its key; an unknown name is a KeyError naming the known ones."""
        rest = name.removeprefix(PREFIX_BREAK)
        if rest != name and rest in _BREAK_REASONS:
            return self.prefix_breaks, BreakReason(rest)
        rest = name.removeprefix(MALFORMED_BY_FORMAT)
        if rest != name and rest in CHAT_FORMATS:
            return self.malformed_by_format, rest
        rest = name.removeprefix(ROLLOUTS_ENDED)
        if rest != name and rest in _FINAL_STATUSES:
            return self.rollouts_ended, RolloutStatus(rest)
        raise KeyError(
            f"unknown coordinator counter {name!r}; known: {', '.join(_SCALARS)}, "
            f"{PREFIX_BREAK}<{'|'.join(sorted(_BREAK_REASONS))}>, "
            f"{MALFORMED_BY_FORMAT}<{'|'.join(CHAT_FORMATS.names())}>, "
            f"{ROLLOUTS_ENDED}<{'|'.join(sorted(_FINAL_STATUSES))}>"
        )


_SCALARS: tuple[str, ...] = tuple(f.name for f in fields(CoordinatorCounters) if f.type == "int")
_BREAK_REASONS = frozenset(reason.value for reason in BreakReason)
_FINAL_STATUSES = frozenset(status.value for status in RolloutStatus if status.is_final)

__all__ = ["CoordinatorCounters"]
