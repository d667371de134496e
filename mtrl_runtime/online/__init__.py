"""Online learning from deployed traffic: ``mtrl online`` (docs/online.md).

The deployed agent keeps answering its users with the promoted adapter; a
share of sessions (``online.sample_rate``) is recorded as rollouts; feedback
that comes later (seconds to days) becomes their reward by session id, or
the session is dropped, counted, at its expiry; rewarded sessions form groups
(by similar task, or by the feedback's own key), are trained under a
staleness bound on a learner of their own, and a candidate adapter serves
only after the gate (held-out strict success not below the serving
adapter's, tripwires quiet). ``rollback`` serves the previous one again.
"""

from ._book import FeedbackExpired, Session, SessionBook, UnknownSession, sampled, task_key
from ._gates import GateRunner, GateVerdict, judge
from ._learner import Learner, rollout_staleness
from ._routes import OnlineEndpoints, build_online_router
from ._service import ADAPTERS_KEY, ONLINE_GROUP, SERVING_KEY, OnlineService
from ._settings import GROUPINGS, OnlineSettings, load_online_config

__all__ = [
    "ADAPTERS_KEY",
    "GROUPINGS",
    "ONLINE_GROUP",
    "SERVING_KEY",
    "FeedbackExpired",
    "GateRunner",
    "GateVerdict",
    "Learner",
    "OnlineEndpoints",
    "OnlineService",
    "OnlineSettings",
    "Session",
    "SessionBook",
    "UnknownSession",
    "build_online_router",
    "judge",
    "load_online_config",
    "rollout_staleness",
    "sampled",
    "task_key",
]
