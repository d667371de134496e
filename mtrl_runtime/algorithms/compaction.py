"""What a rollout's context compactions cost and kept: figures per rollout and per step.

A compaction (``BreakReason.COMPACTED``) links two segments of one episode:
the turn before it wrote the summary, the compacted turn goes on from the
summary + the recent messages. Per compaction: ``tokens_before`` is the
context the episode had reached (the prompt + completion of the last turn
before the summary call), ``tokens_after`` the compacted turn's prompt,
``summary_tokens`` what the summary turn generated.

``episode_tokens`` counts the tokens of the rollout's training sequences
(one per segment with a trained turn: its last turn's prompt + completion,
what ``build_samples`` makes) and ``trained_tokens`` those under the loss mask. Their ratio,
trained tokens per episode token, is what a compaction costs the update: the
summary call re-reads the history it summarises, and each segment re-reads
its prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from ..types import BreakReason, Rollout


@dataclass(frozen=True)
class EpisodeTokens:
    """One rollout's compactions and its trained share of tokens (see the module docstring)."""

    compactions: int
    tokens_before: tuple[int, ...]  # per compaction
    tokens_after: tuple[int, ...]
    summary_tokens: tuple[int, ...]
    episode_tokens: int
    trained_tokens: int

    @property
    def trained_per_episode_token(self) -> float:
        return self.trained_tokens / self.episode_tokens if self.episode_tokens else 0.0

    def to_metrics(self) -> dict[str, float]:
        """The rollout's figures, named as the trace shows them."""
        return {
            "compactions": float(self.compactions),
            "compaction_tokens_before": float(sum(self.tokens_before)),
            "compaction_tokens_after": float(sum(self.tokens_after)),
            "compaction_summary_tokens": float(sum(self.summary_tokens)),
            "episode_tokens": float(self.episode_tokens),
            "trained_tokens": float(self.trained_tokens),
            "trained_tokens_per_episode_token": self.trained_per_episode_token,
        }


def episode_tokens(rollout: Rollout, train_summary: bool = True) -> EpisodeTokens:
    """``rollout``'s compaction figures; its summary turns count as trained only when ``train_summary``."""
    turns = sorted(rollout.turns, key=lambda t: t.index)
    by_index = {t.index: t for t in turns}
    before, after, summary = [], [], []
    for turn in turns:
        if turn.break_reason is not BreakReason.COMPACTED:
            continue
        writer, last = by_index.get(turn.index - 1), by_index.get(turn.index - 2)
        before.append(len(last.prompt_ids) + len(last.completion_ids) if last is not None else 0)
        after.append(len(turn.prompt_ids))
        summary.append(len(writer.completion_ids) if writer is not None else 0)
    untrained = set() if train_summary else rollout.summary_turns
    ends = {t.segment: t for t in turns}  # the last turn of each segment
    idle = {t.segment for t in turns} - {t.segment for t in turns if t.index not in untrained}  # no sample
    episode = sum(len(t.prompt_ids) + len(t.completion_ids) for s, t in ends.items() if s not in idle)
    trained = sum(len(t.completion_ids) for t in turns if t.index not in untrained)
    return EpisodeTokens(len(after), tuple(before), tuple(after), tuple(summary), episode, trained)


def compaction_step_metrics(figures: Iterable[EpisodeTokens]) -> dict[str, float]:
    """A step's figures over its trained rollouts: counts, means per compaction, and the token ratio."""
    figures = list(figures)
    before = [n for f in figures for n in f.tokens_before]
    after = [n for f in figures for n in f.tokens_after]
    summary = [n for f in figures for n in f.summary_tokens]
    episode = sum(f.episode_tokens for f in figures)
    metrics = {
        "compaction/count": float(len(after)),
        "compaction/rollouts_compacted": float(sum(f.compactions > 0 for f in figures)),
        "samples/trained_tokens_per_episode_token": sum(f.trained_tokens for f in figures) / episode if episode else 0.0,
    }
    if after:
        metrics["compaction/tokens_before_mean"] = sum(before) / len(before)
        metrics["compaction/tokens_after_mean"] = sum(after) / len(after)
        metrics["compaction/summary_tokens_mean"] = sum(summary) / len(summary)
    return metrics


__all__ = ["EpisodeTokens", "compaction_step_metrics", "episode_tokens"]
