"""Policy losses: a registry of small pure functions on per-token tensors.

Each loss takes ``(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, params)``
and returns ``(loss, metrics)``. ``logprobs_BT`` are the current policy's
log-probabilities of the sampled tokens (with gradient), ``old_logprobs_BT``
the behaviour logprobs the engine recorded (temperature 1), ``mask_BT`` 1 on
generated tokens. The ratio is r = pi_theta / pi_behaviour = exp(logprobs - old).
That signature is written once (``_loss``): each loss's body reads the call's
arguments as one ``LossInputs``, and the ratio losses (``ppo``, ``cispo``,
``importance_sampling``) are written as their objective on the ratio alone
(``_ratio_loss`` does the rest).

Clip thresholds are RATIO BOUNDS for every loss, as SageMaker AI multi-turn
RL's ``clip_low_threshold`` / ``clip_high_threshold`` and Tinker define them:
r is clipped to [clip_low, clip_high] (PPO's 0.8 / 1.2 is epsilon = 0.2).

Options shared by all losses (``LossParams``):

- ``aggregation``: ``token_mean`` (sum over every unmasked token / their
  count; the default) or ``sequence_mean`` (mean over tokens per sequence,
  then over sequences). ``normalizer`` overrides the denominator so that
  micro-batches of one step add up to the loss of the whole step.
- ``kl_coef`` > 0 adds kl_coef * k3(pi_theta || pi_ref) per token, with
  k3 = exp(ref - logp) - (ref - logp) - 1 (with LoRA the reference is the
  base model, adapters disabled).
- ``tis_cap``: truncated importance sampling for engine/trainer mismatch
  and staleness. The proximal policy becomes the trainer's own detached
  logprobs (one optimizer step per batch, so pi_prox = pi_theta in value),
  the loss's ratio is taken against it, and each token's loss is multiplied by
  the detached weight min(pi_prox / pi_behaviour, tis_cap).
- ``stale_correction`` / ``stale_cap``: tokens an older policy version
  generated (``lag_BT`` > 0, versions behind the trainer; async runs and
  partial rollouts) get their ratio against the proximal policy and the
  weight a correction of ``algorithms.stale`` computes from
  pi_prox / pi_behaviour (``truncated_is``: min(w, stale_cap)); with
  ``none`` (the default) they are trained as any token. Tokens of the
  current version are untouched. Every loss takes ``lag_BT`` (None: all
  current).

On-policy distillation (``distill``) takes one more input, the teacher's
log-probabilities of the student's own sampled tokens (``teacher_logprobs_BT``,
scored by the update beside the reference: ``training/update/_teacher.py``).
``distill_coef`` > 0 says the loss needs them; the other losses refuse them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal

from ..registry import Registry
from .stale import STALE_CORRECTIONS

if TYPE_CHECKING:  # the losses use tensor methods only, so the registry's names load without torch
    import torch

LossFn = Callable[..., "tuple[torch.Tensor, dict[str, float]]"]
LOSSES: Registry[LossFn] = Registry("loss function")

LOG_RATIO_LIMIT = 20.0  # exp(20) ~ 5e8: beyond this a ratio is noise, and exp would overflow in bf16


@dataclass(frozen=True)
class LossParams:
    """Options of the losses; ``clip_low`` / ``clip_high`` None means the loss's own default."""

    clip_low: float | None = None
    clip_high: float | None = None
    kl_coef: float = 0.0
    tis_cap: float | None = None
    aggregation: Literal["token_mean", "sequence_mean"] = "token_mean"
    measure_kl_ref: bool = False  # kl_coef 0: still report kl_ref (the update runs the reference policy too)
    distill_coef: float = 0.0  # > 0: the distill loss's weight of the teacher term (the update scores the teacher)
    distill_rl_coef: float = 0.0  # the distill loss's weight of the RL advantage (0: distillation alone)

    @property
    def needs_teacher(self) -> bool:
        """Whether the update must score the teacher's logprobs of the sampled tokens (the distill loss)."""
        return self.distill_coef > 0
    stale_correction: str = "none"  # a name in algorithms.stale.STALE_CORRECTIONS, for tokens with lag > 0
    stale_cap: float = 2.0

    @property
    def needs_reference(self) -> bool:
        """Whether the update must compute the reference policy's logprobs (for the KL term or its metric)."""
        return self.kl_coef > 0 or self.measure_kl_ref

    def __post_init__(self) -> None:
        if self.aggregation not in ("token_mean", "sequence_mean"):
            raise ValueError(f"aggregation must be token_mean or sequence_mean, got {self.aggregation!r}")
        if self.kl_coef < 0:
            raise ValueError(f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.distill_coef < 0:
            raise ValueError(f"distill_coef must be >= 0, got {self.distill_coef}")
        if self.distill_rl_coef < 0:
            raise ValueError(f"distill_rl_coef must be >= 0, got {self.distill_rl_coef}")
        if self.tis_cap is not None and self.tis_cap <= 0:
            raise ValueError(f"tis_cap must be > 0, got {self.tis_cap}")
        if self.stale_correction not in STALE_CORRECTIONS:
            STALE_CORRECTIONS.get(self.stale_correction)  # the error names the value and the known ones
        if self.stale_cap < 1.0:
            raise ValueError(f"stale_cap must be >= 1, got {self.stale_cap}")
        self.bounds(None, None)  # explicit bounds fail here, not at the first step

    @classmethod
    def from_config(cls, advanced: Any) -> "LossParams":
        """From ``MtrlConfig.advanced``."""
        return cls(
            clip_low=advanced.clip_low,
            clip_high=advanced.clip_high,
            kl_coef=advanced.kl_coef,
            tis_cap=advanced.tis_cap,
            aggregation=advanced.loss_aggregation,
            measure_kl_ref=advanced.measure_kl_ref,
            # the teacher term exists only with a teacher to score (the config pairs it with loss_fn: distill)
            distill_coef=advanced.distill_coef if advanced.distill_teacher is not None else 0.0,
            distill_rl_coef=advanced.distill_rl_coef,
            stale_correction=advanced.async_config.correction,
            stale_cap=advanced.async_config.stale_cap,
        )

    def bounds(self, default_low: float | None, default_high: float | None) -> tuple[float | None, float | None]:
        """The ratio bounds to use, checked to bracket 1."""
        low = self.clip_low if self.clip_low is not None else default_low
        high = self.clip_high if self.clip_high is not None else default_high
        if low is not None and not 0.0 <= low <= 1.0:
            raise ValueError(f"clip_low is a ratio bound and must be in [0, 1], got {low}")
        if high is not None and high < 1.0:
            raise ValueError(f"clip_high is a ratio bound and must be >= 1, got {high}")
        return low, high


@dataclass(frozen=True)
class LossInputs:
    """One micro-batch's inputs of a loss: the arguments every loss is called with (see the module docstring)."""

    logprobs_BT: torch.Tensor
    old_logprobs_BT: torch.Tensor
    advantages_BT: torch.Tensor
    mask_BT: torch.Tensor
    params: LossParams
    ref_logprobs_BT: torch.Tensor | None = None
    teacher_logprobs_BT: torch.Tensor | None = None
    normalizer: float | None = None
    lag_BT: torch.Tensor | None = None

    @property
    def mask(self) -> torch.Tensor:
        """``mask_BT`` in the logprobs' dtype."""
        return self.mask_BT.to(self.logprobs_BT.dtype)


# -- shared pieces -------------------------------------------------------------


def _ratio_and_weight(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, params: LossParams, mask: torch.Tensor,
    lag: torch.Tensor | None, metrics: dict[str, float],
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ratio the loss clips, detached per-token weight or None), their metrics added to ``metrics``.

    See the module docstring: ``tis_cap`` weighs every token, the stale correction the tokens with lag > 0
    (replacing the TIS weight there).
    """
    proximal = logprobs.detach()
    log_w = (proximal - old_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # log pi_prox / pi_behaviour
    if params.tis_cap is None:
        ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT).exp()
        weight = None
    else:
        ratio = (logprobs - proximal).exp()
        weight = log_w.exp().clamp(max=params.tis_cap)
        metrics["tis_weight_mean"] = _masked_mean(weight, mask)
        metrics["tis_capped_fraction"] = _masked_mean((weight >= params.tis_cap).to(mask.dtype), mask)
    if lag is None:
        return ratio, weight
    stale = (lag > 0) & (mask > 0)
    metrics["stale_token_fraction"] = _masked_mean(stale.to(mask.dtype), mask)
    stale_weight = STALE_CORRECTIONS.get(params.stale_correction)(log_w, params.stale_cap)
    if stale_weight is None or not bool(stale.any()):
        return ratio, weight
    on_stale = stale.to(mask.dtype)
    metrics["stale_weight_mean"] = _masked_mean(stale_weight, on_stale)
    metrics["stale_weight_changed_fraction"] = _masked_mean((stale_weight != log_w.exp()).to(mask.dtype), on_stale)
    ratio = _where(stale, (logprobs - proximal).exp(), ratio)
    weight = _where(stale, stale_weight, weight if weight is not None else stale_weight.new_ones(()))
    return ratio, weight


def _where(condition: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.where`` through tensor methods (this module imports torch only for type checking)."""
    return a.where(condition, b)


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    return float((x * mask).sum() / mask.sum().clamp(min=1))


def aggregate(
    loss_BT: torch.Tensor, mask_BT: torch.Tensor, aggregation: str, normalizer: float | None = None
) -> torch.Tensor:
    """Reduce per-token losses to a scalar.

    token_mean: sum(loss * mask) / normalizer (default: the number of unmasked
    tokens). sequence_mean: sum over sequences of their token mean / normalizer
    (default: the number of sequences with at least one unmasked token).
    """
    mask = mask_BT.to(loss_BT.dtype)
    if aggregation == "token_mean":
        denom = normalizer if normalizer is not None else mask.sum().clamp(min=1)
        return (loss_BT * mask).sum() / denom
    if aggregation == "sequence_mean":
        tokens_B = mask.sum(-1)
        per_seq = (loss_BT * mask).sum(-1) / tokens_B.clamp(min=1)
        denom = normalizer if normalizer is not None else (tokens_B > 0).sum().clamp(min=1)
        return per_seq.sum() / denom
    raise ValueError(f"aggregation must be token_mean or sequence_mean, got {aggregation!r}")


def _with_kl(loss_BT: torch.Tensor, x: LossInputs, mask: torch.Tensor, metrics: dict[str, float]) -> torch.Tensor:
    """``loss_BT`` plus kl_coef * k3(pi_theta || pi_ref) per token when kl_coef > 0; ``kl_ref`` (the masked mean
    of k3) in ``metrics`` whenever the reference was scored, trained on or only measured (``measure_kl_ref``)."""
    logprobs, ref_logprobs = x.logprobs_BT, x.ref_logprobs_BT
    if x.params.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs_BT (the reference policy's logprobs)")
        delta = ref_logprobs - logprobs
        kl_BT = delta.exp() - delta - 1.0
        metrics["kl_ref"] = _masked_mean(kl_BT.detach(), mask)
        return loss_BT + x.params.kl_coef * kl_BT
    if ref_logprobs is not None:  # measure_kl_ref: the k3 estimate of KL(current || reference), not trained on
        delta = (ref_logprobs - logprobs.detach()).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        metrics["kl_ref"] = _masked_mean(delta.exp() - delta - 1.0, mask)
    return loss_BT


def _finish(
    x: LossInputs, objective_BT: torch.Tensor, weight: torch.Tensor | None, metrics: dict[str, float],
) -> tuple[torch.Tensor, dict[str, float]]:
    """Apply the TIS weight and the KL term, aggregate, and add the shared metrics."""
    mask = x.mask
    loss_BT = -objective_BT
    if weight is not None:
        loss_BT = loss_BT * weight
    loss_BT = _with_kl(loss_BT, x, mask, metrics)
    log_r = (x.logprobs_BT.detach() - x.old_logprobs_BT).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)  # metrics: no graph
    metrics["ratio_mean"] = _masked_mean(log_r.exp(), mask)
    # k3 estimate of KL(behaviour || current), sampled from the behaviour policy
    metrics["approx_kl"] = _masked_mean(log_r.exp() - 1.0 - log_r, mask)
    metrics["tokens"] = float(mask.sum())
    return aggregate(loss_BT, mask, x.params.aggregation, x.normalizer), metrics


# -- the losses ------------------------------------------------------------------


LossBody = Callable[[LossInputs], "tuple[torch.Tensor, dict[str, float]]"]
RatioObjective = Callable[..., "tuple[torch.Tensor, torch.Tensor]"]


def _loss(name: str, *, takes_teacher: bool = False) -> Callable[[LossBody], LossFn]:
    """Register ``body(inputs)`` as the loss ``name``, called as every loss is (the module docstring's signature).

    Only a loss that ``takes_teacher`` accepts ``teacher_logprobs_BT``; the others refuse it.
    """

    def register(body: LossBody) -> LossFn:
        def loss(
            logprobs_BT: torch.Tensor,
            old_logprobs_BT: torch.Tensor,
            advantages_BT: torch.Tensor,
            mask_BT: torch.Tensor,
            params: LossParams = LossParams(),
            *,
            ref_logprobs_BT: torch.Tensor | None = None,
            teacher_logprobs_BT: torch.Tensor | None = None,
            normalizer: float | None = None,
            lag_BT: torch.Tensor | None = None,
        ) -> tuple[torch.Tensor, dict[str, float]]:
            if teacher_logprobs_BT is not None and not takes_teacher:
                raise TypeError(f"teacher_logprobs_BT: the {name} loss takes no teacher (the distill loss does)")
            return body(LossInputs(logprobs_BT, old_logprobs_BT, advantages_BT, mask_BT, params, ref_logprobs_BT,
                                   teacher_logprobs_BT, normalizer, lag_BT))

        # known by the body's name and formula (not functools.wraps: the signature is the loss's, not the body's)
        loss.__name__ = loss.__qualname__ = body.__name__
        loss.__doc__ = body.__doc__
        return LOSSES.register(name)(loss)

    return register


def _ratio_loss(default_low: float | None, default_high: float | None) -> Callable[[RatioObjective], LossBody]:
    """The body of a ratio loss from its objective; its ratio bounds default to these.

    The decorated ``objective(ratio_BT, advantages_BT, logprobs_BT, low, high)`` returns (the objective per
    token, the tokens it clipped as booleans). What every ratio loss does around it is here: the bounds,
    the ratio and the TIS / stale weight (``_ratio_and_weight``), ``clip_fraction`` (the masked share of
    clipped tokens), then the weight, the KL term, the aggregation and the shared metrics (``_finish``).
    """

    def body_of(objective: RatioObjective) -> LossBody:
        def body(x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
            low, high = x.params.bounds(default_low, default_high)
            mask = x.mask
            metrics: dict[str, float] = {}
            ratio, weight = _ratio_and_weight(x.logprobs_BT, x.old_logprobs_BT, x.params, mask, x.lag_BT, metrics)
            objective_BT, clipped_BT = objective(ratio, x.advantages_BT, x.logprobs_BT, low, high)
            metrics["clip_fraction"] = _masked_mean(clipped_BT.to(mask.dtype), mask)
            return _finish(x, objective_BT, weight, metrics)

        body.__name__, body.__doc__ = objective.__name__, objective.__doc__
        return body

    return body_of


@_loss("ppo")
@_ratio_loss(0.8, 1.2)
def ppo(ratio_BT: torch.Tensor, advantages_BT: torch.Tensor, logprobs_BT: torch.Tensor, low: float | None,
        high: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate: loss_t = -min(r A, clip(r, lo, hi) A); default bounds 0.8 / 1.2.

    clip_fraction counts tokens where the clipped branch is the smaller one
    (their gradient is zero).
    """
    unclipped = ratio_BT * advantages_BT
    clipped = ratio_BT.clamp(low, high) * advantages_BT
    return unclipped.minimum(clipped), clipped < unclipped


@_loss("cispo")
@_ratio_loss(0.0, 7.0)
def cispo(ratio_BT: torch.Tensor, advantages_BT: torch.Tensor, logprobs_BT: torch.Tensor, low: float | None,
          high: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (MiniMax-M1, arXiv:2506.13585): loss_t = -sg(clip(r, lo, hi)) * A * log pi_theta.

    Every token keeps a gradient; only the weight is bounded. Default ratio
    bounds [0.0, 7.0]: the published recommendation "1.0 / 6.0" is read in the
    paper's additive convention, eps_low = 1.0 and eps_high = 6.0, so
    r in [1 - 1.0, 1 + 6.0] = [0, 7]. eps_low = 1.0 is how MiniMax-M1 writes "no
    lower bound" (a ratio floor of 1.0 would raise every down-weighted token to
    weight 1). Pass clip_low / clip_high (ratio bounds) to change them.
    clip_fraction counts tokens whose ratio lies outside the bounds.
    """
    clipped = ratio_BT.detach().clamp(low, high)
    return clipped * advantages_BT * logprobs_BT, ratio_BT.detach() != clipped


@_loss("importance_sampling")
@_ratio_loss(None, None)
def importance_sampling(ratio_BT: torch.Tensor, advantages_BT: torch.Tensor, logprobs_BT: torch.Tensor,
                        low: float | None, high: float | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Off-policy REINFORCE: loss_t = -r * A, whose gradient is -r * A * grad log pi_theta.

    No clipping by default; with clip_low / clip_high set the ratio is clamped
    to them (tokens outside get no gradient), and clip_fraction counts those.
    """
    used = ratio_BT.clamp(low, high) if (low is not None or high is not None) else ratio_BT
    return used * advantages_BT, used.detach() != ratio_BT.detach()


@_loss("nll")
def nll(x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """Advantage-weighted negative log-likelihood: loss_t = -A_t * log pi_theta(token_t).

    With A = 1 on demonstrated tokens it is supervised fine-tuning's NLL
    (``mtrl sft``); behaviour logprobs and ratio bounds play no part. The KL
    term is added as for every loss when ``kl_coef`` > 0; ratio settings
    (``clip_low``, ``clip_high``, ``tis_cap``) are refused, not ignored; ``lag_BT`` plays no part (the
    demonstrations are no policy's samples).
    ``nll`` in the metrics is the masked mean of -log pi_theta.
    """
    params = x.params
    named = {k: v for k, v in (("clip_low", params.clip_low), ("clip_high", params.clip_high),
                                ("tis_cap", params.tis_cap)) if v is not None}
    if named:
        key, value = next(iter(named.items()))
        raise ValueError(f"{key} = {value}: the nll loss takes no ratio to clip or weight; leave {key} unset")
    mask = x.mask
    metrics = {"nll": _masked_mean(-x.logprobs_BT.detach(), mask)}
    loss_BT = _with_kl(-x.advantages_BT * x.logprobs_BT, x, mask, metrics)
    metrics["tokens"] = float(mask.sum())
    return aggregate(loss_BT, mask, params.aggregation, x.normalizer), metrics


@_loss("distill", takes_teacher=True)
def distill(x: LossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """On-policy distillation: per-token reverse KL to a teacher, alone or added to the RL advantage.

    On the student's own sampled tokens x_t, k_t = log pi_theta(x_t) - log pi_teacher(x_t) is a one-sample
    estimate of the per-token reverse KL(pi_theta || pi_teacher). The loss is the importance-sampling policy
    gradient of ``importance_sampling`` on the advantage

        A'_t = distill_rl_coef * A_t - distill_coef * sg(k_t)

    so tokens the teacher finds likelier than the student are pushed up, and the others down; with
    ``distill_rl_coef`` 0 it is distillation alone (the RL advantage plays no part), with 1 the teacher term
    shapes the RL advantage token by token. Ratio bounds, ``tis_cap``, ``kl_coef`` and the stale-token
    correction act as for ``importance_sampling``. Metrics: ``distill_reverse_kl`` (the masked mean of k_t) and
    ``teacher_logprob`` (of the teacher's logprobs).
    """
    params, teacher_BT = x.params, x.teacher_logprobs_BT
    if params.distill_coef <= 0 or teacher_BT is None:
        raise ValueError("the distill loss needs a teacher: set advanced.distill_teacher (its logprobs of the "
                         "sampled tokens) and advanced.distill_coef > 0")
    mask = x.mask
    reverse_kl_BT = (x.logprobs_BT.detach() - teacher_BT).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    shaped_BT = params.distill_rl_coef * x.advantages_BT - params.distill_coef * reverse_kl_BT
    loss, metrics = importance_sampling(x.logprobs_BT, x.old_logprobs_BT, shaped_BT, x.mask_BT, params,
                                        ref_logprobs_BT=x.ref_logprobs_BT, normalizer=x.normalizer, lag_BT=x.lag_BT)
    metrics["distill_reverse_kl"] = _masked_mean(reverse_kl_BT, mask)
    metrics["teacher_logprob"] = _masked_mean(teacher_BT, mask)
    return loss, metrics


__all__ = ["LOSSES", "LossFn", "LossInputs", "LossParams", "aggregate", "cispo", "distill", "importance_sampling", "nll",
           "ppo"]
