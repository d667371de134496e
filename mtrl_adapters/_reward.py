"""``update_reward`` and ``record_tool_call`` for the rollout the caller runs in.

Both validate their arguments everywhere (a NaN reward is a bug in or out of
training). Outside a rollout there is nothing to record: ``update_reward``
warns once per call site and returns False, so the same agent code runs in
production.
"""

from __future__ import annotations

import warnings
from typing import Any, Mapping, Sequence

from ._context import current_rollout
from ._values import reward_report


def update_reward(reward: float | Sequence[float], metrics: Mapping[str, float] | None = None, *,
                  role_rewards: Mapping[str, float] | None = None) -> bool:
    """Report the current rollout's reward: a finite float, or one float per turn.

    ``metrics`` are named floats stored with the rollout. Repeating the same
    report is fine; a different one after the rollout ended raises
    ``RolloutError`` (status 409), as does a per-turn list longer than the
    rollout's turns (400). A rollout that never reports gets the configured
    default reward and is flagged ``reward_defaulted``. Returns True when
    recorded, False outside a rollout.

    ``role_rewards`` (a run whose ``policy_models`` maps roles to model ids,
    docs/roles.md): each named role's own reward, ``{"planner": 0.5}``; a
    role left out is trained on ``reward``. A role the run does not have is
    refused (400) naming it.

    Called from async agent code, the report is sent in the background (the
    event loop is never blocked), after the reports made before it, and a
    refusal is raised when the rollout closes; ``await aupdate_reward(...)``
    reports and raises at once.
    """
    report = reward_report(reward, metrics, role_rewards)
    ctx = current_rollout()
    if ctx is None:
        warnings.warn("update_reward called outside a rollout: nothing recorded", RuntimeWarning, stacklevel=2)
        return False
    if ctx.owner_loop_running_here():  # async agent: never block its loop; sent before the rollout closes
        ctx.defer(ctx.client().areport_reward(report))
    else:
        ctx.client().report_reward(report)
    return True


async def aupdate_reward(reward: float | Sequence[float], metrics: Mapping[str, float] | None = None, *,
                         role_rewards: Mapping[str, float] | None = None) -> bool:
    """:func:`update_reward` for async code (does not block the event loop)."""
    report = reward_report(reward, metrics, role_rewards)
    ctx = current_rollout()
    if ctx is None:
        warnings.warn("aupdate_reward called outside a rollout: nothing recorded", RuntimeWarning, stacklevel=2)
        return False
    await ctx.client().areport_reward(report)
    return True


def record_tool_call(
    name: str,
    arguments: Any = None,
    *,
    result: Any = None,
    error: str | None = None,
    latency_s: float = 0.0,
    call_id: str | None = None,
    source: str | None = None,
) -> bool:
    """Record a tool call of the current rollout (for agents that run their own tool loop).

    ``call_id`` is the id of the model's tool call (``tool_calls[i].id``);
    it places the call on the turn that asked for it. ``source`` says where
    the tool ran: ``"mcp:<server>"`` for a tool an MCP server served, None
    (the default) for the agent's own. Strands and LangGraph agents need not
    call this: their adapters record every tool call.
    The call is sent to the coordinator now (``RolloutContext.send_tool_calls``), so a
    rollout stopped mid-way keeps it; from an async agent's loop the send runs
    in the background and never blocks it.
    Returns False outside a rollout.
    """
    ctx = current_rollout()
    if ctx is None:
        return False
    ctx.record_tool_call(name, arguments, result=result, error=error, latency_s=latency_s, call_id=call_id,
                         source=source, awaits_text=False)
    ctx.send_tool_calls()  # now, not at the rollout's end: a rollout stopped mid-way keeps it
    return True


__all__ = ["aupdate_reward", "record_tool_call", "update_reward"]
