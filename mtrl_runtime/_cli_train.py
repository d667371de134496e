"""``mtrl train CONFIG``: train an agent's policy from a YAML config, with a progress display.

The agent is named ``module:function`` or ``path/to/file.py:function``
(``--agent``); the function is the user's ``@rollout``-decorated entrypoint.
``--val-dataset`` (optionally ``--val-split``) gives the validation tasks,
run every ``core.val_every`` steps; ``--strict`` names a strict scorer the
same way as the agent (``fn(final_text, ground_truth) -> float``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from .cli import COMMANDS


def _train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="a YAML config (core + advanced)")
    p.add_argument("--agent", required=True, help="the agent entrypoint: module:function or file.py:function")
    p.add_argument("--dataset", help="a JSONL file of tasks (overrides core.dataset)")
    p.add_argument("--run-dir", help="the run folder (overrides core.run_dir)")
    p.add_argument("--max-steps", type=int, help="overrides core.max_steps")
    p.add_argument("--val-dataset", help="a JSONL file of validation tasks, run every core.val_every steps")
    p.add_argument("--val-split", help="only the validation tasks whose 'split' is this (e.g. val)")
    p.add_argument("--strict", help="a strict scorer module:function for the validation passes")
    p.add_argument("--resume", action="store_true", help="continue the run folder's run from its latest checkpoint")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")


def load_agent(spec: str, flag: str = "--agent") -> Any:
    """The function named by ``module:function`` or ``file.py:function`` (``flag`` names it in errors)."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name:
        raise ValueError(f"{flag}: expected module:function or file.py:function, got {spec!r}")
    if target.endswith(".py"):
        path = Path(target).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"{flag}: no file {target!r}")
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[path.stem] = module
        sys.path.insert(0, str(path.parent))
        module_spec.loader.exec_module(module)
    else:
        sys.path.insert(0, str(Path.cwd()))
        module = importlib.import_module(target)
    agent = getattr(module, name, None)
    if not callable(agent):
        raise ValueError(f"{flag}: {target!r} has no function {name!r}")
    return agent


def _validation_tasks(args: argparse.Namespace) -> Any:
    """The tasks of ``--val-dataset`` (those of ``--val-split`` when given), or None."""
    if args.val_dataset is None:
        if args.val_split is not None:
            raise ValueError("--val-split: give --val-dataset, the file to take the split from")
        return None
    from .evaluation import select_tasks

    return select_tasks(args.val_dataset, args.val_split)


def _train(args: argparse.Namespace) -> int:
    from .config import MtrlConfig
    from .training import MultiTurnRLTrainer

    config = MtrlConfig.from_yaml(args.config)
    overrides = {"core.dataset": args.dataset, "core.run_dir": args.run_dir, "core.max_steps": args.max_steps}
    config = config.with_overrides({k: v for k, v in overrides.items() if v is not None})
    trainer = MultiTurnRLTrainer(agent_env=load_agent(args.agent), config=config, resume=args.resume,
                                 tracking=not args.no_mlflow, validation_dataset=_validation_tasks(args),
                                 strict_scorer=load_agent(args.strict, "--strict") if args.strict else None)
    result = trainer.train(progress=True)
    print(f"mtrl: trained steps {result.start_step}..{result.final_step - 1}; adapter: {result.output_adapter_path}")
    if result.tracking_uri and result.tracking_uri.startswith("sqlite:///"):
        print(f"mtrl: open the run with: mlflow ui --backend-store-uri {result.tracking_uri}")
    return 0


COMMANDS.register("train")((_train_args, _train))
