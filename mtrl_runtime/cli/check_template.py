"""``mtrl check template``: the flags and the run of the train/serve drift check (``checks.check_template``).

It is a subcommand of ``mtrl check`` (whose parser, in ``eval.py``, adds it
with ``add_args`` and hands it to ``run``); it needs a model and a store,
not an agent or a dataset.
"""

from __future__ import annotations

import argparse
import json


def add_args(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("template", help="compare a run's trained tokens with what the deployment template renders")
    p.add_argument("--store", required=True, help="the run's trajectory store (runs/<name>/trajectories.db)")
    p.add_argument("--model", required=True, help="the model whose tokenizer and template deployment uses")
    p.add_argument("--chat-format", help="the chat format (default: detected from the tokenizer)")
    p.add_argument("--max-rollouts", type=int, help="check only the first N rollouts")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """0 when every trained segment equals its deployment rendering, 1 otherwise."""
    from ..checks import check_template

    report = check_template(args.store, args.model, args.chat_format, args.max_rollouts)
    print(json.dumps(report.to_dict(), indent=2) if args.json else report)
    return 0 if report.equal else 1


__all__ = ["add_args", "run"]
