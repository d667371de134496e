"""The coordinator: live rollouts, their tokens, and the capture of every model call.

The HTTP routes and the in-process dispatcher both call this object; it owns
the engine, the store, the chat renderer and, per live rollout, the
conversation state that makes token-in-token-out work. A rollout leaves
memory when it reaches a final status, so memory stays bounded however many
rollouts a run makes; later lookups read the store.

Its parts: ``_rollouts`` (creation, tokens, lookup), ``_capture`` (model
calls, each attributed one committed as a turn before it is answered) and
``_reports`` (tool calls, rewards, the end, state).
"""

from __future__ import annotations

import threading
from collections import Counter

from ..chat import ChatRenderer, PromptBuilder
from ..config import MtrlConfig
from ..store import TrajectoryStore, hash_token
from ..types import PolicyEngine
from ._capture import CallCapture, ChatResult
from ._reports import ReportIntake
from ._rollouts import LiveRollout, RolloutHandle, VerifiedToken


class Coordinator(CallCapture, ReportIntake):
    """Creates rollouts, serves and records their model calls, and takes their reports."""

    def __init__(self, engine: PolicyEngine, store: TrajectoryStore, config: MtrlConfig | None = None) -> None:
        self.engine = engine
        self.store = store
        self.config = config or MtrlConfig()
        self.renderer = ChatRenderer(engine.tokenizer)
        self.builder = PromptBuilder(self.renderer)
        self.counters: Counter[str] = Counter()
        self._live: dict[str, LiveRollout] = {}
        self._live_lock = threading.Lock()
        core = self.config.core
        self.default_sampling = core.sampling_params.to_params()
        self.max_tokens_cap = max(core.sampling_params.max_tokens, core.val_sampling_params.max_tokens)

    @property
    def model_name(self) -> str:
        return self.config.core.model

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version


__all__ = ["ChatResult", "Coordinator", "RolloutHandle", "VerifiedToken", "hash_token"]
