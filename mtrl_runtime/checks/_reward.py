"""``mtrl check reward``: is the reward fit to train on, judged on baseline rollouts?

Run before training, on N rollouts of the base model sampled as training
samples them (``sampling_params``, ``group_size`` per task, capped):

- every rollout reports a reward (none defaulted because the agent never called ``update_reward``);
- the reward stays in ``[0, 1]`` (or the declared range, e.g. ``[-1, 1]``); per-turn
  rewards are judged by their sum, the scalar the group-based methods compare;
- it varies across rollouts (a constant reward teaches nothing);
- it varies within groups: the share of groups whose rollouts all score
  alike stays at or under half (those groups give no gradient);
- with a strict scorer: the reward says success wherever the strict scorer
  does, and does not say success where the strict scorer says no (a
  loophole RL would learn);
- the base model has a foothold: some rollout succeeds (strictly, when a
  strict scorer is given). Without one, simplify the task before training.

With a group judge (``--judge JUDGE.yaml``, or ``advanced.group_judge``) the
judge is audited on the same baseline rollouts instead (``_judge``): its
agreement with the strict scorer, position and length bias, variance within
groups, and whether it is fit to train on.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ..config import REWARD_LIMIT, MtrlConfig
from ..diagnostics import ZERO_ADV_MAX
from ..evaluation import (
    EvalPlan,
    StrictComparison,
    StrictScorer,
    as_strict_scorer,
    compare_with_strict,
    run_side,
    run_tag,
    select_tasks,
)
from ..rewards import GroupJudge, JudgeSpec, TurnJudge, refuse_policy_endpoint
from ..rollouts import open_stack
from ..types import Rollout, Task
from ._checklist import CheckItem, Checklist, failed, passed, skipped
from ._judge import DEFAULT_ORDERS, ajudge_groups, judge_checklist
from ._turn_judge import TurnScorer, ajudge_turns, turn_judge_checklist

DEFAULT_MAX_TASKS = 16
DEFAULT_MAX_SAMPLES = 8
_SAME = 1e-9  # rewards closer than this count as equal
_LISTED = 5  # rollouts named in a failed check's detail


def reward_checklist(
    rollouts: Sequence[Rollout],
    tasks: Mapping[str, Task],
    *,
    success_threshold: float = 1.0,
    reward_range: tuple[float, float] = (0.0, 1.0),
    strict_scorer: StrictScorer | Callable[[Any, Any], float] | None = None,
) -> Checklist:
    """The reward checks of the module docstring, over recorded rollouts (grouped by ``group_id``)."""
    if not rollouts:
        raise ValueError("rollouts: the reward checks need baseline rollouts, got none")
    low, high = reward_range
    if not low < high:
        raise ValueError(f"reward_range: expected (low, high) with low < high, got {reward_range!r}")
    scorer = as_strict_scorer(strict_scorer)
    strict = compare_with_strict(rollouts, tasks, scorer, success_threshold) if scorer is not None else None
    items = [
        _reports(rollouts),
        _in_range(rollouts, low, high),
        _varies(rollouts),
        _varies_in_groups(rollouts),
        *_strict_agreement(strict),
        _foothold(rollouts, strict, success_threshold),
    ]
    return Checklist("mtrl check reward", tuple(items))


def _reports(rollouts: Sequence[Rollout]) -> CheckItem:
    name = "every rollout reports a reward"
    missing = [r for r in rollouts if r.reward_defaulted]
    if not missing:
        return passed(name, f"{len(rollouts)} of {len(rollouts)} rollouts reported one")
    errors = [r.error for r in missing if r.error]
    first = f"; first error: {errors[0][:200]}" if errors else ""
    return failed(
        name, f"{len(missing)} of {len(rollouts)} rollouts never called update_reward ({_ids(missing)}){first}",
        "call update_reward at the end of every episode, also when the agent gives up; if the rollouts failed, "
        "fix the error first (a crashing agent or tool is an environment bug)",
        rollouts=[r.id for r in missing],
    )


def _in_range(rollouts: Sequence[Rollout], low: float, high: float) -> CheckItem:
    name = f"reward stays in [{low:g}, {high:g}]"
    rewards = [r.total_reward for r in rollouts]
    outside = [r for r in rollouts if not low <= r.total_reward <= high]
    span = f"min {min(rewards):.3g}, max {max(rewards):.3g}"
    if not outside:
        return passed(name, f"{span} over {len(rollouts)} rollouts")
    return failed(
        name, f"{len(outside)} rollouts outside ({span}): "
              + ", ".join(f"{r.id}={r.total_reward:.3g}" for r in outside[:_LISTED]),
        f"scale or clip the reward into [{low:g}, {high:g}] (success_threshold and the diagnostics assume it); "
        "a reward meant to lie in [-1, 1] is declared with --reward-range -1 1",
        rollouts=[r.id for r in outside],
    )


def _varies(rollouts: Sequence[Rollout]) -> CheckItem:
    name = "reward varies across rollouts"
    rewards = [r.total_reward for r in rollouts]
    if len(rollouts) < 2:
        return skipped(name, "one rollout: nothing to compare")
    if max(rewards) - min(rewards) > _SAME:
        return passed(name, f"{len(set(round(x, 6) for x in rewards))} distinct values over {len(rollouts)} rollouts")
    return failed(
        name, f"all {len(rollouts)} rollouts scored {rewards[0]:.3g}",
        "print one rollout's final answer next to what the reward function extracts from it: the output "
        "format and the reward parser most likely disagree (mtrl export writes the trajectories)",
        value=rewards[0],
    )


def _varies_in_groups(rollouts: Sequence[Rollout]) -> CheckItem:
    name = "reward varies within groups"
    groups: dict[str, list[float]] = defaultdict(list)
    for r in rollouts:
        groups[r.group_id].append(r.total_reward)
    sized = {g: v for g, v in groups.items() if len(v) >= 2}
    if not sized:
        return skipped(name, "every group has one rollout: sample more per task to check this")
    flat = [g for g, v in sized.items() if max(v) - min(v) <= _SAME]
    share = len(flat) / len(sized)
    detail = f"{len(flat)} of {len(sized)} groups ({share:.0%}) score all alike"
    if share <= ZERO_ADV_MAX:
        return passed(name, detail, zero_variance_frac=share)
    return failed(
        name, detail + f" (over {ZERO_ADV_MAX:.0%}): those groups give no gradient",
        "make the reward denser (partial credit per field or per step) so rollouts of one task differ, "
        "or raise sampling_params.temperature; then train with more tasks per step and a smaller group_size",
        zero_variance_frac=share,
    )


def _strict_agreement(strict: StrictComparison | None) -> list[CheckItem]:
    agree, hack = "reward agrees where the strict scorer says success", "reward gives no success the strict scorer denies"
    if strict is None:
        reason = "no strict scorer given (--strict module:function)"
        return [skipped(agree, reason), skipped(hack, reason)]
    items = []
    misses, loopholes = strict.strict_only, strict.reward_only
    if not misses:
        items.append(passed(agree, f"{sum(map(sum, strict.successes_by_task.values()))} strict successes, "
                                   "all rewarded as successes"))
    else:
        items.append(failed(
            agree, f"{len(misses)} strictly correct rollouts scored below success: {_disputed(misses)}",
            "read these trajectories and fix the reward function: it rejects answers the strict scorer accepts, "
            "so training would push the policy away from correct answers",
            rollouts=[d.rollout_id for d in misses],
        ))
    if not loopholes:
        items.append(passed(hack, "no rollout succeeds by the reward alone"))
    else:
        items.append(failed(
            hack, f"{len(loopholes)} rollouts succeed by the reward but fail the strict scorer: {_disputed(loopholes)}",
            "tighten the reward's parser to the strict format before training: RL finds and learns such loopholes",
            rollouts=[d.rollout_id for d in loopholes],
        ))
    return items


def _foothold(rollouts: Sequence[Rollout], strict: StrictComparison | None, threshold: float) -> CheckItem:
    name = "the base model has a foothold"
    if strict is not None:
        wins, how = sum(map(sum, strict.successes_by_task.values())), "strict successes"
    else:
        wins, how = sum(r.total_reward >= threshold for r in rollouts), f"rollouts with reward >= {threshold:g}"
    if wins > 0:
        return passed(name, f"{wins} {how} of {len(rollouts)}", successes=wins)
    return failed(
        name, f"0 {how} of {len(rollouts)}: every group scores alike, so there is nothing to reinforce",
        "simplify before training: a worked example in the system prompt, easier tasks or fewer answer fields "
        "first, until the base model succeeds sometimes",
        successes=0,
    )


def _ids(rollouts: Sequence[Rollout]) -> str:
    more = f", ... ({len(rollouts)} in all)" if len(rollouts) > _LISTED else ""
    return ", ".join(r.id for r in rollouts[:_LISTED]) + more


def _disputed(disagreements: Sequence[Any]) -> str:
    shown = [f"{d.rollout_id} (task {d.task_id}, reward {d.reward:.3g}, answer {d.final_text[:60]!r})"
             for d in disagreements[:_LISTED]]
    return "; ".join(shown) + (f"; ... ({len(disagreements)} in all)" if len(disagreements) > _LISTED else "")


# -- running the baseline -------------------------------------------------------------------------


async def acheck_reward(
    agent_env: Any,
    dataset: Any,
    config: MtrlConfig | Mapping[str, Any] | str | Path | None = None,
    *,
    strict_scorer: StrictScorer | Callable[[Any, Any], float] | None = None,
    engine: Any = None,
    max_tasks: int = DEFAULT_MAX_TASKS,
    samples: int | None = None,
    reward_range: tuple[float, float] = (0.0, 1.0),
    split: str | None = None,
    output_path: str | Path | None = None,
    judge: JudgeSpec | Mapping[str, Any] | str | Path | None = None,
    judge_orders: int = DEFAULT_ORDERS,
    strict_turns: TurnScorer | None = None,
) -> Checklist:
    """Run ``max_tasks`` x ``samples`` baseline rollouts (training sampling) and check the reward.

    ``judge`` (a ``JudgeSpec``, its mapping or file; default: ``advanced.group_judge``): audit that group
    judge on the rollouts instead (``_judge``), each group judged in ``judge_orders`` orders. A judge with
    ``per_turn: true`` is audited turn by turn (``_turn_judge``), against ``strict_turns`` (``fn(rollout, task)``
    -> one score per assistant turn) or the agent's per-turn rewards.
    """
    cfg = MtrlConfig.coerce(config)
    spec = JudgeSpec.load(judge) if isinstance(judge, (str, Path)) else (
        JudgeSpec.of(judge) if judge is not None else cfg.advanced.group_judge)
    grader = (TurnJudge if spec.per_turn else GroupJudge).from_spec(spec) if spec is not None else None
    if grader is not None and judge_orders < 1:
        raise ValueError(f"judge_orders: expected >= 1 (orders each group is judged in), got {judge_orders}")
    # the coordinator takes any reward within the hard bound here, so the checklist can name the ones out of range
    cfg.advanced.reward_range = (-REWARD_LIMIT, REWARD_LIMIT)
    tasks = select_tasks(dataset, split, max_tasks)
    k = samples if samples is not None else min(cfg.core.group_size, DEFAULT_MAX_SAMPLES)
    plan = EvalPlan.from_config(cfg, tasks, samples=k, sampling=cfg.core.sampling_params)
    folder = Path(output_path) if output_path is not None else cfg.run_folder.checks
    async with open_stack(cfg, agent_env, folder / "check_reward.db", engine) as stack:
        if grader is not None:  # before any rollout: the policy must not judge itself
            refuse_policy_endpoint(grader.base_url, stack.endpoint, "judge base_url")
        side = await run_side(stack.dispatcher(), plan, label="baseline", group_prefix=f"check-reward-{run_tag()}")
    if isinstance(grader, TurnJudge):
        judged = await ajudge_turns(grader, side.rollouts, plan.task_map, judge_orders, cfg.core.seed)
        return turn_judge_checklist(judged, plan.task_map, strict_turns=strict_turns)
    if grader is not None:
        groups = await ajudge_groups(grader, side.rollouts, plan.task_map, judge_orders, cfg.core.seed)
        return judge_checklist(groups, plan.task_map, strict_scorer=strict_scorer,
                               success_threshold=plan.success_threshold)
    return reward_checklist(side.rollouts, plan.task_map, success_threshold=plan.success_threshold,
                            reward_range=reward_range, strict_scorer=strict_scorer)


def check_reward(*args: Any, **kwargs: Any) -> Checklist:
    """``acheck_reward`` for callers outside an event loop (same arguments)."""
    return asyncio.run(acheck_reward(*args, **kwargs))


__all__ = ["DEFAULT_MAX_SAMPLES", "DEFAULT_MAX_TASKS", "acheck_reward", "check_reward", "reward_checklist"]
