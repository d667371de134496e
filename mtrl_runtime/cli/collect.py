"""``mtrl collect CONFIG --agent module:fn --dataset D [-n N]``: run an agent over N tasks without training.

``--agent`` may also be a deployed AgentCore Runtime's ARN, as for ``mtrl train``.

Each task gets ``core.group_size`` rollouts (``--samples`` overrides),
run concurrently through the same stack and dispatcher training uses, and
stored in the run folder's store. One line is printed per rollout: task,
rollout id, status, turns, tool calls, reward (and the error). With
``--engine scripted --script script.yaml`` the agent's tools are exercised
against scripted replies, no model needed.
"""

from __future__ import annotations

import argparse

from ..task_sources import SOURCE_HELP
from ._agents import AGENT_HELP, agent_env_for
from ._command import Command


def _collect_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a YAML config (core + advanced)")
    p.add_argument("--agent", help=AGENT_HELP)
    p.add_argument("--dataset", help=f"{SOURCE_HELP} (default: core.dataset)")
    p.add_argument("-n", "--num-tasks", type=int, default=4,
                   help="how many tasks, from the top of the file (default 4)")
    p.add_argument("--split", help="only the tasks whose 'split' is this (e.g. train)")
    p.add_argument("--samples", type=int, help="rollouts per task (default: core.group_size)")
    p.add_argument("--run-dir", help="the run folder whose store records them (overrides core.run_dir)")
    p.add_argument("--engine", help="engine name (overrides core.engine)")
    p.add_argument("--script", help="with the scripted engine: a JSON/YAML script of per-task replies and tool calls")


def _collect(args: argparse.Namespace) -> int:
    import asyncio
    from pathlib import Path

    from ..config import MtrlConfig
    from ..rollouts import collect_rollouts, load_tasks, rollout_line

    if args.num_tasks < 1:
        raise SystemExit(f"mtrl collect: -n/--num-tasks must be >= 1, got {args.num_tasks}")
    if args.samples is not None and args.samples < 1:
        raise SystemExit(f"mtrl collect: --samples must be >= 1, got {args.samples}")
    config = MtrlConfig.from_yaml(args.config)
    overrides = {"core.run_dir": args.run_dir, "core.group_size": args.samples, "core.engine": args.engine,
                 "advanced.engine_options.script_file": str(Path(args.script).resolve()) if args.script else None}
    config = config.with_overrides({k: v for k, v in overrides.items() if v is not None})
    if args.script and config.core.engine != "scripted":
        raise SystemExit(f"mtrl collect: --script {args.script!r}: only the scripted engine takes a script "
                         f"(the engine is {config.core.engine!r}; add --engine scripted)")
    dataset = args.dataset or config.core.dataset
    if not dataset:
        raise SystemExit(f"mtrl collect: --dataset: give {SOURCE_HELP} (core.dataset is not set)")
    tasks = load_tasks(dataset)
    if args.split is not None:
        tasks = [t for t in tasks if t.split == args.split]
        if not tasks:
            raise SystemExit(f"mtrl collect: --split {args.split!r}: no task of {dataset} has this split")
    tasks = tasks[: args.num_tasks]
    agent = agent_env_for(args.agent, config)
    print(f"mtrl: collecting {len(tasks)} tasks x {config.core.group_size} rollouts with {config.core.engine} "
          f"into {config.run_folder.store}", flush=True)
    collected = asyncio.run(collect_rollouts(config, agent, tasks,
                                             on_rollout=lambda task, r: print(rollout_line(task, r), flush=True)))
    counts = ", ".join(f"{n} {status}" for status, n in collected.counts().items() if n)
    print(f"mtrl: {len(collected.rollouts)} rollouts ({counts}) in {collected.seconds:.1f} s, "
          f"stored in {collected.store_path}")
    return 0


COLLECT = Command("collect", "run an agent over a few tasks without training and print each rollout",
                  _collect_args, _collect)
