"""Which rollout a model call belongs to, and the credential to check for it: one rule for every protocol.

A call names its rollout by the path prefix ``/rollouts/{id}/...`` or the
``x-mtrl-rollout-id`` header (and, in SageMaker compatibility mode, the
trajectory header). Calls that name none are served only in inference mode,
and then need the run's API key when one is configured. Every wire protocol
(chat completions, and each module of ``server.protocols``) calls
``attribute_call`` before it reads the body, so a stranger learns no schema.
"""

from __future__ import annotations

from typing import Any

from mtrl_adapters.wire import HEADER_ROLLOUT_ID, HEADER_SM_TRAJECTORY_ID

from ..coordinator import Coordinator
from ..errors import BadRequest, Unauthorized
from ._compat_routes import compat_credential
from ._http import api_key_matches, parse_bearer

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
    """
    cfg = coordinator.server_config
    rollout_id = path_rollout_id or header(headers, _HEADER_ROLLOUT)
    if rollout_id is None and cfg.sagemaker_compat:
        rollout_id = header(headers, _HEADER_TRAJECTORY)
    if token is None:
        token = parse_bearer(header(headers, b"authorization"))
    if rollout_id is not None and cfg.sagemaker_compat:
        token = compat_credential(peer, coordinator, rollout_id, token)
    if rollout_id is None:
        if not cfg.inference_mode:
            raise BadRequest(
                f"no rollout named: send the {HEADER_ROLLOUT_ID} header or call under /rollouts/{{id}}/; "
                "calls that name no rollout are served only in inference mode",
                param=HEADER_ROLLOUT_ID,
            )
        if cfg.api_key and not api_key_matches(token, cfg.api_key):
            raise Unauthorized("inference calls need 'Authorization: Bearer <api key>'", param="authorization")
    return rollout_id, token


def scope_peer(scope: dict[str, Any]) -> str:
    """The client's address of an ASGI scope ("" when the server does not know it)."""
    client = scope.get("client")
    return client[0] if client else ""


__all__ = ["attribute_call", "header", "scope_peer"]
