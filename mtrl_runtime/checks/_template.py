"""``mtrl check template``: does what the run trained equal what deployment renders?

For a model's tokenizer and a run's stored rollouts, every trained segment
is re-rendered with the deployment template (the tokenizer's own when it
renders tools, else the chat format's) and compared id for id
(``chat.formats.segment_drift``). The report gives, per rollout, whether
the trained tokens equal the rendering, the fraction that differ and the
first difference decoded with context.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..chat import ChatRenderer
from ..chat.formats import SegmentDrift, resolve_format, segment_drift, segments_drift_fraction


@dataclass(frozen=True)
class TemplateReport:
    """Drift of every segment checked; ``drift_fraction`` is differing tokens over all trained tokens."""

    chat_format: str
    rollouts: int
    segments: tuple[SegmentDrift, ...]

    @property
    def drift_fraction(self) -> float:
        return segments_drift_fraction(self.segments)  # the figure training and evaluation log, one formula

    @property
    def equal(self) -> bool:
        return all(s.equal for s in self.segments)

    def to_dict(self) -> dict[str, Any]:
        return {
            "chat_format": self.chat_format,
            "rollouts": self.rollouts,
            "equal": self.equal,
            "drift_fraction": self.drift_fraction,
            "segments": [asdict(s) for s in self.segments],
        }

    def __str__(self) -> str:
        lines = [
            f"chat format {self.chat_format}: {self.rollouts} rollouts, {len(self.segments)} trained segments, "
            f"{sum(not s.equal for s in self.segments)} differ from the deployment template; "
            f"{self.drift_fraction:.2%} of trained tokens differ"
        ]
        for s in self.segments:
            mark = "ok  " if s.equal else "DIFF"
            lines.append(f"{mark} {s.rollout_id} segment {s.segment} ({s.turns} turns, {s.trained_tokens} tokens): "
                         f"{s.fraction:.2%} differ")
            if s.first_difference:
                lines.append(f"       {s.first_difference}")
        return "\n".join(lines)


def check_template(store_path: str | Path, model: str, chat_format: str | None = None,
                   max_rollouts: int | None = None) -> TemplateReport:
    """Re-render the rollouts stored at ``store_path`` with ``model``'s template and report the drift."""
    from ..engines import load_tokenizer, resolve_model
    from ..store import open_store

    tokenizer = load_tokenizer(resolve_model(model))
    fmt = resolve_format(tokenizer, chat_format, model)
    renderer = ChatRenderer(tokenizer, fallback=fmt.template, stop_tokens=fmt.stop_tokens)
    store = open_store(store_path)
    try:
        rollouts = [r for r in store.rollouts() if r.turns][:max_rollouts]
    finally:
        store.close()
    segments = tuple(d for r in rollouts for d in segment_drift(renderer, r.turns))
    return TemplateReport(chat_format=fmt.name, rollouts=len(rollouts), segments=segments)


__all__ = ["TemplateReport", "check_template"]
