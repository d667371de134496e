"""``mtrl rescore RUN --reward module:fn``: a run's stored rollouts under another reward, nothing generated.

The reward function is named as ``--agent`` is (``module:function`` or
``file.py:function``) and called as ``fn(trajectory)`` with a
``mtrl_runtime.rewards.Trajectory``; ``--advantage`` recomputes advantages
with another method, ``--strict`` (``fn(final_text, ground_truth)``, as in
``mtrl train``) adds the disagreement with a strict scorer. The run's store
is opened read-only; the report goes to ``RUN/rescore-<name>/`` (``--out``).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from ._agents import load_agent, load_strict_scorer
from ._command import Command


def _rescore_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the run folder (the run_dir of mtrl train)")
    p.add_argument("--reward", required=True,
                   help="the reward: module:function or file.py:function, called as fn(trajectory)")
    p.add_argument("--advantage", help="recompute advantages with this method (default: the run's advantage_method)")
    p.add_argument("--strict", help="a strict scorer module:function (fn(final_text, ground_truth) -> float)")
    p.add_argument("--config", help="the YAML the run trained with, for a run whose store records no config")
    p.add_argument("--name", help="the report's name (default: the reward function's, plus the method if given)")
    p.add_argument("--out", help="the report folder (default: RUN/rescore-<name>)")


def _rescore(args: argparse.Namespace) -> int:
    from ..config import MtrlConfig
    from ..rescore import RescoreError, load_run, report_data, rescore_run, write_report

    try:
        reward = load_agent(args.reward, "--reward")
        strict = load_strict_scorer(args.strict) if args.strict else None
        run = load_run(args.run, MtrlConfig.from_yaml(args.config) if args.config else None)
        name = args.reward.rpartition(":")[2]
        result = rescore_run(run, reward, reward_name=name, method=args.advantage, strict=strict)
    except RescoreError as exc:  # the user's reward raised: its traceback is what they need
        traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)
        raise SystemExit(f"mtrl rescore: {exc}") from None
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise SystemExit(f"mtrl rescore: {exc}") from None
    label = args.name or (f"{name}-{args.advantage}" if args.advantage else name)
    paths = write_report(report_data(result), Path(args.out) if args.out else Path(args.run) / f"rescore-{label}")
    for step in result.steps:
        o, r = step.original, step.rescored
        print(f"mtrl: step {step.step}: reward {o.metrics['rollout/reward/mean']:.3f} -> "
              f"{r.metrics['rollout/reward/mean']:.3f}, zero-advantage groups "
              f"{o.metrics['analysis/zero_adv_frac']:.2f} -> {r.metrics['analysis/zero_adv_frac']:.2f}, "
              f"tokens with signal {o.signal_frac:.2f} -> {r.signal_frac:.2f}, {len(step.changes)} rewards changed")
    if not result.reproduced:
        print(f"mtrl: WARNING: the original side does not reproduce what the run logged "
              f"({len(result.mismatches)} differences, listed in the report)", file=sys.stderr)
    print(f"mtrl: report: {paths.markdown} (and .json, .png)")
    return 0


RESCORE = Command("rescore", "recompute a run's rewards and advantages with another reward, nothing generated",
                  _rescore_args, _rescore, loads_models=False)

__all__ = ["RESCORE"]
