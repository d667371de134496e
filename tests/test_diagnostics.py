"""Each diagnostic rule on synthetic histories that should and should not trigger it."""

from __future__ import annotations

import pytest

from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.diagnostics import RULES, Diagnosis, History, Severity, diagnose, knobs_from_config

KNOBS = knobs_from_config(MtrlConfig())  # group_size 8, batch 128, lora 32/64, ppo, max_tokens 4096, on-policy


def history(rewards, *, val=None, zero_adv=0.2, truncated=0.01, failed=0.0, base=0.25):
    """Per-step dicts; ``val`` maps step -> val/reward/mean (validation runs only some steps)."""
    steps = []
    for i, r in enumerate(rewards):
        entry = {
            "step": i,
            "rollout/reward/mean": r,
            "analysis/zero_adv_frac": zero_adv[i] if isinstance(zero_adv, list) else zero_adv,
            "rollout/truncated_frac": truncated[i] if isinstance(truncated, list) else truncated,
            "failures/permanent_rate": failed[i] if isinstance(failed, list) else failed,
            "rollout/turns/mean": 3.0,
            "rollout/tokens/response_max": 900,
        }
        if i == 0 and base is not None:
            entry["val/reward/base_success"] = base
        if val and i in val:
            entry["val/reward/mean"] = val[i]
        steps.append(entry)
    return steps


def rising(n, start, end):
    return [start + (end - start) * i / (n - 1) for i in range(n)]


def only(found: list[Diagnosis], rule: str) -> Diagnosis:
    matching = [d for d in found if d.rule == rule]
    assert len(matching) == 1, [d.rule for d in found]
    return matching[0]


def test_a_healthy_run_has_no_findings():
    rewards = rising(30, 0.2, 0.7)
    val = {s: 0.15 + 0.5 * s / 29 for s in range(0, 30, 5)}
    assert diagnose(history(rewards, val=val), KNOBS) == []


# -- reward flat from step 0 -------------------------------------------------------------------


def test_reward_flat_from_start_triggers():
    d = only(diagnose(history([0.0] * 6, base=None), KNOBS), "reward_flat_from_start")
    assert d.severity is Severity.ERROR
    assert "stayed at 0.000 for all 6 steps" in d.message
    assert "reward parser" in d.first_fix


@pytest.mark.parametrize("rewards", [[0.0] * 4, [0.0, 0.0, 0.0, 0.0, 0.02], rising(8, 0.1, 0.3)])
def test_reward_flat_from_start_does_not_trigger(rewards):
    assert RULES.get("reward_flat_from_start")(_h(rewards), KNOBS) is None


# -- zero-advantage groups dominate ------------------------------------------------------------


def test_zero_advantage_groups_trigger_with_group_and_batch_advice():
    d = only(diagnose(history(rising(8, 0.1, 0.3), zero_adv=0.8), KNOBS), "zero_advantage_groups")
    assert "80% of groups score all alike" in d.message
    assert "lower group_size and raise train_batch_size" in d.first_fix
    assert "now group_size=8, train_batch_size=128: try 4 and 256" in d.first_fix


@pytest.mark.parametrize("zero_adv", [
    [0.5] * 8,  # exactly half: not "dominating"
    [0.9, 0.9, 0.9, 0.2, 0.2, 0.2, 0.2, 0.2],  # it was bad early; the recent window is fine
])
def test_zero_advantage_groups_do_not_trigger(zero_adv):
    assert RULES.get("zero_advantage_groups")(_h(rising(8, 0.1, 0.3), zero_adv=zero_adv), KNOBS) is None
    assert RULES.get("zero_advantage_groups")(_h([0.1, 0.2], zero_adv=[0.9, 0.9]), KNOBS) is None  # too few steps


# -- training reward rising, validation flat (reward hacking) ----------------------------------


def test_reward_hacking_triggers_and_names_the_trajectories():
    steps = history(rising(20, 0.2, 0.8), val={0: 0.3, 5: 0.31, 10: 0.29, 15: 0.3})
    d = only(diagnose(steps, KNOBS), "reward_hacking")
    # train: mean of steps 15-19 minus mean of steps 0-4 = 0.6 * (17 - 2) / 19 = +0.47;
    # val: mean of the last two (0.29, 0.30) minus the first (0.30) = -0.005
    assert "training reward rose by +0.47 while validation moved -0.01" in d.message
    assert "steps [19, 18, 17]" in d.first_fix
    knobs = {**KNOBS, "top_rollout_ids": ["r-17-3", "r-19-0"]}
    assert "read rollouts r-17-3, r-19-0" in RULES.get("reward_hacking")(History(steps), knobs).first_fix


@pytest.mark.parametrize("rewards, val", [
    (rising(20, 0.2, 0.8), {0: 0.3, 5: 0.4, 10: 0.5, 15: 0.6}),  # validation follows training
    (rising(20, 0.2, 0.25), {0: 0.3, 5: 0.3, 10: 0.3, 15: 0.3}),  # training barely moved
    (rising(20, 0.2, 0.8), {0: 0.3, 15: 0.3}),  # too few validation points to call it flat
])
def test_reward_hacking_does_not_trigger(rewards, val):
    assert RULES.get("reward_hacking")(_h(rewards, val=val), KNOBS) is None


# -- reward collapse ---------------------------------------------------------------------------

COLLAPSE = [0.1] * 5 + [0.6] * 5 + [0.02] * 5


def test_reward_collapse_with_async_says_go_on_policy_first():
    knobs = {**KNOBS, "max_steps_off_policy": 2, "loss_fn": "cispo"}
    d = only(diagnose(history(COLLAPSE), knobs), "reward_collapse")
    assert d.severity is Severity.ERROR
    assert "reached 0.60 (around step 5) and has collapsed to 0.02" in d.message
    assert d.first_fix.startswith("set advanced.async_config.max_steps_off_policy to 0 (now 2)")
    assert "cispo to ppo" in d.first_fix


def test_reward_collapse_fix_follows_the_knobs():
    rule = RULES.get("reward_collapse")
    assert rule(_h(COLLAPSE), {**KNOBS, "loss_fn": "cispo"}).first_fix.startswith("switch loss_fn from cispo to ppo")
    assert rule(_h(COLLAPSE), KNOBS).first_fix == (
        "lower learning_rate (now 4e-05) by 4x and resume from the checkpoint nearest step 5")


@pytest.mark.parametrize("rewards", [
    [0.1] * 5 + [0.6] * 5 + [0.4] * 5,  # a dip, not a collapse
    [0.05] * 5 + [0.08] * 5 + [0.0] * 5,  # never learned enough to collapse
    [0.1] * 5 + [0.6] * 4,  # too short to judge
])
def test_reward_collapse_does_not_trigger(rewards):
    assert RULES.get("reward_collapse")(_h(rewards), KNOBS) is None


# -- stall with healthy knobs ------------------------------------------------------------------

STALL = rising(10, 0.1, 0.5) + [0.5 + 0.004 * (-1) ** i for i in range(15)]  # learned, then a plateau


def test_stall_with_healthy_knobs_says_double_lora():
    d = only(diagnose(history(STALL), KNOBS), "stall_with_healthy_knobs")
    assert "has not improved for 10 steps" in d.message
    assert d.first_fix == "double the LoRA capacity: lora_rank 32 -> 64, lora_alpha 64 -> 128 (alpha/rank unchanged)"


@pytest.mark.parametrize("rewards, kwargs, knobs", [
    (rising(22, 0.1, 0.6), {}, {}),  # still improving
    (STALL, {"truncated": 0.2}, {}),  # unhealthy: truncation is the problem (token_cap says so)
    (STALL, {"zero_adv": 0.7}, {}),  # unhealthy: groups without signal
    (STALL, {"failed": 0.05}, {}),  # unhealthy: failures
    ([min(r * 2, 0.97) for r in STALL], {}, {}),  # saturated near reward_max
    (STALL, {}, {"full_finetune": True}),  # no LoRA to grow
    (STALL[:14], {}, {}),  # too short
])
def test_stall_does_not_trigger(rewards, kwargs, knobs):
    assert RULES.get("stall_with_healthy_knobs")(_h(rewards, **kwargs), {**KNOBS, **knobs}) is None


# -- responses at the token cap ----------------------------------------------------------------


def test_token_cap_triggers_and_says_raise_max_tokens():
    d = only(diagnose(history(rising(8, 0.1, 0.4), truncated=0.08), KNOBS), "token_cap")
    assert "8.0% of responses stop at the per-turn token cap" in d.message
    assert d.first_fix == "raise sampling_params.max_tokens (now 4096; try 8192)"


@pytest.mark.parametrize("truncated", [0.05, [0.3, 0.3, 0.3, 0.0, 0.0, 0.0, 0.0, 0.0]])
def test_token_cap_does_not_trigger(truncated):
    assert RULES.get("token_cap")(_h(rising(8, 0.1, 0.4), truncated=truncated), KNOBS) is None


# -- trained tokens unlike the deployment rendering ----------------------------------------------


def _drifting(fractions):
    steps = history(rising(len(fractions), 0.1, 0.4))
    for step, fraction in zip(steps, fractions):
        step["rollout/template_drift_frac"] = fraction
    return steps


def test_template_drift_triggers_and_names_the_history_setting():
    d = only(diagnose(_drifting([0.04] * 6), KNOBS), "template_drift")
    assert d.severity is Severity.WARNING and "4.0% of trained tokens differ from what the deployment template" in d.message
    assert KNOBS["history_training"] == "extend" and "advanced.history_training: deployed" in d.first_fix
    deployed = knobs_from_config(MtrlConfig.coerce({"advanced": {"history_training": "deployed"}}))
    assert "mtrl check template" in only(diagnose(_drifting([0.04] * 6), deployed), "template_drift").first_fix


@pytest.mark.parametrize("fractions", [[0.01] * 6, [0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0], [0.0] * 3])
def test_template_drift_does_not_trigger(fractions):
    assert RULES.get("template_drift")(History(_drifting(fractions)), KNOBS) is None


# -- permanent rollout failures ----------------------------------------------------------------


def test_rollout_failures_trigger_as_an_environment_bug():
    d = only(diagnose(history(rising(8, 0.1, 0.4), failed=0.02), KNOBS), "rollout_failures")
    assert d.severity is Severity.ERROR and "2.0% of rollouts fail permanently" in d.message
    assert "environment bug, not a retry problem" in d.first_fix


def test_rollout_failures_at_or_under_one_percent_do_not_trigger():
    assert RULES.get("rollout_failures")(_h(rising(8, 0.1, 0.4), failed=0.01), KNOBS) is None


# -- base model never succeeds -----------------------------------------------------------------


def test_base_zero_success_triggers():
    d = only(diagnose(history(rising(3, 0.0, 0.1), base=0.0), KNOBS), "base_zero_success")
    assert "simplify the task or give examples" in d.first_fix


@pytest.mark.parametrize("base", [0.05, None])
def test_base_zero_success_does_not_trigger(base):
    assert RULES.get("base_zero_success")(_h(rising(3, 0.0, 0.1), base=base), KNOBS) is None


# -- diagnose itself ---------------------------------------------------------------------------


def test_diagnose_orders_errors_first_and_prints_the_first_fix():
    found = diagnose(history([0.0] * 8, zero_adv=1.0, base=0.0, truncated=0.2), KNOBS)
    assert [d.rule for d in found] == ["base_zero_success", "reward_flat_from_start", "token_cap", "zero_advantage_groups"]
    text = str(found[0])
    assert text.startswith("[error] base_zero_success: ") and "\n    first fix: simplify the task" in text
    assert [d.rule for d in diagnose(history([0.0] * 8, base=0.0), KNOBS, rules=["token_cap", "base_zero_success"])] == [
        "base_zero_success"]
    with pytest.raises(KeyError, match="unknown diagnostic rule 'nope'; known: base_zero_success"):
        diagnose([], KNOBS, rules=["nope"])


def test_diagnose_rejects_malformed_histories():
    with pytest.raises(TypeError, match=r"history\[1\] must be a dict of metrics, got list"):
        diagnose([{}, [0.1]])
    with pytest.raises(ValueError, match=r"history\[0\]\['rollout/reward/mean'\] must be a number, got 'high'"):
        diagnose([{"rollout/reward/mean": "high"}])
    assert diagnose([]) == []
    assert diagnose([{"rollout/reward/mean": None}] * 6) == []  # unlogged steps are skipped


def test_knobs_from_config_reads_the_config():
    config = MtrlConfig.from_dict({"core": {"group_size": 4, "lora_rank": 16, "loss_fn": "cispo"},
                                   "advanced": {"async_config": {"enabled": True, "max_steps_off_policy": 3}}})
    knobs = knobs_from_config(config)
    assert (knobs["group_size"], knobs["lora_rank"], knobs["loss_fn"], knobs["max_steps_off_policy"]) == (4, 16, "cispo", 3)
    assert knobs_from_config(MtrlConfig())["max_steps_off_policy"] == 0


def _h(rewards, **kwargs):
    return History(history(rewards, **kwargs))
