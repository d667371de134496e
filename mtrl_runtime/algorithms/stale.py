"""Corrections for tokens an older policy version generated: a registry of small pure weight functions.

In an asynchronous run a sample's tokens may come from versions older than
the one being trained: whole turns under bounded staleness, and, with
partial rollouts, the first part of a turn that new weights finished. For
such a token (``lag`` > 0 versions behind) the loss's ratio is taken
against the trainer's own detached logprobs (the proximal policy; one
optimizer step per batch, so pi_prox = pi_theta in value), and its loss is
multiplied by a detached weight computed here from the per-token
importance ratio against the behaviour policy that sampled it,
w = pi_prox / pi_behaviour (decoupled PPO, as AReaL trains stale
samples). Tokens of the current version keep the loss as it is.

Each correction is ``fn(log_w_BT, cap) -> weight_BT | None`` on detached
tensors (None: leave the stale tokens to the loss as it is):

- ``none``: no correction; stale tokens are trained as the loss trains any
  (their ratio against the behaviour logprobs).
- ``truncated_is``: w truncated from above, min(w, cap) (truncated
  importance sampling; cap 2 is the published default of the TIS fix for
  engine/trainer mismatch).
- ``masked_is``: w where 1/cap <= w <= cap, 0 elsewhere: a token its
  generating policy and the current one disagree on beyond the cap is left
  out of the gradient rather than down-weighted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from ..registry import Registry

if TYPE_CHECKING:  # tensor methods only: the registry's names load without torch
    import torch

StaleCorrection = Callable[["torch.Tensor", float], "torch.Tensor | None"]
STALE_CORRECTIONS: Registry[StaleCorrection] = Registry("stale-token correction")


@STALE_CORRECTIONS.register("none")
def none(log_w_BT: torch.Tensor, cap: float) -> None:
    """No weight: stale tokens are trained as the loss trains every token."""
    return None


@STALE_CORRECTIONS.register("truncated_is")
def truncated_is(log_w_BT: torch.Tensor, cap: float) -> torch.Tensor:
    """min(pi_prox / pi_behaviour, cap) per token."""
    return log_w_BT.exp().clamp(max=cap)


@STALE_CORRECTIONS.register("masked_is")
def masked_is(log_w_BT: torch.Tensor, cap: float) -> torch.Tensor:
    """pi_prox / pi_behaviour where it lies in [1/cap, cap], else 0 (the token leaves the gradient)."""
    w = log_w_BT.exp()
    return w * ((w >= 1.0 / cap) & (w <= cap)).to(w.dtype)


__all__ = ["STALE_CORRECTIONS", "StaleCorrection", "masked_is", "none", "truncated_is"]
