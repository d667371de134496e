"""The demo's evaluation, base and fine-tuned sides one after the other against both at once on one engine.

``mtrl demo``'s evaluation (the aircraft Strands agent, the held-out test
split, k samples a task with fixed seeds, the strict scorer, the demo's
recipe and engine) of a trained adapter (``--adapter``: a demo run's
``adapter`` folder), run twice on this machine: the sides in turn
(``sides_at_once=False``: fine-tuned, then the base model with the adapter
disabled on the whole engine) and at once (the default: each side with its
own concurrency limit, base rows decoding beside the adapter's with the
adapter's term taken off for them). The two orders of the modes alternate
over ``--rounds``. Same tasks, seeds and samples both ways; reported: wall
seconds, strict success and mean reward of each side (they differ only by
sampling noise: the two ways batch rows differently, so float summation
differs and a sample may flip).

    python bench/eval_sides.py --adapter RUN/adapter [--tasks 25] [--samples 2] [--rounds 1]

Writes bench/results/eval_sides.json (or ``--out``).
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

from _machine import load_note, machine_info

from mtrl_examples.aircraft_inspection import FIELD_SETS, strict_score
from mtrl_examples.aircraft_inspection.agent import run
from mtrl_runtime.cli._precision import resolve_precision
from mtrl_runtime.cli.demo import DEMO_RECIPE, _rows
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.evaluation import MultiTurnRLEvaluator

MODES = {"in_turn": False, "at_once": True}


def evaluate(at_once: bool, args: argparse.Namespace) -> dict[str, Any]:
    fields = FIELD_SETS["full"]
    with tempfile.TemporaryDirectory() as tmp:
        config, _ = resolve_precision(MtrlConfig.from_dict(DEMO_RECIPE).with_overrides({"core.run_dir": tmp}))
        started = time.perf_counter()
        result = MultiTurnRLEvaluator(
            agent_env=run, dataset=_rows("test", "full"), config=config, adapter=args.adapter,
            evaluate_base_model=True, strict_scorer=lambda text, truth: strict_score(text, truth, fields),
            max_tasks=args.tasks, max_samples=args.samples, tracking=False, sides_at_once=at_once,
        ).evaluate()
        wall = time.perf_counter() - started
    sides = {name: {"strict_success": side.metrics.get("val/strict/success_rate"),
                    "reward_mean": side.metrics.get("val/reward/mean"), "rollouts": len(side.rollouts)}
             for name, side in result.sides.items()}
    return {"wall_s": round(wall, 1), "sides": sides, "dtype": config.advanced.engine_options.get("dtype")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", required=True, type=Path, help="a trained adapter folder (a demo run's adapter)")
    parser.add_argument("--tasks", type=int, default=25)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "eval_sides.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    rounds: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    names = list(MODES)
    for r in range(args.rounds):
        for mode in names[r % 2:] + names[: r % 2]:
            result = evaluate(MODES[mode], args)
            rounds[mode].append(result)
            print(f"round {r + 1} {mode}: {result['wall_s']} s, {result['sides']}", flush=True)
    load_after = os.getloadavg()
    best = {mode: min(results, key=lambda x: x["wall_s"]) for mode, results in rounds.items()}
    data = {
        "benchmark": "eval_sides",
        "command": "python bench/eval_sides.py " + " ".join(sys.argv[1:]),
        "machine": machine_info(load_before, load_after, 2, dtype=best["at_once"]["dtype"]),
        "note": load_note(load_before, load_after, "the modes alternate, so they share the load"),
        "workload": {"tasks": args.tasks, "samples": args.samples, "adapter": str(args.adapter),
                     "recipe": "mtrl demo (DEMO_RECIPE), Strands aircraft agent, test split, strict scorer"},
        "rounds": rounds,
        "best": best,
        "speedup_at_once": round(best["in_turn"]["wall_s"] / best["at_once"]["wall_s"], 3),
    }
    print(f"at once vs in turn: {data['speedup_at_once']}x")
    Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
