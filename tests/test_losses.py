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


LAG = torch.tensor([[1, 0, 2, 1]])  # versions behind the trainer per token: tokens 0 and 2 are stale


@pytest.mark.parametrize("name", ["ppo", "cispo", "importance_sampling"])
def test_stale_tokens_get_the_truncated_importance_weight_and_current_ones_stay_as_they_were(name):
    """``truncated_is``: a stale token's ratio is taken against the trainer's own detached logprobs and its loss
    weighed by min(pi/pi_behaviour, cap); a token of the current version gets exactly the loss it had."""
    ratios = [4.0, 0.5, 1.5, 0.7]
    logp, plain_logp = current(ratios), current(ratios)
    params = LossParams(stale_correction="truncated_is", stale_cap=2.0)
    loss, metrics = LOSSES.get(name)(logp, OLD, ADV, MASK, params, lag_BT=LAG)
    plain, _ = LOSSES.get(name)(plain_logp, OLD, ADV, MASK, LossParams())
    loss.backward()
    plain.backward()
    assert logp.grad[0, 1].item() == pytest.approx(plain_logp.grad[0, 1].item())  # the current token: unchanged
    # stale tokens: ratio 1 against the proximal policy (no clipping), d/dlogp of -(w * r * A) = -w * A
    # (cispo: -(w * 1 * A * logp) also -w * A); w = min(4, 2) = 2 for token 0, min(1.5, 2) = 1.5 for token 2
    assert logp.grad[0, 0].item() == pytest.approx(-2.0 / 3)
    assert logp.grad[0, 2].item() == pytest.approx(1.5 / 3)
    assert logp.grad[0, 3].item() == 0.0  # masked, though stale
    assert metrics["stale_token_fraction"] == pytest.approx(2 / 3)
    assert metrics["stale_weight_mean"] == pytest.approx((2.0 + 1.5) / 2)
    assert metrics["stale_weight_changed_fraction"] == pytest.approx(0.5)  # token 0 was truncated


def test_masked_is_leaves_stale_tokens_beyond_the_cap_out_and_none_changes_nothing():
    ratios = [4.0, 0.5, 1.5, 0.7]
    logp = current(ratios)
    loss, metrics = LOSSES.get("ppo")(logp, OLD, ADV, MASK, LossParams(stale_correction="masked_is"), lag_BT=LAG)
    loss.backward()
    assert logp.grad[0, 0].item() == 0.0  # w = 4 > cap 2: out of the gradient
    assert logp.grad[0, 2].item() == pytest.approx(1.5 / 3)  # w = 1.5 kept whole
    assert metrics["stale_weight_mean"] == pytest.approx(0.75)
    same, plain = current(ratios), current(ratios)
    with_lag, m = LOSSES.get("ppo")(same, OLD, ADV, MASK, LossParams(stale_correction="none"), lag_BT=LAG)
    without, _ = LOSSES.get("ppo")(plain, OLD, ADV, MASK, LossParams())
    assert with_lag.item() == without.item() and m["stale_token_fraction"] == pytest.approx(2 / 3)
    with pytest.raises(KeyError, match="unknown stale-token correction 'clip'; known: masked_is, none, truncated_is"):
        LossParams(stale_correction="clip")
    with pytest.raises(ValueError, match="stale_cap must be >= 1, got 0.5"):
        LossParams(stale_cap=0.5)


def test_bounds_must_bracket_one():
    with pytest.raises(ValueError, match="clip_low is a ratio bound.*1.5"):
        LOSSES.get("ppo")(current(), OLD, ADV, MASK, LossParams(clip_low=1.5))
    with pytest.raises(ValueError, match="clip_high is a ratio bound.*0.5"):
        LOSSES.get("cispo")(current(), OLD, ADV, MASK, LossParams(clip_high=0.5))
    with pytest.raises(ValueError, match="aggregation"):
        LossParams(aggregation="sum")
