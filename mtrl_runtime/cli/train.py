"""``mtrl train CONFIG``: train an agent's policy from a YAML config, with a progress display.

The agent is named ``module:function`` or ``path/to/file.py:function``
(``--agent``); the function is the user's ``@rollout``-decorated entrypoint.
``--agent`` may instead be a deployed AgentCore Runtime's ARN (or be left
out when ``advanced.agentcore.runtime_arn`` names one): each rollout is then
an ``InvokeAgentRuntime`` call (docs/scaling.md).
``--val-dataset`` (optionally ``--val-split``) gives the validation tasks,
run every ``core.val_every`` steps; ``--strict`` names a strict scorer the
same way as the agent (``fn(final_text, ground_truth) -> float``).
Under ``torchrun --nproc-per-node N -m mtrl_runtime.cli train ...`` rank 0
runs the run and every rank trains its FSDP2 shard (``training.distributed``).
"""

from __future__ import annotations

import argparse
from typing import Any

import sys

from ..task_sources import SOURCE_HELP
from ._agents import AGENT_HELP, agent_env_for, load_agent
from ._command import Command
from ._stopping import resume_command, run_until_stopped, stopped_message


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a YAML config (core + advanced)")
    p.add_argument("--agent", help=AGENT_HELP)
    p.add_argument("--dataset", help=f"{SOURCE_HELP} (overrides core.dataset)")
    p.add_argument("--run-dir", help="the run folder (overrides core.run_dir)")
    p.add_argument("--max-steps", type=int, help="overrides core.max_steps")
    p.add_argument("--val-dataset", help="validation tasks, run every core.val_every steps (forms as --dataset)")
    p.add_argument("--val-split", help="only the validation tasks whose 'split' is this (e.g. val)")
    p.add_argument("--strict", help="a strict scorer module:function for the validation passes")
    p.add_argument("--resume", action="store_true", help="continue the run folder's run from its latest checkpoint")
    p.add_argument("--init-adapter", metavar="PATH",
                   help="start from these weights (mtrl sft's adapter folder; overrides advanced.init_adapter)")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("--heartbeat", type=float, default=30.0, metavar="SECONDS",
                   help="off a terminal, print a progress line at least this often during a step (default 30)")


def _validation_tasks(args: argparse.Namespace) -> Any:
    """The tasks of ``--val-dataset`` (those of ``--val-split`` when given), or None."""
    if args.val_dataset is None:
        if args.val_split is not None:
            raise ValueError("--val-split: give --val-dataset, the file to take the split from")
        return None
    from ..evaluation import select_tasks

    return select_tasks(args.val_dataset, args.val_split)


def _train(args: argparse.Namespace) -> int:
    from ..config import MtrlConfig
    from ..training import MultiTurnRLTrainer, exit_rank, follow_training, join_torchrun
    from ._precision import resolve_precision

    config = MtrlConfig.from_yaml(args.config)
    overrides = {"core.dataset": args.dataset, "core.run_dir": args.run_dir, "core.max_steps": args.max_steps,
                 "advanced.init_adapter": args.init_adapter}
    config = config.with_overrides({k: v for k, v in overrides.items() if v is not None})
    config, precision = resolve_precision(config)  # dtype: auto becomes what this CPU runs natively, in the params
    print(f"mtrl: {precision}", flush=True)
    ranks = join_torchrun(config)  # under torchrun: rank 0 runs the run, the others train their shard
    if ranks is not None and not ranks.leader:
        follow_training(config, ranks)
        exit_rank(0)  # without the interpreter's shutdown, which gloo's threads can abort (exit_rank)
    trainer = MultiTurnRLTrainer(agent_env=agent_env_for(args.agent, config), config=config, resume=args.resume,
                                 tracking=not args.no_mlflow, validation_dataset=_validation_tasks(args),
                                 strict_scorer=load_agent(args.strict, "--strict") if args.strict else None,
                                 ranks=ranks)
    result = run_until_stopped("train", args.heartbeat,
                               lambda heartbeat_s: trainer.train(progress=True, heartbeat_s=heartbeat_s),
                               lambda since: stopped_message(config, since, resume_command(args)))
    if result is None:
        return 130
    print(f"mtrl: trained steps {result.start_step + 1}..{result.final_step}; adapter: {result.output_adapter_path}")
    if result.tracking_uri and result.tracking_uri.startswith("sqlite:///"):
        from ..tracking import ui_command

        print(f"mtrl: open the run with: {ui_command(result.tracking_uri)}")
    return 0


TRAIN = Command("train", "train an agent's policy from a YAML config", _train_args, _train)
