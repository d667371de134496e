"""Each loss against values and gradients computed by hand on small tensors."""

import math

import pytest
import torch

from mtrl_runtime.algorithms import LOSSES, LossParams, aggregate

OLD = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
RATIOS = [1.5, 0.5, 1.1, 0.7]
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0]])  # the last token is not the model's


def current(ratios=RATIOS, old=OLD):
    """Current logprobs whose ratios to ``old`` are ``ratios``, as a leaf with a gradient."""
    return (old + torch.log(torch.tensor([ratios]))).requires_grad_(True)


def test_registry_names():
    assert LOSSES.names() == ["cispo", "distill", "importance_sampling", "nll", "ppo"]


def test_ppo_clips_at_ratio_bounds():
    logp = current()
    loss, metrics = LOSSES.get("ppo")(logp, OLD, ADV, MASK)
    # token 0: min(1.5*1, 1.2*1) = 1.2 (clipped, no gradient)
    # token 1: min(0.5*1, 0.8*1) = 0.5 (unclipped)
    # token 2: min(1.1*-1, 1.1*-1) = -1.1 (inside the bounds)
    # token 3: masked out. loss = -(1.2 + 0.5 - 1.1) / 3 = -0.2
    assert loss.item() == pytest.approx(-0.2)
    loss.backward()
    # d(-r A / 3)/d logp = -r A / 3 on unclipped tokens
    assert logp.grad[0].tolist() == pytest.approx([0.0, -0.5 / 3, 1.1 / 3, 0.0])
    assert metrics["clip_fraction"] == pytest.approx(1 / 3)
    assert metrics["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1) / 3)
    # k3: r - 1 - log r averaged over the three tokens
    k3 = sum(r - 1 - math.log(r) for r in RATIOS[:3]) / 3
    assert metrics["approx_kl"] == pytest.approx(k3, rel=1e-5)


def test_ppo_custom_bounds():
    logp = current()
    loss, metrics = LOSSES.get("ppo")(logp, OLD, ADV, MASK, LossParams(clip_low=0.4, clip_high=2.0))
    # nothing clipped now: -(1.5 + 0.5 - 1.1) / 3 = -0.3
    assert loss.item() == pytest.approx(-0.3) and metrics["clip_fraction"] == 0.0


def test_cispo_default_bounds_are_0_and_7():
    ratios = [1.5, 0.5, 8.0, 0.7]
    logp = current(ratios)
    loss, metrics = LOSSES.get("cispo")(logp, OLD, ADV, MASK)
    # weights clip(r, 0, 7) = [1.5, 0.5, 7.0]; loss = -sum(w * A * logp) / 3
    lp = [-1 + math.log(r) for r in ratios]
    expected = -(1.5 * 1 * lp[0] + 0.5 * 1 * lp[1] + 7.0 * -1 * lp[2]) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    loss.backward()
    # the weight is stop-gradient: d loss / d logp = -w * A / 3, never zero
    assert logp.grad[0].tolist() == pytest.approx([-1.5 / 3, -0.5 / 3, 7.0 / 3, 0.0])
    assert metrics["clip_fraction"] == pytest.approx(1 / 3)


def test_importance_sampling_is_unclipped_reinforce():
    logp = current()
    loss, _ = LOSSES.get("importance_sampling")(logp, OLD, ADV, MASK)
    # -(1.5 + 0.5 - 1.1) / 3
    assert loss.item() == pytest.approx(-0.3)
    loss.backward()
    # gradient of -r A / 3 is -r A / 3
    assert logp.grad[0].tolist() == pytest.approx([-1.5 / 3, -0.5 / 3, 1.1 / 3, 0.0])


def test_sequence_mean_averages_each_sequence_first():
    loss_BT = torch.tensor([[1.0, 3.0, 100.0], [10.0, 100.0, 100.0]])
    mask_BT = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    # token mean: (1 + 3 + 10) / 3; sequence mean: (mean(1, 3) + 10) / 2 = 6
    assert float(aggregate(loss_BT, mask_BT, "token_mean")) == pytest.approx(14 / 3)
    assert float(aggregate(loss_BT, mask_BT, "sequence_mean")) == pytest.approx(6.0)
    # a normalizer from the whole step replaces the local count
    assert float(aggregate(loss_BT, mask_BT, "token_mean", normalizer=7.0)) == pytest.approx(2.0)


def test_kl_to_reference_uses_k3():
    logp = current([1.0, 1.0, 1.0, 1.0])  # on-policy: the policy term is -mean(A) = -(1 + 1 - 1) / 3
    ref = OLD + torch.tensor([[0.5, -0.5, 0.0, 0.0]])
    loss, metrics = LOSSES.get("importance_sampling")(
        logp, OLD, ADV, MASK, LossParams(kl_coef=0.1), ref_logprobs_BT=ref
    )
    # k3 with d = ref - logp: exp(d) - d - 1 for d = 0.5, -0.5, 0
    kl = [math.exp(0.5) - 1.5, math.exp(-0.5) - 0.5, 0.0]
    assert metrics["kl_ref"] == pytest.approx(sum(kl) / 3, rel=1e-5)
    assert loss.item() == pytest.approx(-1 / 3 + 0.1 * sum(kl) / 3, rel=1e-5)
    with pytest.raises(ValueError, match="ref_logprobs_BT"):
        LOSSES.get("ppo")(logp, OLD, ADV, MASK, LossParams(kl_coef=0.1))


def test_truncated_importance_sampling_weights_by_capped_mismatch():
    # the engine's logprobs are log(4) below the trainer's: mismatch weight 4, capped at 2
    logp = current([4.0, 4.0, 4.0, 4.0])
    loss, metrics = LOSSES.get("ppo")(logp, OLD, ADV, MASK, LossParams(tis_cap=2.0))
    # the ratio is taken against the trainer's own detached logprobs (value 1: no clipping),
    # each token's loss scaled by min(4, 2) = 2: -(2*1 + 2*1 - 2*1) / 3
    assert loss.item() == pytest.approx(-2 / 3)
    loss.backward()
    assert logp.grad[0].tolist() == pytest.approx([-2 / 3, -2 / 3, 2 / 3, 0.0])
    assert metrics["tis_weight_mean"] == pytest.approx(2.0) and metrics["tis_capped_fraction"] == 1.0
    assert metrics["clip_fraction"] == 0.0


def test_bounds_must_bracket_one():
    with pytest.raises(ValueError, match="clip_low is a ratio bound.*1.5"):
        LOSSES.get("ppo")(current(), OLD, ADV, MASK, LossParams(clip_low=1.5))
    with pytest.raises(ValueError, match="clip_high is a ratio bound.*0.5"):
        LOSSES.get("cispo")(current(), OLD, ADV, MASK, LossParams(clip_high=0.5))
    with pytest.raises(ValueError, match="aggregation"):
        LossParams(aggregation="sum")
