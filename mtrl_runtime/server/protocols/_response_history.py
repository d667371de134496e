"""The Responses API's stored responses: what ``previous_response_id`` continues from, kept per rollout.

A stored response is the conversation it ended (the input it was given and
the reply, as OpenAI-shaped messages, without its ``instructions``, which a
continuation does not inherit). A response id is found only within the
rollout that made it: another rollout's id is unknown (a 400 naming it).
Memory is bounded: a rollout keeps at most ``per_rollout`` responses (its
turn limit bounds them anyway), the history is pruned of ended rollouts
whenever it has grown to twice what it held after the last pruning, and
unattributed (inference-mode) calls share one bounded history.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Iterable

Conversation = tuple[dict[str, Any], ...]

_INFERENCE = ""  # the key of unattributed calls (no rollout id is empty)


class ResponseHistory:
    """Stored responses by rollout, then by response id (see the module docstring)."""

    def __init__(self, live_ids: Callable[[], Iterable[str]], per_rollout: int = 1024, inference: int = 1024) -> None:
        self._live_ids = live_ids
        self._per_rollout = per_rollout
        self._inference = inference
        self._by_rollout: dict[str, OrderedDict[str, Conversation]] = {}
        self._prune_at = 64

    def get(self, rollout_id: str | None, response_id: str) -> Conversation | None:
        stored = self._by_rollout.get(rollout_id or _INFERENCE)
        return None if stored is None else stored.get(response_id)

    def put(self, rollout_id: str | None, response_id: str, conversation: Conversation) -> None:
        key = rollout_id or _INFERENCE
        stored = self._by_rollout.get(key)
        if stored is None:
            if len(self._by_rollout) >= self._prune_at:
                self._prune()
            stored = self._by_rollout[key] = OrderedDict()
        stored[response_id] = conversation
        limit = self._inference if key == _INFERENCE else self._per_rollout
        while len(stored) > limit:
            stored.popitem(last=False)

    def __len__(self) -> int:
        return len(self._by_rollout)

    def _prune(self) -> None:
        live = set(self._live_ids())
        for key in [k for k in self._by_rollout if k != _INFERENCE and k not in live]:
            del self._by_rollout[key]
        self._prune_at = max(64, 2 * len(self._by_rollout))


__all__ = ["Conversation", "ResponseHistory"]
