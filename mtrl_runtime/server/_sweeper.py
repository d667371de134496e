"""The serve-mode TTL: a task of the server's lifespan that ends rollouts nobody uses any more.

In ``mtrl serve`` rollouts are opened over HTTP and nothing else ends
them: a client that opens one and goes away would leave it live (memory)
forever. With ``advanced.server.rollout_ttl_s`` set, every rollout that saw
no call and no report for that long is ended ``abandoned`` through the
coordinator's state machine (an ``Abandoned`` event): kept in the store
with its turns, never deleted. The sweep runs every quarter TTL (at most
every 30 s) and stops with the server.
"""

from __future__ import annotations

import asyncio
import logging

from ..coordinator import Coordinator

log = logging.getLogger("mtrl.server")


def sweep_period(ttl_s: float) -> float:
    """How often to look: a quarter of the TTL, between 0.05 s and 30 s."""
    return min(max(ttl_s / 4, 0.05), 30.0)


async def sweep_abandoned(coordinator: Coordinator, ttl_s: float) -> None:
    """Forever (until cancelled): end ``abandoned`` the rollouts idle for ``ttl_s``."""
    while True:
        await asyncio.sleep(sweep_period(ttl_s))
        try:
            ended = await coordinator.abandon_idle(ttl_s)
        except Exception:  # a store error must not stop the sweeping; it is logged, and tried again
            log.exception("mtrl: the rollout TTL sweep failed")
            continue
        if ended:
            log.info("mtrl: %d rollouts abandoned (idle over advanced.server.rollout_ttl_s=%g s)", len(ended), ttl_s)


__all__ = ["sweep_abandoned", "sweep_period"]
