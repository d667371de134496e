"""The train/serve drift figure of recorded rollouts, for the training loop and the evaluator.

``DriftMeter.measure`` is ``mtrl check template``'s figure (``chat.formats.drift_fraction``):
trained tokens that differ from the deployment rendering over trained tokens.
It runs off the server's thread (the callers use ``asyncio.to_thread``), so it
renders with a renderer of its own: the endpoint's renderer keeps an encode
cache that only the server's thread touches. Comparing a segment that differs
costs about 3 ms at 2,500 tokens and 0.1 s at 16,000 (``difflib``), so a step
is measured on at most ``MAX_ROLLOUTS`` of its rollouts, evenly spaced.
"""

from __future__ import annotations

import threading
from typing import Any, Sequence

from ..algorithms.samples import require_token_ids
from ..chat import ChatRenderer
from ..chat.formats import ChatFormat, drift_fraction
from ..types import Rollout

MAX_ROLLOUTS = 32  # rollouts measured per call: bounds a 1,024-rollout step of 16k-token rollouts to ~3 s


class DriftMeter:
    """Measures ``drift_fraction`` of rollouts with the template and format the endpoint renders with."""

    def __init__(self, tokenizer: Any, template: str, fmt: ChatFormat) -> None:
        self._args = (tokenizer, template, fmt)
        self._renderer: ChatRenderer | None = None
        self._lock = threading.Lock()  # one measurement at a time: the renderer's cache is not shared across threads

    def measure(self, rollouts: Sequence[Rollout], max_rollouts: int = MAX_ROLLOUTS) -> float:
        picked = list(rollouts)
        for rollout in picked:  # a reference model's turns have no ids to compare: refused, never read as 0 drift
            require_token_ids(rollout)
        if len(picked) > max_rollouts:  # evenly spaced, so every group of the step is represented alike
            picked = [picked[i * len(picked) // max_rollouts] for i in range(max_rollouts)]
        with self._lock:
            if self._renderer is None:
                tokenizer, template, fmt = self._args
                self._renderer = ChatRenderer(tokenizer, template=template, stop_tokens=fmt.stop_tokens)
            return drift_fraction(self._renderer, (r.turns for r in picked))


__all__ = ["MAX_ROLLOUTS", "DriftMeter"]
