"""Train/serve drift: the tokens a rollout was trained on against what the deployment template renders.

Sequence extension trains each segment as the ids the engine saw and
sampled. At deployment the model sees the conversation rendered by its
template, which may rewrite history: Qwen3 and gpt-oss drop earlier turns'
reasoning, Mistral adds call ids the model never wrote. ``segment_drift``
re-renders the prompt of each segment's last turn from the messages the
agent sent, as deployment would, and compares ids. A request's
``chat_template_kwargs`` are not stored with the turn, so a run that set
them is re-rendered without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Iterable, Sequence

from ...types import Turn
from .._messages import normalize_messages, normalize_tools
from .._template import ChatRenderer

CONTEXT_TOKENS = 12  # tokens decoded on each side of the first difference


@dataclass(frozen=True)
class SegmentDrift:
    """One trained segment against its deployment rendering.

    ``differing_tokens`` is the number of trained ids not matched in the
    deployed ids (plus deployed ids not matched), ``fraction`` that over the
    trained length; ``first_difference`` is both sides decoded around the
    first position where they part, or None when they are equal.
    """

    rollout_id: str
    segment: int
    turns: int
    trained_tokens: int
    deployed_tokens: int
    differing_tokens: int
    fraction: float
    first_difference: str | None

    @property
    def equal(self) -> bool:
        return self.differing_tokens == 0


def segment_drift(renderer: ChatRenderer, turns: Sequence[Turn]) -> list[SegmentDrift]:
    """The drift of each segment of one rollout's ``turns`` (in index order).

    A segment's turns are trained in prefixes of its last turn's prompt, so
    that prompt is compared with the deployment rendering of the messages the
    agent sent with it; the last completion itself is what the model
    generated in that context either way.
    """
    out = []
    for segment in sorted({t.segment for t in turns}):
        seg = [t for t in turns if t.segment == segment]
        last = seg[-1]
        trained = list(last.prompt_ids)
        text = renderer.render(normalize_messages(last.messages), normalize_tools(last.tools), add_generation_prompt=True)
        out.append(_compare(renderer, last.rollout_id, segment, len(seg), trained, renderer.encode(text)))
    return out


def drift_fraction(renderer: ChatRenderer, rollouts_turns: Iterable[Sequence[Turn]]) -> float:
    """Trained tokens that differ from the deployment rendering, over all trained tokens, of every segment.

    The figure ``mtrl check template`` reports (``TemplateReport.drift_fraction``),
    the training loop logs as ``rollout/template_drift_frac`` and the
    evaluator as ``val/template_drift_frac``; 0.0 when nothing was trained.
    """
    return segments_drift_fraction(
        drift
        for turns in rollouts_turns
        if turns
        for drift in segment_drift(renderer, sorted(turns, key=lambda t: t.index))
    )


def segments_drift_fraction(segments: Iterable[SegmentDrift]) -> float:
    """Differing tokens over trained tokens of ``segments`` (0.0 when none were trained): the one drift formula."""
    differing = trained = 0
    for drift in segments:
        differing += drift.differing_tokens
        trained += drift.trained_tokens
    return differing / trained if trained else 0.0


def _compare(renderer: ChatRenderer, rollout_id: str, segment: int, turns: int, a: list[int], b: list[int]) -> SegmentDrift:
    if a == b:  # the common case, without the quadratic matcher
        return SegmentDrift(rollout_id, segment, turns, len(a), len(b), 0, 0.0, None)
    matched = sum(block.size for block in SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks())
    differing = (len(a) - matched) + (len(b) - matched)
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if first is None and len(a) != len(b):
        first = min(len(a), len(b))
    where = None
    if first is not None:
        lo = max(0, first - CONTEXT_TOKENS)
        hi = first + CONTEXT_TOKENS
        where = (
            f"at token {first}: trained …{renderer.decode(a[lo:hi])!r}… "
            f"deployed …{renderer.decode(b[lo:hi])!r}…"
        )
    return SegmentDrift(
        rollout_id=rollout_id,
        segment=segment,
        turns=turns,
        trained_tokens=len(a),
        deployed_tokens=len(b),
        differing_tokens=differing,
        fraction=differing / max(1, len(a)),
        first_difference=where,
    )


__all__ = ["SegmentDrift", "drift_fraction", "segment_drift", "segments_drift_fraction"]
