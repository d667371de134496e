"""Live rollouts: their creation, their secret tokens, and finding the one a call is for."""

from __future__ import annotations

import asyncio
import hmac
import secrets
import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from ..chat import ConversationState
from ..config import MtrlConfig
from ..errors import Conflict, Forbidden, RolloutNotFound, Unauthorized
from ..store import TrajectoryStore, hash_token
from ..types import PolicyEngine, Rollout, RolloutStatus, Task
from ._errors import client_data


class VerifiedToken(str):
    """A credential the server checked itself, good for one rollout (SageMaker-compat SigV4 on loopback).

    Only server code makes one, after its own check; a token read from a
    request is always a plain ``str``, so HTTP can never forge this.
    """

    rollout_id: str

    def __new__(cls, rollout_id: str) -> "VerifiedToken":
        obj = super().__new__(cls, f"verified:{rollout_id}")
        obj.rollout_id = rollout_id
        return obj


@dataclass(frozen=True)
class RolloutHandle:
    """What the creator of a rollout hands to the agent: its id and its secret token."""

    id: str
    token: str
    group_id: str
    task: Task


@dataclass
class LiveRollout:
    """A running rollout's in-memory state (dropped when the rollout ends)."""

    rollout_id: str
    task_id: str
    group_id: str
    token_hash: str
    policy_version: int
    max_turns: int
    conversation: ConversationState | None = None
    turns: int = 0
    hit_turn_limit: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    call_turns: dict[str, int] = field(default_factory=dict)  # tool-call id -> the turn that asked for it
    requested_end: RolloutStatus | None = None  # SageMaker compat: an end asked for before the reward came


class RolloutRegistry:
    """The coordinator's part that creates rollouts and checks every caller's token against them.

    A rollout is in ``_live`` from its creation to its final status; after
    that, lookups read the store.
    """

    engine: PolicyEngine
    store: TrajectoryStore
    config: MtrlConfig
    counters: Counter[str]
    _live: dict[str, LiveRollout]
    _live_lock: threading.Lock

    def create_rollout(
        self,
        task: Task,
        group_id: str | None = None,
        *,
        step: int | None = None,
        max_turns: int | None = None,
    ) -> RolloutHandle:
        """Register a rollout (durably) and return its id and token. Thread-safe."""
        rollout_id = "r-" + secrets.token_hex(12)
        token = secrets.token_urlsafe(32)
        group_id = group_id or "g-" + secrets.token_hex(8)
        version = self.engine.policy_version
        rollout = Rollout(
            id=rollout_id,
            task_id=task.id,
            group_id=group_id,
            policy_version=version,
            step=step,
            created_at=time.time(),
        )
        with client_data("task"):
            self.store.put_task(task)
        self.store.create_rollout(rollout, hash_token(token))
        live = LiveRollout(
            rollout_id=rollout_id,
            task_id=task.id,
            group_id=group_id,
            token_hash=hash_token(token),
            policy_version=version,
            max_turns=max_turns or self.config.core.max_turns,
        )
        with self._live_lock:
            self._live[rollout_id] = live
        self.counters["rollouts_created"] += 1
        return RolloutHandle(id=rollout_id, token=token, group_id=group_id, task=task)

    def live_rollout_ids(self) -> list[str]:
        with self._live_lock:
            return list(self._live)

    def _live_or_none(self, rollout_id: str) -> LiveRollout | None:
        with self._live_lock:
            return self._live.get(rollout_id)

    def _check_token(self, rollout_id: str, expected_hash: str, token: str | None) -> None:
        if isinstance(token, VerifiedToken) and token.rollout_id == rollout_id:
            return
        if not token:
            raise Unauthorized(
                f"rollout {rollout_id!r}: missing token; send 'Authorization: Bearer <rollout token>'",
                param="authorization",
            )
        if not hmac.compare_digest(hash_token(token), expected_hash):
            self.counters["auth_rejected"] += 1
            raise Forbidden(f"rollout {rollout_id!r}: the token does not belong to this rollout", param="authorization")

    def _live_rollout(self, rollout_id: str, token: str | None) -> LiveRollout:
        """The running rollout, after checking its token; final or unknown rollouts raise."""
        live = self._live_or_none(rollout_id)
        if live is None:
            stored = self._ended_rollout(rollout_id, token)
            raise Conflict(
                f"rollout {rollout_id!r} has ended ({stored.status.value}); it takes no more calls", param="rollout_id"
            )
        self._check_token(rollout_id, live.token_hash, token)
        return live

    def _ended_rollout(self, rollout_id: str, token: str | None) -> Rollout:
        """A rollout no longer live, from the store, after checking its token; an unknown id raises."""
        stored_hash = self.store.token_hash(rollout_id)
        if stored_hash is None:
            raise RolloutNotFound(f"unknown rollout id {rollout_id!r}", param="rollout_id")
        self._check_token(rollout_id, stored_hash, token)
        rollout = self.store.get_rollout(rollout_id, with_turns=False)
        assert rollout is not None
        return rollout


__all__ = ["LiveRollout", "RolloutHandle", "RolloutRegistry", "VerifiedToken"]
