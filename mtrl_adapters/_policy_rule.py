"""Which model calls inside a rollout are the policy's: the one rule every redirect asks (docs/protocols.md).

With policy models named (``RolloutContext.policy_models``), by the model id
the call names: one of them, or the served model name the coordinator handed
the rollout (``RolloutSpec.model_name``), is the policy's; another model's
call passes through to its own endpoint; a call naming no model id raises
:class:`UnresolvedModelCall`.

With none named (the default), a rollout's calls are the policy's while they
are alike: the same model id, from clients built for the same base URL. A
call unlike those before it (a judge, a planner) is decided so that no judge
is ever trained:

* a call from a client aimed at the rollout's coordinator (its base URL on
  the coordinator's endpoint: ``model_endpoint``, ``OPENAI_BASE_URL`` or
  ``mtrl serve``'s address) is the policy's: the agent was pointed there
  for the policy;
* after such a call, a call from a client aimed anywhere else passes
  through to its own endpoint, recorded as a non-policy call, and the
  rollout is flagged ``policy_calls_inferred`` (how many calls);
* any other call unlike those before it (two clients aimed elsewhere, or a
  call aimed at the coordinator after calls aimed elsewhere were taken for
  the policy) raises :class:`AmbiguousModelCalls` before it is sent, naming
  ``advanced.policy_models``; the rollout ends failed with that text even if
  the agent catches the error, flagged ``policy_calls_ambiguous``.

No rule by "the client with the default URL" or "the first model called":
an agent's policy is as often its own server (``base_url`` given) beside a
judge on a provider's default endpoint as the reverse, and a judge may be
called first; either rule would train a judge on some agents. A call naming
no model id (``models.list()``) is the policy's when none are named, as before.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

AMBIGUOUS_FLAG = "policy_calls_ambiguous"
INFERRED_FLAG = "policy_calls_inferred"


class UnresolvedModelCall(RuntimeError):
    """A model call inside a rollout that mtrl cannot tell the policy's or not; refused before it was sent."""


class AmbiguousModelCalls(UnresolvedModelCall):
    """A rollout's calls name different models or come from clients built for different base URLs, with no
    ``policy_models`` named and no rule to tell which is the policy's (see the module docstring)."""


@dataclass(frozen=True)
class CallKind:
    """What tells a rollout's model calls apart when no policy model is named."""

    protocol: str
    model: str
    base_url: str  # the client's own, before any redirect (no trailing slash)
    aimed: bool  # the base URL is on the rollout's coordinator

    def describe(self) -> str:
        return f"{self.protocol} model {self.model!r} at {self.base_url}"


class UnnamedPolicy:
    """One rollout's calls as the unnamed-policy rule has seen them (thread-safe: tools may call models on threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._taken: list[CallKind] = []  # kinds taken for the policy, in the order first seen
        self.inferred = 0  # calls passed through because the policy's client is aimed at the coordinator
        self.refusal: str | None = None  # the first refusal's text: the rollout ends failed with it

    def is_policy(self, kind: CallKind, rollout_id: str) -> bool:
        """True: the policy's; False: passes through (counted); raises :class:`AmbiguousModelCalls`."""
        with self._lock:
            if kind.aimed:
                elsewhere = [k for k in self._taken if not k.aimed]
                if elsewhere:
                    raise self._refuse(kind, elsewhere, rollout_id)
            elif any(k.aimed for k in self._taken):
                self.inferred += 1
                return False
            elif self._taken and kind not in self._taken:
                raise self._refuse(kind, self._taken, rollout_id)
            if kind not in self._taken:
                self._taken.append(kind)
            return True

    def flags(self) -> dict[str, float]:
        """The rollout's flags from this rule (sent with its end)."""
        with self._lock:
            out = {AMBIGUOUS_FLAG: 1.0} if self.refusal is not None else {}
            if self.inferred:
                out[INFERRED_FLAG] = float(self.inferred)
            return out

    def _refuse(self, kind: CallKind, taken: list[CallKind], rollout_id: str) -> AmbiguousModelCalls:
        earlier = "; ".join(k.describe() for k in taken)
        text = (
            f"rollout {rollout_id!r}: this call ({kind.describe()}) is unlike the calls before it that were taken for "
            f"the policy ({earlier}), and no policy_models are named, so mtrl cannot tell which is the policy's: "
            "refused before sending, so no judge or other model is trained and nothing reaches a provider "
            "untrained. Name the policy's model id: advanced.policy_models: [<model id>] in the run's config, or "
            "@rollout(policy_models=[...]); every other model's calls then pass through to their own endpoints, "
            "recorded, never trained. The rollout ends failed"
        )
        if self.refusal is None:
            self.refusal = text
        return AmbiguousModelCalls(text)


def call_kind(protocol: str, model: str, base_url: Any, endpoint: str) -> CallKind:
    """The kind of a call naming ``model`` from a client built for ``base_url``, in a rollout served at ``endpoint``."""
    base = str(base_url or "").rstrip("/")
    return CallKind(protocol, model, base, _aimed(base, endpoint))


def _aimed(base_url: str, endpoint: str) -> bool:
    """Whether ``base_url`` is on the coordinator's ``endpoint`` (scheme, host and port equal, path below it)."""
    target, own = urlsplit(base_url), urlsplit(endpoint)
    if (target.scheme, target.netloc.lower()) != (own.scheme, own.netloc.lower()):
        return False
    root = own.path.rstrip("/")
    return target.path == root or target.path.startswith(root + "/")


__all__ = [
    "AMBIGUOUS_FLAG",
    "INFERRED_FLAG",
    "AmbiguousModelCalls",
    "CallKind",
    "UnnamedPolicy",
    "UnresolvedModelCall",
    "call_kind",
]
