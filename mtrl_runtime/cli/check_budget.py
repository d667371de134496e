"""``mtrl check budget``: the flags and the run of the turn and token budget check (``checks.check_budget``).

A subcommand of ``mtrl check`` (``eval.py`` adds it with ``add_args`` and
hands it to ``run``). It runs baseline rollouts of ``--agent`` on
``--dataset`` as training samples them, or reads an existing run's rollouts
(``--store``), and prints the budget table and the YAML lines to paste.
"""

from __future__ import annotations

import argparse
import json

from ..task_sources import SOURCE_HELP


def add_args(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("budget", help="recommend max_turns and the reply cap from rollouts; check the context fits")
    p.add_argument("config", help="a YAML config (core + advanced): the budget the rollouts run under")
    p.add_argument("--agent", help="the agent entrypoint: module:function or file.py:function")
    p.add_argument("--dataset", help=SOURCE_HELP)
    p.add_argument("--store", help="read an existing run's rollouts (runs/<name>/trajectories.db) instead of running any")
    p.add_argument("--split", help="only the tasks whose 'split' is this (e.g. train)")
    p.add_argument("--run-dir", help="the run folder (overrides core.run_dir)")
    p.add_argument("--output", help="where the check's rollouts go (default: under the run folder)")
    p.add_argument("--max-tasks", type=int, default=16, help="tasks to run (default 16)")
    p.add_argument("--samples", type=int, help="rollouts per task (default: group_size, at most 8)")
    p.add_argument("--context-length", type=int, metavar="TOKENS",
                   help="the model's context window (default: the engine's, else the model's config.json)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """0 when the config's worst case fits the model's context (or the context is not known), 1 otherwise."""
    from ..checks import check_budget, check_budget_from_store
    from ..config import MtrlConfig
    from ._agents import load_agent

    config = MtrlConfig.from_yaml(args.config)
    if args.run_dir:
        config = config.with_overrides({"core.run_dir": args.run_dir})
    if args.store is not None:
        if args.agent or args.dataset:
            raise SystemExit("mtrl check budget: --store reads a run's rollouts; leave out --agent and --dataset")
        report = check_budget_from_store(args.store, config, context_length=args.context_length)
    else:
        if not args.agent or not args.dataset:
            raise SystemExit("mtrl check budget: give --agent and --dataset (rollouts to run), or --store (a run's)")
        report = check_budget(load_agent(args.agent), args.dataset, config, max_tasks=args.max_tasks,
                              samples=args.samples, split=args.split, output_path=args.output,
                              context_length=args.context_length)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0 if report.fits else 1


__all__ = ["add_args", "run"]
