"""Context compaction captured from the wire: Strands' SummarizingConversationManager and LangChain v1's
SummarizationMiddleware, agents written as their docs teach, against the real coordinator on loopback with the
scripted policy (``_compacting_agents``). The episode stays one rollout: its summary call is a turn, the call after
it is ``compacted`` and carries the summary, and the samples of its segments share the episode's advantage."""

from __future__ import annotations

import pytest

from _adapter_support import specs
from _compacting_agents import KEYS, compacting_policy, langchain_agent, strands_agent, task
from mtrl_adapters import rollout_scope
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.algorithms import build_samples, episode_tokens
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.types import BreakReason, RolloutStatus

CONFIG = MtrlConfig.from_dict({"core": {"max_turns": 24}})

pytest.importorskip("strands")
pytest.importorskip("langchain.agents.middleware")


def _done(text: str) -> float:
    return 1.0 if "DONE" in text else 0.0


def _run_strands(handle, n: int = 1):
    return _run(handle, strands_agent(_done), n)


def _run_langchain(handle, n: int = 1, summarizer=None):
    return _run(handle, langchain_agent(_done, summarizer), n)


async def _run(handle, run, n):
    runs = specs(handle, [task(i) for i in range(n)], max_tokens=64)
    for spec in runs:
        with rollout_scope(spec):
            try:
                await run(spec.task)
            except Exception:
                pass  # recorded: the rollout's error
    return [handle.store.get_rollout(s.rollout_id) for s in runs]



def _check_compacted_episode(handle, r):
    """One completed episode over linked segments: each compacted turn carries the summary the turn before wrote,
    and the episode went on correctly from it (every key looked up once, in order)."""
    assert r.status is RolloutStatus.COMPLETED and r.reward == 1.0, (r.status, r.error)
    turns = sorted(r.turns, key=lambda t: t.index)
    compacted = [t for t in turns if t.break_reason is BreakReason.COMPACTED]
    assert len(compacted) >= 1
    assert r.summary_turns == {t.index - 1 for t in compacted}
    for t in compacted:
        writer = turns[t.index - 1]
        assert writer.completion_text.startswith("SUMMARY:")
        assert not writer.tool_calls and writer.break_reason is BreakReason.HISTORY_REWRITTEN
        assert any(writer.completion_text in str(m.get("content")) for m in t.messages)  # the summary, re-sent
        assert len(t.prompt_ids) < len(turns[t.index - 2].prompt_ids) + len(turns[t.index - 2].completion_ids) + 64
    keys = [c["function"]["arguments"] for t in turns for c in t.tool_calls]
    assert [str(k) for k in keys] == [str({"key": f"K{10 + i}"}) if isinstance(k, dict) else f'{{"key": "K{10 + i}"}}'
                                      for i, k in enumerate(keys)] and len(keys) == KEYS
    counters = handle.coordinator.counters
    assert counters["prefix_break/compacted"] == len(compacted) and counters["compactions_unattributed"] == 0
    return turns, compacted


def _check_samples(r, turns, compacted):
    """One sample per segment, every one carrying the episode's advantage (the summary turns' included); with
    the summary turns masked, their segments give no sample and the others are unchanged."""
    segments = sorted({t.segment for t in turns})
    samples = build_samples(r, [0.75] * len(turns))
    assert [s.segment for s in samples] == segments
    for sample in samples:
        trained = [a for a, m in zip(sample.advantages_T, sample.loss_mask_T) if m]
        assert trained and set(trained) == {0.75}
    # per-turn advantages cross the boundary: each turn's tokens carry its own, in whichever segment it sits
    per_turn = build_samples(r, [float(t.index) for t in turns])
    for sample in per_turn:
        carried = {a for a, m in zip(sample.advantages_T, sample.loss_mask_T) if m}
        assert carried == {float(t.index) for t in turns if t.segment == sample.segment and t.completion_ids}
    summary_segments = {turns[t.index - 1].segment for t in compacted}
    masked = build_samples(r, [0.75] * len(turns), r.summary_turns)
    assert [s.segment for s in masked] == [s for s in segments if s not in summary_segments]
    assert all(a == b for a, b in zip(masked, [s for s in samples if s.segment not in summary_segments]))
    trained, masked_figures = episode_tokens(r), episode_tokens(r, train_summary=False)
    assert trained.episode_tokens == sum(len(s.token_ids_T) for s in samples)
    assert trained.trained_tokens == sum(sum(s.loss_mask_T) for s in samples)
    assert masked_figures.trained_tokens == sum(sum(s.loss_mask_T) for s in masked)
    assert masked_figures.episode_tokens == sum(len(s.token_ids_T) for s in masked)
    assert trained.compactions == len(compacted) and all(a < b for a, b in zip(trained.tokens_after, trained.tokens_before))


async def test_strands_summarizing_conversation_manager_is_one_episode(served, tiny_tok):
    """Strands compacts on overflow: the coordinator's 400 ("maximum context length") is what its OpenAI model
    reads as ContextWindowOverflowException; the manager then summarises with the agent's own model."""
    handle = served(ScriptedEngine(tiny_tok, compacting_policy, context_length=650), CONFIG)
    [r] = await _run_strands(handle)
    turns, compacted = _check_compacted_episode(handle, r)
    assert handle.coordinator.counters["context_exceeded"] == len(compacted)  # each overflow, then its compaction
    assert all("Please summarize this conversation." in str(turns[t.index - 1].messages[-1]) for t in compacted)
    _check_samples(r, turns, compacted)


async def test_langchain_summarization_middleware_is_one_episode(served, tiny_tok):
    """LangChain v1's SummarizationMiddleware on create_agent, summarising with the agent's own chat model."""
    handle = served(ScriptedEngine(tiny_tok, compacting_policy), CONFIG)
    [r] = await _run_langchain(handle)
    turns, compacted = _check_compacted_episode(handle, r)
    assert all("Here is a summary of the conversation to date" in str(t.messages) for t in compacted)
    _check_samples(r, turns, compacted)


async def test_a_summary_no_call_of_the_rollout_wrote_is_refused_naming_the_fix(served, tiny_tok):
    """LangChain's middleware with a summarizer of the user's own (no model call): the compacted request's summary
    is nobody's turn. The call is refused with a 409 naming the fix, and the rollout fails with it: never a silent
    split of the episode."""
    handle = served(ScriptedEngine(tiny_tok, compacting_policy), CONFIG)
    [r] = await _run_langchain(handle, summarizer=lambda messages: "Earlier: some keys were looked up.")
    assert r.status is RolloutStatus.FAILED
    assert "no model call of this rollout wrote that summary" in r.error and "SummarizationMiddleware(model=" in r.error
    assert handle.coordinator.counters["compactions_unattributed"] == 1
    assert handle.coordinator.counters["prefix_break/compacted"] == 0
