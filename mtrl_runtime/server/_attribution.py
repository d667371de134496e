"""Which rollout a model call belongs to, and the credential to check for it: one rule for every protocol.

A call names its rollout by the path prefix ``/rollouts/{id}/...`` or the
``x-mtrl-rollout-id`` header (and, in SageMaker compatibility mode, the
trajectory header). Any of them may carry the rollout's trajectory id with
its MAC (``<rollout_id>.<mac>``, see ``_trajectory``); a MAC that does not
verify is a 401, and a SageMaker SigV4 token acts only for a rollout so
named. Calls that name none are served only in inference mode, and then
need the run's API key when one is configured. Every wire protocol (chat
completions, and each module of ``server.protocols``) calls
``attribute_call`` before it reads the body, so a stranger learns no schema.
"""

from __future__ import annotations

from typing import Any

from mtrl_adapters.wire import HEADER_ROLLOUT_ID, HEADER_SM_TRAJECTORY_ID, split_trajectory_id

from ..coordinator import Coordinator
from ..errors import BadRequest, Unauthorized
from ._compat_routes import compat_credential
from ._http import api_key_matches, parse_bearer
from ._trajectory import resolve_trajectory

_HEADER_ROLLOUT = HEADER_ROLLOUT_ID.encode()
_HEADER_TRAJECTORY = HEADER_SM_TRAJECTORY_ID.encode()


def header(headers: dict[bytes, bytes], name: bytes) -> str | None:
    """One request header as text (latin-1, as HTTP defines it), or None."""
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


def attribute_call(
    coordinator: Coordinator,
    path_rollout_id: str | None,
    headers: dict[bytes, bytes],
    peer: str,
    token: str | None = None,
) -> tuple[str | None, str | None]:
    """The rollout a call is for (None: unattributed) and the credential to check for it.

    ``headers`` are the request's, lower-cased bytes; ``peer`` is the client's
    address; ``token`` is the credential the protocol carries (default: the
    ``Authorization: Bearer`` header). An unattributed call outside inference
    mode is a 400; one without the run's API key (when set) a 401.

    When the path names one rollout and a header another, the header wins and
    the call is counted (``attribution_header_over_path``). The header is the
    per-call signal, the path the per-client one: SageMaker's ``wrap_model``
    sets the trajectory header on every call from the rollout context, while
    a model built once at module level keeps the base URL (``model_endpoint``)
    of whichever rollout built it; refusing would fail every such agent, and
    the header's rollout is still checked like any other (its token, or a
    SigV4 token with that rollout's MAC), so the header can only move a call
    to a rollout its sender holds. The two headers naming different rollouts
    is a 400: nothing says which one is meant.
    """
    cfg = coordinator.server_config
    if token is None:
        token = parse_bearer(header(headers, b"authorization"))
    named = _named_rollout(coordinator, path_rollout_id, headers, cfg.sagemaker_compat)
    if named is None:
        if not cfg.inference_mode:
            raise BadRequest(
                f"no rollout named: send the {HEADER_ROLLOUT_ID} header or call under /rollouts/{{id}}/; "
                "calls that name no rollout are served only in inference mode",
                param=HEADER_ROLLOUT_ID,
            )
        if cfg.api_key and not api_key_matches(token, cfg.api_key):
            raise Unauthorized("inference calls need 'Authorization: Bearer <api key>'", param="authorization")
        return None, token
    rollout_id, bound = named
    if cfg.sagemaker_compat:
        token = compat_credential(peer, coordinator, rollout_id, token, bound)
    return rollout_id, token


def _named_rollout(
    coordinator: Coordinator, path_rollout_id: str | None, headers: dict[bytes, bytes], compat: bool
) -> tuple[str, bool] | None:
    """``(rollout_id, bound)`` a call names (the header over the path), ``bound`` when a verified MAC names it."""
    names = [
        (HEADER_SM_TRAJECTORY_ID, header(headers, _HEADER_TRAJECTORY) if compat else None),
        (HEADER_ROLLOUT_ID, header(headers, _HEADER_ROLLOUT)),
        ("path", path_rollout_id),
    ]
    given = [(source, value) for source, value in names if value]
    if not given:
        return None
    ids = {source: split_trajectory_id(value)[0] for source, value in given}
    sm, mtrl = ids.get(HEADER_SM_TRAJECTORY_ID), ids.get(HEADER_ROLLOUT_ID)
    if sm is not None and mtrl is not None and sm != mtrl:
        raise BadRequest(
            f"{HEADER_ROLLOUT_ID} names rollout {mtrl!r} and {HEADER_SM_TRAJECTORY_ID} names {sm!r}; "
            "send one of them, or both naming the same rollout",
            param=HEADER_ROLLOUT_ID,
        )
    source, _ = given[0]
    rollout_id = ids[source]
    if "path" in ids and ids["path"] != rollout_id:
        coordinator.counters.attribution_header_over_path += 1
    bound = False
    for where, value in given:
        if ids[where] == rollout_id:
            bound = resolve_trajectory(coordinator, value, where)[1] or bound
    return rollout_id, bound


def scope_peer(scope: dict[str, Any]) -> str:
    """The client's address of an ASGI scope ("" when the server does not know it)."""
    client = scope.get("client")
    return client[0] if client else ""


__all__ = ["attribute_call", "header", "scope_peer"]
