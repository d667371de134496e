"""Training diagnostics: rules that read a run's metric history and name the first fix.

``diagnose(history, knobs)`` runs every rule in ``RULES`` over a list of
per-step metric dicts, under the names the training loop logs them
(``rollout/reward/mean``, ``val/reward/mean``, ``analysis/zero_adv_frac``,
``rollout/truncated_frac``, ``failures/permanent_rate``,
``val/reward/base_success``, ``train/nonfinite_skipped``,
``rollout/template_drift_frac``), and the run's configuration knobs
(``knobs_from_config``). A rule is a small function returning a ``Diagnosis``
or None; adding one is a function and a ``@RULES.register`` line.

Rewards are assumed to lie in ``[0, reward_max]`` (knob ``reward_max``,
default 1.0), as mtrl's success threshold does.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from .registry import Registry

# -- thresholds (each with the reason for its value) -------------------------------------------

WINDOW = 5  # steps averaged before comparing: one step's batch mean is noisy at small batch sizes
MIN_FLAT_STEPS = 5  # a reward pinned for 5 steps from the start is not bad luck
FLAT_TOL = 0.01  # a spread under 1 success in 100 rollouts: the reward is not moving at all
ZERO_ADV_MAX = 0.5  # over half the groups score alike: over half the batch gives no gradient
TRAIN_RISE_MIN = 0.1  # training reward must have risen this much for "rising" to mean anything
VAL_SHARE_MIN = 0.25  # validation keeping under a quarter of training's gain is not generalizing
COLLAPSE_PEAK_MIN = 0.1  # the run must have reached this reward for a "collapse" to be one
COLLAPSE_RATIO = 0.1  # falling to a tenth of the peak is "about 0" for rewards in [0, 1]
STALL_WINDOW = 10  # steps without a new best before a plateau counts as a stall
STALL_MIN_GAIN = 0.02  # a smaller improvement of the best windowed reward is noise
SATURATION = 0.95  # a reward above 95% of reward_max is done, not stalled
TRUNCATED_MAX = 0.05  # more than 5% of responses at the token cap: truncation shapes the reward
FAILED_MAX = 0.01  # more than 1% permanent failures is a bug, not flakiness
DRIFT_MAX = 0.01  # over 1% of trained tokens unlike the deployment rendering: training teaches another context
ONSET_WINDOW = 3  # steps per window; the hack-onset rule compares the last three windows
ONSET_ACCEL = 2.0  # the latest window's rise is at least twice the one before: accelerating, not a steady drift
ENTROPY_ONSET_MIN = 0.05  # nats per token: a smaller rise is sampling noise at small batches
KL_ONSET_MIN = 0.01  # nats per token of KL to the reference
REWARD_ONSET_MIN = 0.05  # the reward rose at least this much over the same window: the new behaviour pays

REWARD = "rollout/reward/mean"
VALID_REWARD = "rollout/reward/valid_mean"  # SageMaker's meaning: mean over the groups with non-zero advantage
VAL_REWARD = "val/reward/mean"
ZERO_ADV = "analysis/zero_adv_frac"  # share of the step's groups whose advantages were all zero
TRUNCATED = "rollout/truncated_frac"
FAILED = "failures/permanent_rate"  # failures left after the group policy, per rollout slot
BASE_SUCCESS = "val/reward/base_success"
TEMPLATE_DRIFT = "rollout/template_drift_frac"  # trained tokens unlike what deployment renders, over trained tokens
TRIPPED = "rollout/flagged/tripwire_tripped"  # the step's rollouts that tripped a tripwire (advanced.tripwires)
TRIPWIRES = "rollout/tripwires/"  # + a wire's name: the step's rollouts that wire tripped on
VAL_TRIPWIRES = "val/tripwires/"  # the same in a validation pass (tripped_frac, and each wire's count)
ENTROPY = "policy/entropy"  # mean surprisal of the sampled tokens (from the logprobs recorded at generation)
KL_REF = "train/kl_ref"  # KL of the policy to its reference (kl_coef > 0, or advanced.measure_kl_ref)
NONFINITE_SKIPPED = "train/nonfinite_skipped"  # 1.0 on a step whose update was skipped for a NaN or infinity


class Severity(str, enum.Enum):
    ERROR = "error"  # the run cannot learn, or learns the wrong thing, until this is fixed
    WARNING = "warning"  # the run learns less than it could


@dataclass(frozen=True)
class Diagnosis:
    """One finding: which rule, how bad, what was seen, and the first thing to change."""

    rule: str
    severity: Severity
    message: str
    first_fix: str
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"[{self.severity.value}] {self.rule}: {self.message}\n    first fix: {self.first_fix}"


class History:
    """A metric history: per-step dicts, read as (step, value) series with missing values skipped."""

    def __init__(self, steps: Sequence[Mapping[str, Any]]) -> None:
        for i, entry in enumerate(steps):
            if not isinstance(entry, Mapping):
                raise TypeError(f"history[{i}] must be a dict of metrics, got {type(entry).__name__}")
        self._steps = list(steps)

    def series(self, name: str) -> list[tuple[int, float]]:
        out = []
        for i, entry in enumerate(self._steps):
            value = entry.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"history[{i}][{name!r}] must be a number, got {value!r}")
            if math.isfinite(value):
                out.append((int(entry.get("step", i)), float(value)))
        return out

    def values(self, name: str) -> list[float]:
        return [v for _, v in self.series(name)]

    def latest(self) -> tuple[int, Mapping[str, Any]] | None:
        """The last step's number and metrics (None for an empty history)."""
        if not self._steps:
            return None
        entry = self._steps[-1]
        return int(entry.get("step", len(self._steps) - 1)), entry


Rule = Callable[[History, Mapping[str, Any]], "Diagnosis | None"]
RULES: Registry[Rule] = Registry("diagnostic rule")


def diagnose(
    history: Sequence[Mapping[str, Any]],
    knobs: Mapping[str, Any] | None = None,
    *,
    rules: Sequence[str] | None = None,
) -> list[Diagnosis]:
    """Every finding of the named rules (all by default), errors first."""
    h = History(history)
    knobs = knobs or {}
    found = [d for name in (rules or RULES.names()) if (d := RULES.get(name)(h, knobs)) is not None]
    return sorted(found, key=lambda d: (d.severity is not Severity.ERROR, d.rule))


def knobs_from_config(config: Any) -> dict[str, Any]:
    """The configuration values the rules read, from an ``MtrlConfig``."""
    core, adv = config.core, config.advanced
    return {
        "group_size": core.group_size,
        "train_batch_size": core.train_batch_size,
        "learning_rate": core.learning_rate,
        "loss_fn": core.loss_fn,
        "lora_rank": core.lora_rank,
        "lora_alpha": core.lora_alpha,
        "full_finetune": adv.full_finetune,
        "sampling_max_tokens": core.sampling_params.max_tokens,
        "max_turns": core.max_turns,
        "max_steps_off_policy": adv.async_config.max_steps_off_policy if adv.async_config.enabled else 0,
        "dynamic_sampling": adv.dynamic_sampling.enabled,
        "reward_max": core.success_threshold if core.success_threshold > 0 else 1.0,
        "history_training": adv.history_training,
    }


# -- rules ---------------------------------------------------------------------------------------


@RULES.register("reward_flat_from_start")
def reward_flat_from_start(h: History, knobs: Mapping[str, Any]) -> Diagnosis | None:
    rewards = h.values(REWARD)
    if len(rewards) < MIN_FLAT_STEPS or max(rewards) - min(rewards) > FLAT_TOL:
        return None
    return Diagnosis(
        "reward_flat_from_start", Severity.ERROR,
        f"{REWARD} has stayed at {rewards[0]:.3f} for all {len(rewards)} steps since step 0",
        "check the agent's output format against the reward parser: run one rollout, print the final "
        "answer and what the reward function extracts from it",
        {"steps": len(rewards), "value": rewards[0], "spread": max(rewards) - min(rewards)},
    )


@RULES.register("zero_advantage_groups")
def zero_advantage_groups(h: History, knobs: Mapping[str, Any]) -> Diagnosis | None:
    fractions = h.values(ZERO_ADV)[-WINDOW:]
    if len(fractions) < min(WINDOW, 3) or _mean(fractions) <= ZERO_ADV_MAX:
        return None
    g, b = knobs.get("group_size"), knobs.get("train_batch_size")
    shape = f" (now group_size={g}, train_batch_size={b}: try {max(2, g // 2)} and {b * 2})" if g and b else ""
    rewards = h.values(REWARD)[-WINDOW:]
    level = f"; mean reward {_mean(rewards):.2f}" if rewards else ""
    refill = "" if knobs.get("dynamic_sampling") else \
        "; or set advanced.dynamic_sampling.enabled: true (each step refills its batch with other tasks)"
    return Diagnosis(
        "zero_advantage_groups", Severity.WARNING,
        f"{_mean(fractions):.0%} of groups score all alike over the last {len(fractions)} steps{level}: "
        "those groups contribute no gradient",
        "lower group_size and raise train_batch_size (more distinct tasks per step at the same cost)"
        f"{shape}; or make the reward denser (partial credit) so rollouts of one task differ{refill}",
        {"zero_adv_groups": _mean(fractions), "group_size": g, "train_batch_size": b},
    )


@RULES.register("reward_hacking")
def reward_hacking(h: History, knobs: Mapping[str, Any]) -> Diagnosis | None:
    train, val = h.series(REWARD), h.values(VAL_REWARD)
    if len(train) < 2 * WINDOW or len(val) < 3:
        return None
    train_rise = _mean(v for _, v in train[-WINDOW:]) - _mean(v for _, v in train[:WINDOW])
    val_rise = _mean(val[-2:]) - val[0]
    if train_rise < TRAIN_RISE_MIN or val_rise >= VAL_SHARE_MIN * train_rise:
        return None
    best_steps = [s for s, _ in sorted(train, key=lambda sv: -sv[1])[:3]]
    named = knobs.get("top_rollout_ids") or []
    where = f"rollouts {', '.join(named)}" if named else f"the highest-reward rollouts of steps {best_steps}"
    return Diagnosis(
        "reward_hacking", Severity.ERROR,
        f"training reward rose by {train_rise:+.2f} while validation moved {val_rise:+.2f}: "
        "the policy may be exploiting the reward instead of solving the task",
        f"read {where} (MLflow traces): check each really solves its task, then tighten the reward "
        "or the environment where it does not",
        {"train_rise": train_rise, "val_rise": val_rise, "best_steps": best_steps, "rollouts": list(named)},
    )


@RULES.register("reward_collapse")
def reward_collapse(h: History, knobs: Mapping[str, Any]) -> Diagnosis | None:
    found = _collapse(h.series(REWARD))
    if found is None:
        return None
    peak, peak_step, recent = found
    off_policy, loss = knobs.get("max_steps_off_policy") or 0, knobs.get("loss_fn")
    if off_policy > 0:
        fix = f"set advanced.async_config.max_steps_off_policy to 0 (now {off_policy}): train on-policy"
        if loss == "cispo":
            fix += "; if it still collapses, switch loss_fn from cispo to ppo"
    elif loss == "cispo":
        fix = "switch loss_fn from cispo to ppo: its tight clipping bounds each update"
    else:
        lr = knobs.get("learning_rate")
        fix = f"lower learning_rate (now {lr}) by 4x" if lr else "lower learning_rate by 4x"
        fix += f" and resume from the checkpoint nearest step {peak_step}"
    return Diagnosis(
        "reward_collapse", Severity.ERROR,
        f"{REWARD} reached {peak:.2f} (around step {peak_step}) and has collapsed to {recent:.2f}",
        fix,
        {"peak": peak, "peak_step": peak_step, "recent": recent, "max_steps_off_policy": off_policy, "loss_fn": loss},
    )


@RULES.register("stall_with_healthy_knobs")
def stall_with_healthy_knobs(h: History, knobs: Mapping[str, Any]) -> Diagnosis | None:
    series = h.series(REWARD)
    if len(series) < STALL_WINDOW + WINDOW or knobs.get("full_finetune"):
        return None
    means = _window_means([v for _, v in series])  # means[i]: mean of steps i .. i+WINDOW-1
    split = len(series) - STALL_WINDOW - WINDOW + 1  # windows ending before the stall window starts
    best_before, best_recent = max(means[:split]), max(means[split:])
    recent = means[-1]
    reward_max = float(knobs.get("reward_max", 1.0))
    values = [v for _, v in series]
    if (best_recent - best_before >= STALL_MIN_GAIN
            or max(values) - min(values) <= FLAT_TOL  # never moved: reward_flat_from_start's case
            or recent >= SATURATION * reward_max
            or _collapse(series) is not None
            or not _healthy(h)):
        return None
    rank, alpha = knobs.get("lora_rank"), knobs.get("lora_alpha")
    doubled = f": lora_rank {rank} -> {2 * rank}, lora_alpha {alpha} -> {2 * alpha}" if rank and alpha else ""
    evidence = {"best_before": best_before, "best_recent": best_recent, "lora_rank": rank}
    message = (f"{REWARD} has not improved for {STALL_WINDOW} steps (best {best_before:.2f} before, "
               f"{best_recent:.2f} since) while groups, truncation and failures look healthy")
    fix = f"double the LoRA capacity{doubled} (alpha/rank unchanged)"
    # SageMaker's stall symptom: valid_mean (groups with signal) below mean means the groups without signal are
    # the solved ones, so the update only ever sees the hard tasks; capacity is not what is missing then.
    valid = h.values(VALID_REWARD)[-WINDOW:]
    gap = recent - _mean(valid) if valid else 0.0
    if gap > STALL_MIN_GAIN:
        evidence["valid_mean_gap"] = gap
        message += (f"; {VALID_REWARD} sits {gap:.2f} below the mean: the groups without signal are the "
                    "tasks already solved")
        fix = ("add harder tasks (or drop the solved ones from the dataset); set advanced.dynamic_sampling.enabled: "
               "true so each step refills with groups that still differ")
    return Diagnosis("stall_with_healthy_knobs", Severity.WARNING, message, fix, evidence)


@RULES.register("token_cap")
def token_cap(h: History, knobs: Mapping[str, Any]) -> Diagnosis | None:
    fractions = h.values(TRUNCATED)[-WINDOW:]
    if not fractions or _mean(fractions) <= TRUNCATED_MAX:
        return None
    cap = knobs.get("sampling_max_tokens")
    now = f" (now {cap}; try {2 * cap})" if cap else ""
    return Diagnosis(
        "token_cap", Severity.WARNING,
        f"{_mean(fractions):.1%} of responses stop at the per-turn token cap (over {TRUNCATED_MAX:.0%}): "
        "cut-off answers and tool calls score as failures",
        f"raise sampling_params.max_tokens{now}",
        {"truncated_frac": _mean(fractions), "sampling_max_tokens": cap},
    )


@RULES.register("template_drift")
def template_drift(h: History, knobs: Mapping[str, Any]) -> Diagnosis | None:
    fractions = h.values(TEMPLATE_DRIFT)[-WINDOW:]
    if not fractions or _mean(fractions) <= DRIFT_MAX:
        return None
    fix = ("set advanced.history_training: deployed (each turn trained in the context deployment renders)"
           if knobs.get("history_training", "extend") == "extend" else
           "run `mtrl check template` on the run's store to see the first difference")
    return Diagnosis(
        "template_drift", Severity.WARNING,
        f"{_mean(fractions):.1%} of trained tokens differ from what the deployment template renders (over "
        f"{DRIFT_MAX:.0%}): the template rewrites history (drops earlier reasoning, adds call ids), so the policy "
        "is trained in contexts it will not see when deployed",
        fix,
        {"template_drift_frac": _mean(fractions)},
    )


@RULES.register("rollout_failures")
def rollout_failures(h: History, knobs: Mapping[str, Any]) -> Diagnosis | None:
    fractions = h.values(FAILED)[-WINDOW:]
    if not fractions or _mean(fractions) <= FAILED_MAX:
        return None
    return Diagnosis(
        "rollout_failures", Severity.ERROR,
        f"{_mean(fractions):.1%} of rollouts fail permanently (over {FAILED_MAX:.0%})",
        "treat it as an environment bug, not a retry problem: read the error of the failed rollouts in the "
        "trajectory store and fix the tool or environment that raises (more retries only hide it)",
        {"failed_frac": _mean(fractions)},
    )


@RULES.register("base_zero_success")
def base_zero_success(h: History, knobs: Mapping[str, Any]) -> Diagnosis | None:
    base = h.values(BASE_SUCCESS)
    if not base or base[0] > 0:
        return None
    return Diagnosis(
        "base_zero_success", Severity.ERROR,
        "the base model solved no validation task before training: every group scores alike, so there is "
        "nothing to reinforce",
        "simplify the task or give examples (a worked example in the system prompt, easier tasks first) "
        "until the base model succeeds sometimes",
        {"base_success": base[0]},
    )


@RULES.register("nonfinite_update_skipped")
def nonfinite_update_skipped(h: History, knobs: Mapping[str, Any]) -> Diagnosis | None:
    skipped = [step for step, value in h.series(NONFINITE_SKIPPED) if value > 0]
    if not skipped:
        return None
    return Diagnosis(
        "nonfinite_update_skipped", Severity.ERROR,
        f"{len(skipped)} update(s) skipped because an advantage, the loss or a gradient was not a finite number "
        f"(steps {', '.join(map(str, skipped[:10]))}); the weights were left unchanged",
        "read the trainer's log line for the step: it names the rollouts responsible; check their rewards and "
        "logprobs, and lower learning_rate or max_grad_norm if the loss itself overflowed",
        {"skipped_steps": skipped},
    )


@RULES.register("hack_onset")
def hack_onset(h: History, knobs: Mapping[str, Any]) -> Diagnosis | None:
    """Entropy or KL to the reference rising faster and faster while the reward rises: the shape of a hack's onset.

    A policy that learns the task narrows (entropy falls) and moves from its
    reference at a steady pace; one that found an exploit often jumps: its
    sampled tokens grow surprising, or its distance from the base model
    accelerates, in the same steps its reward climbs.
    """
    reward = _window_means_last(h.values(REWARD), 2)
    if reward is None or reward[1] - reward[0] < REWARD_ONSET_MIN:
        return None
    rising = {name: found for name, minimum in ((ENTROPY, ENTROPY_ONSET_MIN), (KL_REF, KL_ONSET_MIN))
              if (found := _accelerating(h.values(name), minimum)) is not None}
    if not rising:
        return None
    named = list(knobs.get("onset_rollout_ids") or [])
    what = "; ".join(f"{name} {a:.3f} -> {b:.3f} -> {c:.3f}" for name, (a, b, c) in rising.items())
    where = f"rollouts {', '.join(named)} (above the mean reward, highest entropy first)" if named else \
        "the latest step's highest-reward rollouts"
    return Diagnosis(
        "hack_onset", Severity.WARNING,
        f"{what} over the last {3 * ONSET_WINDOW} steps (windows of {ONSET_WINDOW}), rising faster each window, "
        f"while {REWARD} rose {reward[1] - reward[0]:+.2f}: the pattern of a reward hack's onset",
        f"read {where} in MLflow: check each solves its task the intended way; declare what it must not do as "
        "advanced.tripwires, and set advanced.kl_coef > 0 to hold the policy near its reference",
        {"signals": {name: list(v) for name, v in rising.items()}, "reward_rise": reward[1] - reward[0],
         "rollouts": named},
    )


@RULES.register("tripwire")
def tripwire(h: History, knobs: Mapping[str, Any]) -> Diagnosis | None:
    """A rollout of the latest step (training or validation) did what a tripwire forbids: name the wire and rollouts."""
    last = h.latest()
    if last is None:
        return None
    step, latest = last
    wires = {k[len(TRIPWIRES):]: float(v) for k, v in latest.items() if k.startswith(TRIPWIRES) and v}
    wires.update({k[len(VAL_TRIPWIRES):]: float(v) for k, v in latest.items()
                  if k.startswith(VAL_TRIPWIRES) and k != VAL_TRIPWIRES + "tripped_frac" and v})
    if not wires:
        return None
    named = list(knobs.get("tripped_rollout_ids") or [])
    which = ", ".join(f"{name} ({int(n)} rollout{'s' if n != 1 else ''})" for name, n in sorted(wires.items()))
    where = f": rollouts {', '.join(named)}" if named else ""
    return Diagnosis(
        "tripwire", Severity.ERROR,
        f"step {step}: tripwire{'s' if len(wires) > 1 else ''} {which} tripped{where}: the policy did what the "
        "environment forbids (a likely reward hack)",
        "read the evidence in <run_dir>/tripwires.jsonl and those rollouts' MLflow traces (tag mtrl.tripwires); "
        "close the hole in the environment (remove the tool or the value it exposes) rather than relying on the "
        "zeroed reward, and set advanced.tripwires.stop_rate to stop a run whose policy keeps at it",
        {"wires": wires, "rollouts": named, "step": step},
    )


# -- helpers -------------------------------------------------------------------------------------


def _collapse(series: list[tuple[int, float]]) -> tuple[float, int, float] | None:
    """(peak window mean, its first step, recent window mean) when the reward fell to about 0."""
    if len(series) < 2 * WINDOW:
        return None
    values = [v for _, v in series]
    means = _window_means(values[:-WINDOW])
    peak_i = max(range(len(means)), key=means.__getitem__)
    peak, recent = means[peak_i], _mean(values[-WINDOW:])
    if peak < COLLAPSE_PEAK_MIN or recent > COLLAPSE_RATIO * peak:
        return None
    return peak, series[peak_i][0], recent


def _healthy(h: History) -> bool:
    """No other rule's signal in the recent window: groups vary, little truncation, no failures."""
    checks = ((ZERO_ADV, ZERO_ADV_MAX), (TRUNCATED, TRUNCATED_MAX), (FAILED, FAILED_MAX))
    return all(_mean(v) <= limit for name, limit in checks if (v := h.values(name)[-WINDOW:]))


def _window_means_last(values: Sequence[float], n: int) -> list[float] | None:
    """The means of the last ``n`` windows of ``ONSET_WINDOW`` steps, oldest first (None: too few steps)."""
    if len(values) < n * ONSET_WINDOW:
        return None
    tail = list(values)[-n * ONSET_WINDOW:]
    return [_mean(tail[i * ONSET_WINDOW:(i + 1) * ONSET_WINDOW]) for i in range(n)]


def _accelerating(values: Sequence[float], minimum: float) -> tuple[float, float, float] | None:
    """Three window means when the last rise is at least ``minimum`` and ``ONSET_ACCEL`` times the one before."""
    means = _window_means_last(values, 3)
    if means is None:
        return None
    a, b, c = means
    if c - b >= minimum and c - b >= ONSET_ACCEL * max(b - a, 0.0):
        return a, b, c
    return None


def _window_means(values: Sequence[float]) -> list[float]:
    return [_mean(values[i: i + WINDOW]) for i in range(len(values) - WINDOW + 1)]


def _mean(values: Any) -> float:
    values = list(values)
    return math.fsum(values) / len(values)


__all__ = [
    "BASE_SUCCESS",
    "COLLAPSE_PEAK_MIN",
    "COLLAPSE_RATIO",
    "DRIFT_MAX",
    "ENTROPY",
    "ENTROPY_ONSET_MIN",
    "FAILED",
    "FAILED_MAX",
    "FLAT_TOL",
    "KL_ONSET_MIN",
    "KL_REF",
    "MIN_FLAT_STEPS",
    "NONFINITE_SKIPPED",
    "ONSET_ACCEL",
    "ONSET_WINDOW",
    "REWARD",
    "REWARD_ONSET_MIN",
    "RULES",
    "SATURATION",
    "STALL_MIN_GAIN",
    "STALL_WINDOW",
    "TEMPLATE_DRIFT",
    "TRAIN_RISE_MIN",
    "TRIPPED",
    "TRIPWIRES",
    "TRUNCATED",
    "TRUNCATED_MAX",
    "VAL_REWARD",
    "VALID_REWARD",
    "VAL_SHARE_MIN",
    "VAL_TRIPWIRES",
    "WINDOW",
    "ZERO_ADV",
    "ZERO_ADV_MAX",
    "Diagnosis",
    "History",
    "Rule",
    "Severity",
    "diagnose",
    "knobs_from_config",
]
