"""The coordinator's counters: named fields written by name, per-reason tallies keyed by their own type.

They read back under the names the heartbeat, logs and the other tests read
(``counters["turns"]``, ``counters["prefix_break/reply_edited"]``); a name
nobody writes is an error, on write and on read.
"""

from __future__ import annotations

import pytest

from mtrl_runtime.chat.formats import CHAT_FORMATS
from mtrl_runtime.coordinator import CoordinatorCounters
from mtrl_runtime.rollouts import Heartbeat, RolloutTally
from mtrl_runtime.types import BreakReason, RolloutStatus

# every name the coordinator and the server counted under as string keys, before they were fields
NAMES = [
    "turn_limit_hits", "forced_tool_calls", "inference_calls", "turns", "reference_template_kwargs_dropped",
    "reference_turns", "context_exceeded", "streams_closed", "engine_failures", "reasoning_replies",
    "reasoning_tokens", "malformed_tool_calls", "compat_reattributed", "tool_calls", "model_calls_passed_through",
    "rollouts_with_no_policy_call", "reward_out_of_range", "task_conflicts", "rollouts_created", "auth_rejected",
    "tool_calls_unrecorded", "tool_calls_undeclared", "tool_results_failed", "rewards_defaulted",
    "compat_sigv4_accepted", "compat_failures_without_text", "attribution_header_over_path", "stream_divergences",
    # added with the attribution fixes (issue 47): a stale SageMaker header refused, the agent side's two flags
    "compat_stale_header_refused", "policy_calls_ambiguous", "policy_calls_inferred",
    "background_calls", "max_tokens_clamped", "tool_calls_from_wire",
    # added with the server's bounds (issue 47): answers that could not be written, reward reports refused
    "answers_unwritable", "rewards_refused",
    # added with context compaction (issue 43): a compaction whose summary no call of the rollout wrote, refused
    "compactions_unattributed",
]


def test_every_counter_is_a_field_that_starts_at_zero_and_reads_back_by_its_name():
    counters = CoordinatorCounters()
    assert sorted(counters) == sorted(NAMES)  # nothing tallied per reason yet
    assert all(counters[name] == 0 for name in NAMES)
    counters.turns += 3
    counters.reasoning_tokens += 17
    assert counters["turns"] == 3 and counters["reasoning_tokens"] == 17 and counters.get("turns", 0) == 3


def test_a_misspelt_counter_fails_where_it_is_written_and_where_it_is_read():
    counters = CoordinatorCounters()
    with pytest.raises(AttributeError):
        counters.turnz += 1  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        counters.turnz = 1  # type: ignore[attr-defined]
    with pytest.raises(KeyError, match="unknown coordinator counter 'turnz'; known: .*turns"):
        counters["turnz"]
    assert counters.get("turnz") is None


def test_per_reason_tallies_are_keyed_by_their_type_and_read_under_the_old_names():
    counters = CoordinatorCounters()
    counters.prefix_breaks[BreakReason.REPLY_EDITED] += 1
    counters.malformed_by_format["hermes"] += 2
    counters.rollouts_ended[RolloutStatus.TIMED_OUT] += 1
    assert counters["prefix_break/reply_edited"] == 1 and counters["prefix_break/tools_changed"] == 0
    assert counters["malformed_tool_calls/hermes"] == 2 and counters["malformed_tool_calls/mistral"] == 0
    assert counters["rollouts_timed_out"] == 1 and counters["rollouts_completed"] == 0
    tallied = [name for name in counters if "/" in name or name.startswith("rollouts_") and name not in NAMES]
    assert tallied == ["prefix_break/reply_edited", "malformed_tool_calls/hermes", "rollouts_timed_out"]
    assert len(counters) == len(NAMES) + 3


@pytest.mark.parametrize("name", ["prefix_break/nope", "malformed_tool_calls/nope", "rollouts_running",
                                  "rollouts_nope"])
def test_a_per_reason_name_outside_its_registry_is_an_error_naming_the_known_ones(name):
    with pytest.raises(KeyError) as info:
        CoordinatorCounters()[name]
    message = str(info.value)
    assert repr(name) in message and "reply_edited" in message and "timed_out" in message
    assert all(fmt in message for fmt in CHAT_FORMATS.names())


def test_the_heartbeat_reads_the_counters_as_a_mapping():
    counters = CoordinatorCounters()
    counters.count_turns(None, 5)  # before the step, outside training: not this step's
    beat = Heartbeat(RolloutTally(), counters, print, every_s=3600)
    beat.mark("step 1/2", key=0)
    counters.count_turns(0, 4)
    counters.count_tool_calls(0, 2)
    assert "turns 4, tool calls 2" in beat.line()
    assert counters["turns"] == 9 and counters["tool_calls"] == 2  # in all, as before


def test_a_step_collected_ahead_counts_its_own_turns_and_tool_calls():
    # asynchronous training collects step 2's rollouts while step 1 updates: when step 2 is marked, its rollouts
    # may all be done already; its line counts their turns, not the turns since the mark (it read "turns 0")
    counters, tally = CoordinatorCounters(), RolloutTally()
    beat = Heartbeat(tally, counters, print, every_s=3600)
    beat.mark("step 1/2", key=0)
    tally.plan(0, 2)
    tally.plan(1, 2)
    counters.count_turns(0, 3)
    counters.count_turns(1, 7)  # step 2's rollouts, ahead
    counters.count_tool_calls(1, 4)
    for step in (0, 0, 1, 1):
        tally.record(step, RolloutStatus.COMPLETED)
    assert beat.line().startswith("step 1/2: rollouts 2/2 done, turns 3, tool calls 0, errors 0")
    beat.mark("step 2/2", key=1)
    assert beat.line().startswith("step 2/2: rollouts 2/2 done, turns 7, tool calls 4, errors 0")
    beat.mark("evaluation", key=None)  # outside steps: what was counted since the mark
    counters.count_turns(None, 2)
    assert beat.line().startswith("evaluation: rollouts 0/0 done, turns 2, tool calls 0")


def test_every_flag_the_agent_side_reports_has_its_own_counter():
    """The coordinator counts an agent's flags (``CompletionReport.flags``) under their own names."""
    import typing

    from mtrl_adapters.wire import AgentFlag

    counters = CoordinatorCounters()
    for flag in typing.get_args(AgentFlag):
        assert counters[flag] == 0
