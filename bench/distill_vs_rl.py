"""On-policy distillation vs RL alone on the aircraft example, same wall budget: strict success over time.

The teacher is an adapter trained on the aircraft task: ``--teacher PATH``
(the demo's, ``runs/demo/adapter`` after ``mtrl demo``), or, when none is
given, a short one trained here the way ``bench/warm_start.py`` warm-starts:
the reference solver's episodes for the first ``--teacher-tasks`` training
aircraft replayed through the real agent (scripted engine), kept when reward
and strict score are 1, then ``mtrl sft`` on them (``--teacher-epochs``).
Its training time is reported, and not charged to either arm: both arms
start from a fresh student (the demo's recipe, ``cli.demo.DEMO_RECIPE``:
SmolLM2-135M, LoRA r16, hf engine) and run the same validation passes on the
same test aircraft (``--val-tasks``, fixed seeds, the strict scorer) every
``--val-every`` steps, before the first step and after the last:

- ``rl_only``: RL (the recipe's loss) until ``--budget-s`` seconds have passed.
- ``distill``: ``core.loss_fn: distill`` with the teacher
  (``advanced.distill_teacher``; ``--distill-coef``, ``--distill-rl-coef``:
  0 is distillation alone, 1 adds the group advantage), same budget.

Each arm runs ``--runs`` times (seeds 0, 1, ...; ``--first-seed N`` starts at N, to add a seed later). The summary gives each
run's final strict success and the distill runs' seconds to reach RL alone's
final strict success (of the run with the same seed), as a ratio of the
budget. ``--tiny`` runs the pipeline on a tiny random model (seconds a step;
its figures mean nothing); the other flags size a real run to the machine.

    python bench/distill_vs_rl.py [--budget-s 2000] [--runs 2] [--first-seed 0] [--teacher PATH] [--teacher-tasks 12]
                                  [--distill-rl-coef 0] [--val-every 2] [--val-tasks 10] [--tiny] [--out PATH]

The machine is shared: read ``machine.loadavg_*`` in the results before
comparing runs. The results are written after each arm's run (``summary.runs_done``),
so a run stopped early keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _machine import load_note, machine_info, save_results  # noqa: E402
from warm_start import bench_model, demonstrations, recipe, rl  # noqa: E402  (the aircraft recipe, RL arm and demonstrations)

from mtrl_runtime.cli.demo import DEMO_RECIPE  # noqa: E402
from mtrl_runtime.engines.hf import auto_dtype  # noqa: E402
from mtrl_runtime.warmstart import SftSettings, sft  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "distill_vs_rl.json"


def train_teacher(args: argparse.Namespace, work: Path, model: str) -> tuple[Path, dict[str, Any]]:
    """A short teacher: the solver's episodes through the agent, then SFT (``bench/warm_start.py``'s warm start)."""
    started = time.perf_counter()
    demo_args = argparse.Namespace(**{**vars(args), "demos": "solver", "demo_tasks": args.teacher_tasks})
    demos, info = demonstrations(demo_args, work, model)  # its collect run: work/demos
    if not demos:
        raise SystemExit(f"distill_vs_rl: no solver episode passed the filters ({info['selection']}); "
                         "no teacher to distil")
    config = recipe(args, work / "teacher", model)
    result = sft(config, demos, work / "teacher-sft", SftSettings(epochs=args.teacher_epochs,
                                                                  learning_rate=args.teacher_lr,
                                                                  held_out=0.25 if len(demos) > 2 else 0.0,
                                                                  batch_size=4, seed=0))
    info.update({"seconds": round(time.perf_counter() - started, 1), "epochs": args.teacher_epochs,
                 "held_out_before": result.held_out_before,
                 "held_out_after": result.epochs[-1].held_out_loss if result.epochs else None})
    return Path(result.adapter), info


def arm(args: argparse.Namespace, work: Path, model: str, name: str, seed: int, teacher: Path | None) -> dict:
    config = recipe(args, work / f"{name}-{seed}", model).with_overrides({"core.seed": seed})
    if teacher is not None:
        config = config.with_overrides({"core.loss_fn": "distill", "advanced.distill_teacher": str(teacher),
                                        "advanced.distill_coef": args.distill_coef,
                                        "advanced.distill_rl_coef": args.distill_rl_coef})
    print(f"{name} (seed {seed}): {args.budget_s:.0f} s", flush=True)
    return {"seed": seed, **rl(args, config, args.budget_s, time.perf_counter())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=2000.0, help="wall-time budget of each run (default 2000)")
    parser.add_argument("--max-steps", type=int, default=1000, help="a bound on the steps of each run")
    parser.add_argument("--runs", type=int, default=2, help="runs of each arm, seeds from --first-seed (default 2)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first run's seed (a later seed run on its own)")
    parser.add_argument("--teacher", type=Path, help="a trained adapter on the aircraft task (default: train one)")
    parser.add_argument("--teacher-tasks", type=int, default=12, help="solver episodes the teacher is trained on")
    parser.add_argument("--teacher-epochs", type=int, default=3)
    parser.add_argument("--teacher-lr", type=float, default=2e-4)
    parser.add_argument("--distill-coef", type=float, default=1.0)
    parser.add_argument("--distill-rl-coef", type=float, default=0.0, help="0: distillation alone")
    parser.add_argument("--val-every", type=int, default=2, help="validation pass every N steps (and at 0 and the end)")
    parser.add_argument("--val-tasks", type=int, default=10, help="test aircraft per validation pass")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model: check the pipeline")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="distill_vs_rl-") as tmp:
        work = Path(tmp)
        model = bench_model(args, work)
        teacher_info: dict[str, Any] = {"given": str(args.teacher)} if args.teacher else {}
        teacher = args.teacher
        if teacher is None:
            teacher, teacher_info = train_teacher(args, work, model)
            print(f"teacher: {teacher_info['selection']}, trained in {teacher_info['seconds']:.0f} s", flush=True)
        runs: dict[str, list[dict[str, Any]]] = {"rl_only": [], "distill": []}
        result = save_results(args.out, report(args, runs, teacher_info, load_before))  # the teacher, before any arm
        for seed in range(args.first_seed, args.first_seed + args.runs):  # interleaved, so a change of the machine's load falls on both arms alike
            for name, arm_teacher in (("rl_only", None), ("distill", teacher)):
                runs[name].append(arm(args, work, model, name, seed, arm_teacher))
                result = save_results(args.out, report(args, runs, teacher_info, load_before))  # a stopped run keeps it
    print(json.dumps(result["summary"], indent=2))
    print(f"wrote {args.out}")
    return 0


def report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]], teacher_info: dict[str, Any],
           load_before: tuple[float, ...]) -> dict[str, Any]:
    """The results so far: every finished arm run, the ratios of the seeds both arms have finished."""
    load_after = os.getloadavg()
    ratios = []
    for rl_run, distill_run in zip(runs["rl_only"], runs["distill"]):
        target, base = rl_run["final_strict"], rl_run["before_rl_strict"]
        if target is None or base is None or target <= base:  # RL alone gained nothing: there is nothing to reach
            distill_run["reached_rl_only_final_at_s"] = None
            ratios.append(None)
            continue
        reached = next((p["seconds"] for p in distill_run["passes"] if p["strict"] >= target), None)
        distill_run["reached_rl_only_final_at_s"] = reached
        ratios.append(None if reached is None else round(reached / args.budget_s, 3))
    summary = {
        "runs_done": {name: len(done) for name, done in runs.items()},
        "rl_only_final_strict": [r["final_strict"] for r in runs["rl_only"]],
        "distill_final_strict": [r["final_strict"] for r in runs["distill"]],
        "distill_strict_before_rl": [r["before_rl_strict"] for r in runs["distill"]],
        # seconds the distill run took to reach its RL-alone twin's final strict success, over the budget
        # (None: never reached within the budget, or RL alone ended no better than it started: nothing to reach)
        "distill_time_to_rl_only_final_over_budget": ratios,
        "budget_s": args.budget_s,
    }
    return {
        "bench": "distill_vs_rl",
        "command": "python bench/distill_vs_rl.py " + " ".join(sys.argv[1:]),
        "model": "tiny random Llama (--tiny: the figures mean nothing)" if args.tiny else DEMO_RECIPE["core"]["model"],
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine_info(load_before, load_after, threads=2,
                                dtype="fp32" if args.tiny else auto_dtype("cpu")),  # what the recipe's auto ran
        "load": load_note(load_before, load_after, "the arms share the 2 cores with other work: compare with care"),
        "teacher": teacher_info,
        "summary": summary,
        "runs": runs,
    }


if __name__ == "__main__":
    raise SystemExit(main())
