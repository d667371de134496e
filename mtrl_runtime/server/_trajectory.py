"""SageMaker trajectory ids: ``<rollout_id>.<mac>``, checked before a SigV4 token may act for a rollout.

A verified SigV4 token proves its sender holds the run's AWS secret: it
stands for the run's agents, not for one rollout. mtrl hands each
SageMaker-shaped agent its rollout's trajectory id carrying a MAC keyed by
that rollout's token (``mtrl_adapters.wire.trajectory_id``: ``HttpExecutor``
puts it in ``metadata.trajectory_id`` and in ``model_endpoint``); the agent
echoes it in the trajectory header and in the feedback bodies, as
SageMaker's SDK does with any trajectory id. A SigV4 token acts for a
rollout only when the call names the rollout by such an id, so an agent
cannot report for another rollout it was not handed.
"""

from __future__ import annotations

import hmac

from mtrl_adapters.wire import TRAJECTORY_MAC_HEX, split_trajectory_id, trajectory_mac

from ..coordinator import Coordinator
from ..errors import RolloutNotFound, Unauthorized


def resolve_trajectory(coordinator: Coordinator, value: str, source: str) -> tuple[str, bool]:
    """``(rollout_id, bound)`` for a rollout named by ``value`` (a bare id, or ``<rollout_id>.<mac>``).

    ``bound`` is True when ``value`` carries a MAC and it verifies; a MAC that
    does not verify is a 401 naming ``source`` (where the id came from), an
    unknown rollout a 404.
    """
    rollout_id, mac = split_trajectory_id(value)
    if mac is None:
        return rollout_id, False
    expected_hash = coordinator.token_hash(rollout_id)
    if expected_hash is None:
        raise RolloutNotFound(f"{source}: unknown rollout id {rollout_id!r}", param=source)
    if len(mac) != TRAJECTORY_MAC_HEX or not hmac.compare_digest(
        trajectory_mac(rollout_id, expected_hash).encode(), mac.encode()
    ):
        coordinator.counters.auth_rejected += 1
        raise Unauthorized(
            f"{source}: {value!r} does not carry rollout {rollout_id!r}'s MAC; send the trajectory id mtrl handed "
            "the agent (metadata.trajectory_id of its /rollout request) unchanged",
            param=source,
        )
    return rollout_id, True


__all__ = ["resolve_trajectory"]
