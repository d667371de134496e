"""The sessions ``mtrl online`` recorded, from the user's first message to the feedback that rewards them.

A session is drawn for recording by a hash of its id (``sampled``): the same
id always draws the same way, in every process and after a restart, so
feedback for a session that was never drawn is told apart from feedback for
a session nobody opened (``UnknownSession``). A drawn session is a rollout
of the serving coordinator; its record here says where it stands:

``pending`` (waiting for feedback) ─► ``rewarded`` (waiting for its group) ─► ``trained``
     └──► ``dropped`` (``expired``: no feedback within ``feedback_expiry_s``; ``ungrouped``: rewarded, but its
          group did not fill before that expiry; ``stale``: its tokens were more than ``max_staleness`` versions
          from the learner's policy; ``failed``: the rollout itself failed)

Every record is a meta key of the run's store (``online/session/<id>``), and
the ids not yet final are one more (``online/open``), written before an
answer leaves: a restart reads them back and loses nothing. Each drop is
counted (``counters``, persisted as ``online/counters``) and logged by the
service as ``online/dropped/<reason>``; nothing leaves without a count.
The clock is the caller's (``now``), so feedback days late is tested without waiting days.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable, Mapping

from ..errors import Conflict, MtrlError
from ..types import TrajectoryStore
from ._settings import OnlineSettings

SESSION_KEY = "online/session/"
OPEN_KEY = "online/open"
COUNTERS_KEY = "online/counters"
STATES = ("pending", "rewarded", "trained", "dropped")
COUNTED = ("opened", "not_sampled", "rewarded", "trained", "dropped/expired", "dropped/ungrouped", "dropped/stale",
           "dropped/failed",
           "feedback/unknown", "feedback/not_sampled", "feedback/late")


class UnknownSession(MtrlError):
    """Feedback for a session id that was drawn for recording but never opened here."""

    status = 404
    code = "unknown_session"


class FeedbackExpired(MtrlError):
    """Feedback after the session's expiry: the rollout was dropped (and counted)."""

    status = 410
    code = "feedback_expired"


@dataclass(frozen=True)
class Session:
    """One recorded session (a rollout of the serving coordinator) and where it stands."""

    session_id: str
    rollout_id: str
    task_key: str  # what ``group_by: task`` groups by: the entrypoint's group_key, else the normalised prompt
    opened_at: float
    expires_at: float
    state: str = "pending"
    reward: float | None = None
    feedback_key: str | None = None
    rewarded_at: float | None = None
    reason: str | None = None  # why it was dropped

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Session":
        return cls(**data)


def sampled(session_id: str, rate: float, seed: int = 0) -> bool:
    """Whether ``session_id`` is recorded: its hash, read as a number in [0, 1), is below ``rate``."""
    digest = hashlib.sha256(f"{seed}:{session_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64 < rate


def task_key(prompt: str, group_key: str | None = None) -> str:
    """The grouping key of a task: ``group_key`` when given, else its prompt lower-cased, spaces collapsed."""
    if group_key:
        return f"key:{group_key}"
    return "prompt:" + re.sub(r"\s+", " ", prompt.strip().lower())


class SessionBook:
    """The recorded sessions of one online run, persisted in its store (see the module docstring)."""

    def __init__(self, store: TrajectoryStore, settings: OnlineSettings) -> None:
        self.store = store
        self.settings = settings
        self._lock = threading.Lock()
        self._open: dict[str, Session] = {}
        for sid in store.get_meta(OPEN_KEY, []) or []:
            data = store.get_meta(SESSION_KEY + sid)
            if data is not None:
                self._open[sid] = Session.from_json(data)
        saved = store.get_meta(COUNTERS_KEY, {}) or {}
        self.counters: dict[str, int] = {name: int(saved.get(name, 0)) for name in COUNTED}

    # -- opening ---------------------------------------------------------------------------------

    def draws(self, session_id: str) -> bool:
        return sampled(session_id, self.settings.sample_rate, self.settings.seed)

    def count_not_sampled(self) -> None:
        with self._lock:
            self._count("not_sampled")

    def open(self, session_id: str, rollout_id: str, key: str, now: float) -> Session:
        """Record a drawn session's rollout; an id already recorded is a Conflict."""
        with self._lock:
            if session_id in self._open or self.store.get_meta(SESSION_KEY + session_id) is not None:
                raise Conflict(f"session_id {session_id!r}: already recorded; each session id opens once",
                               param="session_id")
            session = Session(session_id, rollout_id, key, now, now + self.settings.feedback_expiry_s)
            self._open[session_id] = session
            self._save([session], index=True)
            self._count("opened")
            return session

    # -- feedback --------------------------------------------------------------------------------

    def feedback(self, session_id: str, reward: float, feedback_key: str | None, now: float) -> Session | None:
        """Reward a pending session. None: the id was not drawn for recording (counted, nothing to train).

        Raises ``UnknownSession`` (drawn, never opened), ``FeedbackExpired`` (past its expiry: dropped and
        counted now if it was still pending) and ``Conflict`` (rewarded already, or ended).
        """
        if self.settings.group_by == "feedback_key" and not feedback_key:
            raise MtrlError(f"group_key: required with online.group_by 'feedback_key' (session {session_id!r}), "
                            f"got {feedback_key!r}", param="group_key")
        with self._lock:
            session = self._open.get(session_id)
            if session is None:
                return self._not_open(session_id)
            if session.state != "pending":
                raise Conflict(f"session_id {session_id!r}: feedback already given (reward {session.reward!r}); "
                               "a session takes one", param="session_id")
            if now > session.expires_at:
                self._count("feedback/late")
                self._drop([session], "expired")
                raise FeedbackExpired(self._expired_message(session), param="session_id")
            rewarded = replace(session, state="rewarded", reward=float(reward), feedback_key=feedback_key,
                               rewarded_at=now)
            self._open[session_id] = rewarded
            self._save([rewarded], index=False)
            self._count("rewarded")
            return rewarded

    def _not_open(self, session_id: str) -> None:
        stored = self.store.get_meta(SESSION_KEY + session_id)
        if stored is not None:
            session = Session.from_json(stored)
            if session.reason == "expired":
                self._count("feedback/late")
                raise FeedbackExpired(self._expired_message(session), param="session_id")
            raise Conflict(f"session_id {session_id!r}: already {session.state}"
                           f"{' (' + session.reason + ')' if session.reason else ''}; feedback comes too late",
                           param="session_id")
        if not self.draws(session_id):
            self._count("feedback/not_sampled")
            return None
        self._count("feedback/unknown")
        raise UnknownSession(
            f"session_id {session_id!r}: no recorded session has this id (it was drawn for recording, but no "
            "session opened under it: POST /online/sessions with this id first)", param="session_id")

    def _expired_message(self, session: Session) -> str:
        return (f"session_id {session.session_id!r}: feedback came after its expiry "
                f"(online.feedback_expiry_s {self.settings.feedback_expiry_s:g}); the rollout was dropped")

    # -- expiry, groups, training ----------------------------------------------------------------

    def sweep(self, now: float) -> list[Session]:
        """Drop every session past its expiry: pending ones as ``expired``, rewarded ones whose group never
        filled as ``ungrouped`` (each counted); returns them."""
        with self._lock:
            late = [s for s in self._open.values() if now > s.expires_at]
            self._drop([s for s in late if s.state == "pending"], "expired")
            self._drop([s for s in late if s.state == "rewarded"], "ungrouped")
            return late

    def ready_groups(self) -> list[list[Session]]:
        """Full groups of rewarded sessions (``group_size`` each, oldest feedback first), by ``group_by``."""
        size = self.settings.group_size
        by_key: dict[str, list[Session]] = {}
        with self._lock:
            for s in sorted(self._open.values(), key=lambda s: (s.rewarded_at or 0.0, s.session_id)):
                if s.state == "rewarded":
                    key = s.feedback_key if self.settings.group_by == "feedback_key" else s.task_key
                    by_key.setdefault(str(key), []).append(s)
        return [members[i:i + size] for members in by_key.values()
                for i in range(0, len(members) - size + 1, size)]

    def mark_trained(self, sessions: Iterable[Session]) -> None:
        with self._lock:
            done = [replace(s, state="trained") for s in sessions]
            for s in done:
                self._open.pop(s.session_id, None)
            self._save(done, index=True)
            self._count("trained", len(done))

    def drop(self, sessions: Iterable[Session], reason: str) -> None:
        with self._lock:
            self._drop(list(sessions), reason)

    def _drop(self, sessions: list[Session], reason: str) -> None:
        if not sessions:
            return
        dropped = [replace(s, state="dropped", reason=reason) for s in sessions]
        for s in dropped:
            self._open.pop(s.session_id, None)
        self._save(dropped, index=True)
        self._count(f"dropped/{reason}", len(dropped))

    # -- reading ---------------------------------------------------------------------------------

    def get(self, session_id: str) -> Session | None:
        with self._lock:
            found = self._open.get(session_id)
        if found is not None:
            return found
        stored = self.store.get_meta(SESSION_KEY + session_id)
        return None if stored is None else Session.from_json(stored)

    def open_sessions(self) -> list[Session]:
        with self._lock:
            return list(self._open.values())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            states = {state: 0 for state in ("pending", "rewarded")}
            for s in self._open.values():
                states[s.state] = states.get(s.state, 0) + 1
            return {"counters": dict(self.counters), "open": states}

    # -- persistence (under the lock) ------------------------------------------------------------

    def _save(self, sessions: list[Session], *, index: bool) -> None:
        for s in sessions:
            self.store.set_meta(SESSION_KEY + s.session_id, asdict(s))
        if index:
            self.store.set_meta(OPEN_KEY, sorted(self._open))

    def _count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n
        self.store.set_meta(COUNTERS_KEY, self.counters)


__all__ = ["FeedbackExpired", "STATES", "Session", "SessionBook", "UnknownSession", "sampled", "task_key"]
