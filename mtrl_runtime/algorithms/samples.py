"""Rollouts → training Samples: sequence extension with a loss mask on model tokens.

When every turn of a segment extends the previous one (its prompt starts with
the previous prompt + completion), the whole segment is ONE training sequence:
the last turn's prompt + completion. Every turn's completion sits in it at
offset ``len(turn.prompt_ids)``; the mask is 1 there and 0 on everything the
model did not generate (system, user and tool text, template glue). An
8-turn rollout thus costs one forward pass over its final length instead of
eight over ever longer prompts (bench/sequence_extension.py measures it).

``per_turn_samples`` is the baseline without extension: one sequence per turn.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Collection, Iterable, Mapping, Sequence

from ..types import Rollout, Sample, Turn


class PrefixError(ValueError):
    """A turn's tokens are not where sequence extension says they must be."""


class NoTokenIds(ValueError):
    """A turn written by a reference model (``Turn.model``) through a closed endpoint: it has no ids to train on."""


def require_token_ids(rollout: Rollout) -> None:
    """Raise ``NoTokenIds`` when a turn of ``rollout`` was written by a reference model, not the policy.

    Every consumer of a turn's token ids (samples, SFT from stored rollouts,
    anything that recomputes logprobs) calls this first: a reference turn is
    recorded for evaluation only, never trained on.
    """
    for turn in rollout.turns:
        if turn.model is not None:
            raise NoTokenIds(
                f"rollout {rollout.id} (group {rollout.group_id}): turn {turn.index} was written by the reference "
                f"model {turn.model!r} through its own endpoint and has no token ids; reference rollouts are for "
                "evaluation only: leave them out (to learn from their conversations, import them as conversations, "
                "rendered with the policy's chat format)"
            )


def build_samples(
    rollout: Rollout, advantages_per_turn: Sequence[float], untrained: Collection[int] = frozenset()
) -> list[Sample]:
    """One Sample per segment of ``rollout``; turn ``t``'s tokens carry ``advantages_per_turn[t]``.

    ``advantages_per_turn`` is indexed by position in ``rollout.turns`` (after
    sorting by ``Turn.index``). The turns whose ``Turn.index`` is in
    ``untrained`` (a compaction's summary turns under ``summary_turns: mask``)
    stay in their sequence with a zero mask; a segment of untrained turns
    only gives no sample. Segments of one rollout, a compaction's included,
    share the rollout's advantages: the episode is one, however many
    sequences train it. Raises PrefixError when a turn of a segment is not a
    prefix of the segment's last prompt + completion.
    """
    require_token_ids(rollout)
    turns = _sorted_turns(rollout)
    _check_advantages(rollout, turns, advantages_per_turn)
    samples = []
    for segment, members in _segments(rollout, turns):
        last_turn, _ = members[-1]
        token_ids = tuple(last_turn.prompt_ids) + tuple(last_turn.completion_ids)
        n = len(token_ids)
        mask_T, logprobs_T, adv_T, version_T = [0] * n, [0.0] * n, [0.0] * n, [-1] * n
        for turn, position in members:
            start = len(turn.prompt_ids)
            _check_prefix(rollout, turn, token_ids, segment)
            if turn.index in untrained:
                continue
            for offset, (logprob, version) in enumerate(zip(turn.logprobs, turn.versions_T)):
                mask_T[start + offset] = 1
                logprobs_T[start + offset] = float(logprob)
                adv_T[start + offset] = float(advantages_per_turn[position])
                version_T[start + offset] = version  # a partial rollout's turn: several versions
        if all(turn.index in untrained for turn, _ in members):
            continue
        samples.append(
            Sample(
                rollout_id=rollout.id,
                group_id=rollout.group_id,
                segment=segment,
                token_ids_T=token_ids,
                loss_mask_T=tuple(mask_T),
                behaviour_logprobs_T=tuple(logprobs_T),
                advantages_T=tuple(adv_T),
                policy_version_T=tuple(version_T),
            )
        )
    return samples


def per_turn_samples(rollout: Rollout, advantages_per_turn: Sequence[float]) -> list[Sample]:
    """One Sample per turn (prompt + completion, no extension): the baseline extension replaces.

    ``Sample.segment`` holds the turn's index.
    """
    require_token_ids(rollout)
    turns = _sorted_turns(rollout)
    _check_advantages(rollout, turns, advantages_per_turn)
    samples = []
    for position, turn in enumerate(turns):
        _check_turn(rollout, turn)
        p, c = len(turn.prompt_ids), len(turn.completion_ids)
        adv = float(advantages_per_turn[position])
        samples.append(
            Sample(
                rollout_id=rollout.id,
                group_id=rollout.group_id,
                segment=turn.index,
                token_ids_T=tuple(turn.prompt_ids) + tuple(turn.completion_ids),
                loss_mask_T=(0,) * p + (1,) * c,
                behaviour_logprobs_T=(0.0,) * p + tuple(float(x) for x in turn.logprobs),
                advantages_T=(0.0,) * p + (adv,) * c,
                policy_version_T=(-1,) * p + turn.versions_T,
            )
        )
    return samples


@dataclass(frozen=True)
class SampleStats:
    """How well sequence extension worked over a batch of rollouts.

    ``merge_ratio``: turns trained inside a multi-turn sequence / all turns
    (1.0 when every rollout is one unbroken multi-turn sequence; a single-turn
    rollout counts as unmerged). ``extension_rate``: turns that extended their
    predecessor / turns that had a predecessor (1.0 when nothing broke).
    """

    rollouts: int = 0
    turns: int = 0
    segments: int = 0
    merged_turns: int = 0
    break_reasons: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_rollouts(cls, rollouts: Iterable[Rollout]) -> "SampleStats":
        n_rollouts = n_turns = n_segments = merged = 0
        reasons: Counter[str] = Counter()
        for rollout in rollouts:
            turns = _sorted_turns(rollout)
            n_rollouts += 1
            n_turns += len(turns)
            for _, members in _segments(rollout, turns):
                n_segments += 1
                merged += len(members) if len(members) > 1 else 0
            for turn in turns:
                if turn.break_reason is not None:
                    reasons[turn.break_reason.value] += 1
        return cls(n_rollouts, n_turns, n_segments, merged, dict(sorted(reasons.items())))

    @property
    def merge_ratio(self) -> float:
        return self.merged_turns / self.turns if self.turns else 0.0

    @property
    def extension_rate(self) -> float:
        could_extend = self.turns - self.rollouts
        return (self.turns - self.segments) / could_extend if could_extend > 0 else 1.0

    def to_metrics(self) -> dict[str, float]:
        metrics = {
            "samples/merge_ratio": self.merge_ratio,
            "samples/extension_rate": self.extension_rate,
            "samples/segments": float(self.segments),
            "samples/turns": float(self.turns),
        }
        for reason, count in self.break_reasons.items():
            metrics[f"samples/breaks/{reason}"] = float(count)
        return metrics


def _sorted_turns(rollout: Rollout) -> list[Turn]:
    return sorted(rollout.turns, key=lambda turn: turn.index)


def _segments(rollout: Rollout, turns: list[Turn]) -> list[tuple[int, list[tuple[Turn, int]]]]:
    """Consecutive turns grouped by ``Turn.segment``: [(segment, [(turn, position), ...])]."""
    groups: list[tuple[int, list[tuple[Turn, int]]]] = []
    for position, turn in enumerate(turns):
        if groups and groups[-1][0] == turn.segment:
            groups[-1][1].append((turn, position))
            continue
        if any(seg == turn.segment for seg, _ in groups):
            raise PrefixError(
                f"rollout {rollout.id}: turn {turn.index} returns to segment {turn.segment} "
                "after another segment began; segments must be contiguous"
            )
        groups.append((turn.segment, [(turn, position)]))
    return groups


def _check_advantages(rollout: Rollout, turns: list[Turn], advantages: Sequence[float]) -> None:
    if len(advantages) != len(turns):
        raise ValueError(
            f"rollout {rollout.id}: advantages_per_turn has {len(advantages)} values "
            f"for {len(turns)} turns"
        )


def _check_turn(rollout: Rollout, turn: Turn) -> None:
    if not turn.prompt_ids:
        raise ValueError(f"rollout {rollout.id}: turn {turn.index} has empty prompt_ids")
    if len(turn.logprobs) != len(turn.completion_ids):
        raise ValueError(
            f"rollout {rollout.id}: turn {turn.index} has {len(turn.logprobs)} logprobs "
            f"for {len(turn.completion_ids)} completion_ids"
        )
    if len(turn.versions_T) != len(turn.completion_ids):
        raise ValueError(
            f"rollout {rollout.id}: turn {turn.index} has {len(turn.versions_T)} token_versions "
            f"for {len(turn.completion_ids)} completion_ids"
        )


def _check_prefix(rollout: Rollout, turn: Turn, token_ids: tuple[int, ...], segment: int) -> None:
    """Raise unless turn's prompt + completion is a prefix of the segment's sequence."""
    _check_turn(rollout, turn)
    own = tuple(turn.prompt_ids) + tuple(turn.completion_ids)
    if own == token_ids[: len(own)]:
        return
    mismatch = next(
        (i for i, (a, b) in enumerate(zip(own, token_ids)) if a != b), min(len(own), len(token_ids))
    )
    raise PrefixError(
        f"rollout {rollout.id}: turn {turn.index} (segment {segment}) is not a prefix of the "
        f"segment's last prompt + completion: first difference at token {mismatch} "
        f"(turn has {len(own)} tokens, sequence {len(token_ids)})"
    )


__all__ = ["NoTokenIds", "PrefixError", "SampleStats", "build_samples", "per_turn_samples", "require_token_ids"]
