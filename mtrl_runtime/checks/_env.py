"""``mtrl check env``: does the agent's environment give the same episode twice, and keep episodes apart?

With a deterministic policy (``val_sampling_params`` at temperature 0, one
fixed seed; the scripted engine is deterministic anyway) the same task must
produce the same conversation every time, whether it runs alone or beside
another episode:

- determinism: run one task twice, one after the other, and diff the two
  conversations (messages as the model saw them, the final reply, status
  and reward). A difference is a tool that is not a function of its
  arguments (time, randomness, a live service, a counter);
- isolation: run two tasks alone, then both at once; each concurrent
  conversation must equal its solo one. A difference means one episode
  saw state another wrote (a module-level dict, a shared sandbox);
- tools: the tools the agent offered the model, with their JSON schemas
  (names must be unique, parameters an object schema).

Every rollout of the checks must also complete: two identical crashes prove nothing.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..config import MtrlConfig
from ..envs import describe_tools, diff_messages
from ..evaluation import EvalPlan, conversation, run_side, run_tag, select_tasks
from ..rollouts import Dispatcher, open_stack
from ..types import Rollout, RolloutStatus, Task
from ._checklist import CheckItem, Checklist, failed, passed

_DIFFS_SHOWN = 3


async def acheck_env(
    agent_env: Any,
    dataset: Any,
    config: MtrlConfig | Mapping[str, Any] | str | Path | None = None,
    *,
    engine: Any = None,
    task_ids: Sequence[str] | None = None,
    split: str | None = None,
    output_path: str | Path | None = None,
) -> Checklist:
    """Run the determinism and isolation episodes on the first two tasks (or ``task_ids``) and list the tools."""
    cfg = MtrlConfig.coerce(config)
    tasks = _pick(select_tasks(dataset, split), task_ids)
    sampling = cfg.core.val_sampling_params.model_copy(update={"temperature": 0.0})
    folder = Path(output_path) if output_path is not None else cfg.run_folder.checks
    served = EvalPlan.from_config(cfg, tasks, samples=1, sampling=sampling).dispatch_config(cfg)
    async with open_stack(served, agent_env, folder / "check_env.db", engine) as stack:
        runs = _Runs(stack.dispatcher(), cfg, sampling, run_tag())
        first = await runs.one(tasks[0], "a")
        second = await runs.one(tasks[0], "b")
        solo = [first] + [await runs.one(t, f"solo{i}") for i, t in enumerate(tasks[1:], start=1)]
        together = await runs.together(tasks if len(tasks) > 1 else [tasks[0], tasks[0]])
    items = [
        _completed(runs.all),
        _deterministic(first, second),
        _isolated(solo if len(tasks) > 1 else [first, first], together),
        _tools(runs.all),
    ]
    return Checklist("mtrl check env", tuple(items))


def check_env(*args: Any, **kwargs: Any) -> Checklist:
    """``acheck_env`` for callers outside an event loop (same arguments)."""
    return asyncio.run(acheck_env(*args, **kwargs))


class _Runs:
    """Runs single rollouts through the dispatcher with one fixed seed and temperature 0; keeps every rollout."""

    def __init__(self, dispatcher: Dispatcher, config: MtrlConfig, sampling: Any, tag: str) -> None:
        self.dispatcher, self.config, self.sampling, self.tag = dispatcher, config, sampling, tag
        self.all: list[Rollout] = []

    def _plan(self, tasks: Sequence[Task]) -> EvalPlan:
        return EvalPlan.from_config(self.config, tasks, samples=1, sampling=self.sampling)

    async def one(self, task: Task, label: str) -> Rollout:
        side = await run_side(self.dispatcher, self._plan([task]), label=label, group_prefix=f"check-env-{self.tag}-{label}")
        self.all.extend(side.rollouts)
        return side.rollouts[0]

    async def together(self, tasks: Sequence[Task]) -> list[Rollout]:
        """One rollout per task, all at once (a task given twice runs twice)."""
        if len({t.id for t in tasks}) == len(tasks):
            side = await run_side(self.dispatcher, self._plan(tasks), label="together",
                                  group_prefix=f"check-env-{self.tag}-together")
            self.all.extend(side.rollouts)
            by_task = {r.task_id: r for r in side.rollouts}
            return [by_task[t.id] for t in tasks]
        rollouts = await asyncio.gather(*(self.one(t, f"together{i}") for i, t in enumerate(tasks)))
        return list(rollouts)


def _pick(tasks: list[Task], task_ids: Sequence[str] | None) -> list[Task]:
    if not task_ids:
        return tasks[:2]
    by_id = {t.id: t for t in tasks}
    missing = [i for i in task_ids if i not in by_id]
    if missing:
        raise ValueError(f"task_ids: {missing} are not in the dataset (first ids: {list(by_id)[:5]})")
    return [by_id[i] for i in task_ids]


def _completed(rollouts: Sequence[Rollout]) -> CheckItem:
    name = "the check episodes complete"
    bad = [r for r in rollouts if r.status is not RolloutStatus.COMPLETED]
    if not bad:
        return passed(name, f"{len(rollouts)} of {len(rollouts)} episodes completed")
    first = bad[0]
    return failed(
        name, f"{len(bad)} of {len(rollouts)} episodes did not complete; {first.id} ended {first.status.value}: "
              f"{(first.error or 'no error recorded')[:300]}",
        "fix the agent or tool that raises (the error above), then check again: identical crashes prove nothing",
        rollouts=[r.id for r in bad],
    )


def _deterministic(first: Rollout, second: Rollout) -> CheckItem:
    name = "same task twice gives the same episode"
    report = diff_messages(conversation(first), conversation(second))
    if report.same:
        return passed(name, f"{first.id} and {second.id}: the same {report.length_first} messages")
    shown = "\n".join(str(d) for d in report.differences[:_DIFFS_SHOWN])
    return failed(
        name, f"{first.id} and {second.id} differ ({_count(len(report.differences), 'difference')}"
              f"{', or more' if report.truncated else ''}):\n{shown}",
        "make every tool a function of its arguments: replay read-only tools from fixtures "
        "(mtrl_runtime.envs.ReplayTool), derive any randomness from the task, keep clocks and counters "
        "out of tool results",
        rollouts=[first.id, second.id], differences=len(report.differences),
    )


def _isolated(solo: Sequence[Rollout], together: Sequence[Rollout]) -> CheckItem:
    name = "concurrent episodes do not see each other's state"
    changed = []
    for alone, beside in zip(solo, together):
        report = diff_messages(conversation(alone), conversation(beside))
        if not report.same:
            changed.append((alone, beside, report))
    if not changed:
        return passed(name, f"{len(together)} episodes run at once matched their solo runs")
    lines = [f"task {a.task_id}: {b.id} (run beside another) differs from {a.id} (run alone):\n  "
             + "\n  ".join(str(d) for d in r.differences[:_DIFFS_SHOWN]) for a, b, r in changed]
    return failed(
        name, "\n".join(lines),
        "keep per-episode state per rollout, never in module globals or shared clients: allocate it at "
        "rollout start and tear it down in finally (mtrl_runtime.envs.Sandbox, SqliteEnv)",
        rollouts=[b.id for _, b, _ in changed],
    )


def _tools(rollouts: Sequence[Rollout]) -> CheckItem:
    name = "tools and their schemas"
    offered: dict[str, Any] = {}
    for rollout in rollouts:
        for turn in rollout.turns:
            try:
                specs = describe_tools(turn.tools)
            except (TypeError, ValueError) as exc:  # two tools of one name, or a tool with no name
                return failed(name, f"turn {turn.index} of {rollout.id}: {exc}",
                              "give every tool a unique name and a description the model can act on")
            for spec in specs:
                offered.setdefault(spec["name"], spec)
    if not offered:
        return passed(name, "the agent offered the model no tools")
    heading = _count(len(offered), "tool")
    bad = [n for n, s in offered.items() if (s.get("parameters") or {}).get("type") != "object"]
    listing = "\n".join(f"{n}: {s.get('description') or '(no description)'}  parameters: "
                        f"{json.dumps(s.get('parameters'), sort_keys=True)}" for n, s in sorted(offered.items()))
    if bad:
        return failed(name, f"{heading}:\n{listing}",
                      f"give {', '.join(bad)} a JSON object schema for its parameters ({{\"type\": \"object\", ...}})",
                      tools=list(offered))
    return passed(name, f"{heading}:\n{listing}", tools=list(offered))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


__all__ = ["acheck_env", "check_env"]
