"""Compaction read from the wire (``chat.find_compaction``), its figures (``algorithms.compaction``) and its trace.

The detector is pure: states and messages in, a ``Compaction`` or None out. What it must not take for a
compaction matters as much as what it must: a sliding window that only drops old messages, a retry, an agent that
quotes a reply it got, a summary call that extended the conversation instead of being a call of its own."""

from __future__ import annotations

import pytest

from mtrl_runtime.algorithms import compaction_step_metrics, episode_tokens
from mtrl_runtime.chat import Compaction, ConversationState, find_compaction, normalize_messages
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.types import BreakReason, Rollout, RolloutStatus, Turn

SYSTEM = {"role": "system", "content": "You look keys up."}
TASK = {"role": "user", "content": "Look up K10 to K13."}


def _call(key: str, n: int) -> list[dict]:
    return [{"role": "assistant", "content": "", "tool_calls": [
                {"id": f"c{n}", "type": "function", "function": {"name": "lookup", "arguments": f'{{"key": "{key}"}}'}}]},
            {"role": "tool", "tool_call_id": f"c{n}", "content": f"value-{key}"}]


HISTORY = [SYSTEM, TASK, *_call("K10", 0), *_call("K11", 1), *_call("K12", 2)]
SUMMARY = "SUMMARY: looked up K10 K11."


def _state(messages: list[dict], reply: dict, segment: int) -> ConversationState:
    [reply] = normalize_messages([reply])
    return ConversationState(messages=tuple(normalize_messages(messages)), reply=reply, tools=(), context_ids=(1, 2),
                             finish_reason="stop", segment=segment, turn_index=0, glue="")


# the main conversation up to its last reply (the K12 call), then the summary call: a request of its own
BEFORE = _state(HISTORY[:-2], HISTORY[-2], segment=0)
SUMMARY_CALL = _state([{"role": "system", "content": "Summarize."}, *HISTORY[1:6],
                       {"role": "user", "content": "Please summarize this conversation."}],
                      {"role": "assistant", "content": SUMMARY}, segment=1)


def _find(before, last, messages):
    return find_compaction(before, last, normalize_messages(messages))


@pytest.mark.parametrize("summary_message", [
    {"role": "user", "content": SUMMARY},  # Strands: the summary re-sent as a user message
    {"role": "user", "content": f"Here is a summary of the conversation to date:\n\n{SUMMARY}"},  # LangChain
    {"role": "user", "content": [{"type": "text", "text": SUMMARY.replace(" ", "\n  ")}]},  # parts, other spacing
])
def test_a_request_carrying_the_previous_call_s_summary_is_an_attributed_compaction(summary_message):
    compacted = [SYSTEM, summary_message, *HISTORY[-2:]]
    assert _find(BEFORE, SUMMARY_CALL, compacted) == Compaction(summary_at=1, attributed=True)


def test_what_is_not_a_compaction():
    window = [SYSTEM, *HISTORY[4:]]  # a sliding window: old messages dropped, nothing in their place
    assert _find(None, BEFORE, window) is None
    assert _find(None, BEFORE, HISTORY[:-2]) is None  # a retry of the same request
    quoted = [SYSTEM, TASK, {"role": "user", "content": f"You said: {SUMMARY}"}]
    same_segment = _state(HISTORY[:4], {"role": "assistant", "content": SUMMARY}, segment=0)
    # the reply was part of the conversation (the call extended it): quoting it later is no compaction
    assert _find(BEFORE, same_segment, quoted) is None
    # a reply with tool calls summarises nothing
    calling = _state(SUMMARY_CALL.messages, {**HISTORY[2]}, segment=1)
    assert _find(BEFORE, calling, [SYSTEM, {"role": "user", "content": "x"}, TASK]) is None


def test_a_summary_no_call_wrote_followed_by_the_recent_messages_is_unattributed():
    after_main = _state(HISTORY[:-2], HISTORY[-2], segment=0)  # the summary call was never seen
    compacted = [SYSTEM, {"role": "user", "content": "Earlier: some keys were looked up."}, *HISTORY[-2:]]
    found = _find(None, after_main, compacted)
    assert found is not None and not found.attributed and found.summary_at == 1
    # the same shape after a summary call whose text it does not carry: unattributed too, never silently split
    assert not _find(BEFORE, SUMMARY_CALL, compacted).attributed


def _turn(index, segment, prompt, completion, reason=None, text=""):
    return Turn("r-1", index, ({"role": "user", "content": "go"},), tuple(range(prompt)), tuple(range(completion)),
                (-0.5,) * completion, "stop", text, segment=segment, break_reason=reason, started_at=float(index))


def _compacted_rollout() -> Rollout:
    turns = (_turn(0, 0, 100, 10), _turn(1, 0, 120, 10),  # the first segment grows to 130 tokens
             _turn(2, 1, 90, 20, BreakReason.HISTORY_REWRITTEN, SUMMARY),  # the summary call
             _turn(3, 2, 60, 10, BreakReason.COMPACTED), _turn(4, 2, 80, 5))
    return Rollout("r-1", "t1", "g-1", RolloutStatus.COMPLETED, turns=turns, reward=1.0)


def test_episode_figures_per_rollout_and_per_step():
    rollout = _compacted_rollout()
    assert rollout.summary_turns == {2}
    trained = episode_tokens(rollout)
    assert (trained.compactions, trained.tokens_before, trained.tokens_after, trained.summary_tokens) == (
        1, (130,), (60,), (20,))
    assert (trained.episode_tokens, trained.trained_tokens) == (130 + 110 + 85, 55)
    masked = episode_tokens(rollout, train_summary=False)
    assert (masked.episode_tokens, masked.trained_tokens) == (130 + 85, 35)
    step = compaction_step_metrics([trained, episode_tokens(Rollout("r-2", "t1", "g-1", turns=(_turn(0, 0, 50, 50),)))])
    assert step["compaction/count"] == 1 and step["compaction/rollouts_compacted"] == 1
    assert step["compaction/tokens_before_mean"] == 130 and step["compaction/tokens_after_mean"] == 60
    assert step["samples/trained_tokens_per_episode_token"] == pytest.approx((55 + 50) / (325 + 100))


def test_the_trace_shows_the_compaction_boundary(tmp_path):
    import mlflow

    from mtrl_runtime.tracking import Tracker

    tracker = Tracker(MtrlConfig.from_dict({"core": {"run_dir": str(tmp_path / "run")},
                                            "advanced": {"summary_turns": "mask"}}))
    try:
        trace_id = tracker.write_trace(_compacted_rollout(), 0)
    finally:
        tracker.close()
    mlflow.set_tracking_uri(tracker.tracking_uri)
    trace = mlflow.get_trace(trace_id)
    spans = {s.name: s for s in trace.data.spans}
    summary = spans["llm turn 2 (compaction summary)"]
    assert summary.attributes["mtrl.compaction_summary"] is True and summary.attributes["mtrl.trained"] is False
    assert spans["compaction"].outputs == {"tokens_before": 130, "tokens_after": 60, "summary_tokens": 20,
                                           "summary_turn": 2, "segment": 2}
    assert spans["llm turn 3"].attributes["mtrl.break_reason"] == "compacted"
    assert trace.info.tags["mtrl.compactions"] == "1"
    root = next(s for s in trace.data.spans if s.parent_id is None)
    assert root.outputs["episode"]["trained_tokens"] == 35.0


def test_rescore_prepares_a_step_as_the_run_s_summary_setting_did():
    """``mtrl rescore`` reads ``advanced.summary_turns`` as the loop does: a masked run's summary turn stays out."""
    from mtrl_runtime.algorithms import AdvantageParams
    from mtrl_runtime.rescore import step_signal
    from mtrl_runtime.rollouts import GroupResult
    from mtrl_runtime.training import batch_options
    from mtrl_runtime.types import Task

    def turn(rid, index, segment, prompt, completion, reason=None):
        return Turn(rid, index, ({"role": "user", "content": "go"},), tuple(prompt), tuple(completion),
                    (-0.5,) * len(completion), "stop", "", segment=segment, break_reason=reason,
                    started_at=float(index))

    def episode(rid, reward):  # token ids that extend within each segment, as the endpoint records them
        first = list(range(1, 11))
        turns = (turn(rid, 0, 0, first, range(11, 16)), turn(rid, 1, 0, [*first, *range(11, 18)], range(18, 20)),
                 turn(rid, 2, 1, range(30, 40), range(40, 60), BreakReason.HISTORY_REWRITTEN),  # the summary call
                 turn(rid, 3, 2, range(60, 70), range(70, 75), BreakReason.COMPACTED))
        return Rollout(rid, "t1", "g-1", RolloutStatus.COMPLETED, turns=turns, reward=reward)

    good, bad = episode("r-1", 1.0), episode("r-2", 0.0)
    assert good.summary_turns == {2}
    group = GroupResult("g-1", Task("t1", "go"), (good, bad), (good, bad), dropped=False)
    trained = {}
    for setting in ("train", "mask"):
        config = MtrlConfig.from_dict({"core": {"model": "m"}, "advanced": {"summary_turns": setting}})
        assert batch_options(config)["train_summary"] is (setting == "train")
        signal = step_signal(0, [group], "group_based", AdvantageParams(), 0, 1, batch_options(config))
        trained[setting] = signal.tokens_trained
    assert trained["train"] - trained["mask"] == 2 * 20  # each rollout's 20-token summary turn
