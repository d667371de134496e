"""The demo's base-side evaluation repeated on this tree, compared episode by episode with other runs' stores.

A reproducibility check, not a timing. It runs ``mtrl demo``'s evaluation
(the aircraft Strands agent, the test split, the demo's recipe, engine and
seeds) of the base model alone for the first ``--tasks`` test tasks,
``--samples`` samples each, and compares every episode with the base
episodes of the same task in other evaluation stores (``--against
RUN/eval/trajectories.db``, any number; a demo run's evaluation, where the
base rows decoded beside the trained adapter's): how many of this run's
episodes equal one of them in every turn's completion ids, and, for the
others, how many leading turns the closest one shares.

Every evaluation sample has its seed and every later turn its own
(``mtrl_runtime.seeds``), so on the same weights an episode should repeat
whatever rows decode beside it (the float sums of a batch differ with its
rows; a sampled token flips only when that moves it across a boundary).
``--seed-every-turn`` samples every turn of an episode with the episode's
seed, as trees before per-turn seeds did: it replaces ``turn_seed`` in the
coordinator's capture module, in this process only.

    python bench/eval_repeat.py --against RUN/eval/trajectories.db [--against ...] [--tasks 6] [--samples 2]
        [--seed-every-turn] [--out bench/results/eval_repeat.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from _machine import machine_info

from mtrl_runtime.run_folder import RunFolder

Episode = tuple[tuple[int, ...], ...]  # each turn's completion ids


def base_episodes(store: Path) -> dict[str, list[Episode]]:
    """Task id -> its base-side episodes in an evaluation store (the evaluator names their groups ``...-base-t<i>``)."""
    from mtrl_runtime.store import SQLiteStore

    episodes: dict[str, list[Episode]] = defaultdict(list)
    with SQLiteStore(store, read_only=True) as db:
        for rollout in db.rollouts():  # in creation order
            if "-base-t" in rollout.group_id:
                episodes[rollout.task_id].append(tuple(tuple(turn.completion_ids) for turn in rollout.turns))
    return dict(episodes)


def shared_turns(a: Episode, b: Episode) -> int:
    """How many leading turns two episodes share (the whole length when they are equal)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def compare(ours: dict[str, list[Episode]], theirs: dict[str, list[Episode]]) -> dict[str, Any]:
    """Our episodes that equal one of the same task's in ``theirs``, and the leading turns the others share."""
    identical, differing = 0, []
    for task_id, episodes in sorted(ours.items()):
        for episode in episodes:
            candidates = theirs.get(task_id, [])
            if episode in candidates:
                identical += 1
                continue
            closest = max(candidates, key=lambda c: shared_turns(episode, c), default=())
            differing.append({"task": task_id, "turns": len(episode), "shared_leading_turns":
                              shared_turns(episode, closest) if closest else 0})
    return {"episodes": sum(len(v) for v in ours.values()), "identical": identical, "differing": differing}


def evaluate(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    if args.seed_every_turn:
        import mtrl_runtime.coordinator._capture as capture

        capture.turn_seed = lambda seed, turn: seed  # every turn: the episode's seed (this process only)
    from mtrl_examples.aircraft_inspection import FIELD_SETS, strict_score
    from mtrl_examples.aircraft_inspection.agent import run
    from mtrl_runtime.cli._precision import resolve_precision
    from mtrl_runtime.cli.demo import DEMO_RECIPE, _rows
    from mtrl_runtime.config import MtrlConfig
    from mtrl_runtime.evaluation import MultiTurnRLEvaluator

    config, _ = resolve_precision(MtrlConfig.from_dict(DEMO_RECIPE).with_overrides({"core.run_dir": str(out)}))
    result = MultiTurnRLEvaluator(
        agent_env=run, dataset=_rows("test", "full"), config=config, evaluate_base_model=True,
        strict_scorer=lambda text, truth: strict_score(text, truth, FIELD_SETS["full"]),
        max_tasks=args.tasks, max_samples=args.samples, tracking=False,
    ).evaluate()
    return {"strict_success": result.sides["base"].metrics.get("val/strict/success_rate"),
            "dtype": config.advanced.engine_options.get("dtype")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", action="append", required=True, type=Path,
                        help="another run's evaluation store (RUN/eval/trajectories.db); repeat for several")
    parser.add_argument("--tasks", type=int, default=6)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--seed-every-turn", action="store_true",
                        help="sample every turn with the episode's seed (trees before per-turn seeds)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "eval_repeat.json"))
    args = parser.parse_args()
    for store in args.against:
        if not store.is_file():
            raise SystemExit(f"--against {store}: no such evaluation store (a run's eval/trajectories.db)")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        side = evaluate(args, Path(tmp))
        wall = time.perf_counter() - started
        ours = base_episodes(RunFolder(RunFolder(tmp).evaluation).store)  # the evaluator's default output
    comparisons = {str(store): compare(ours, base_episodes(store)) for store in args.against}
    data = {
        "benchmark": "eval_repeat",
        "command": "python bench/eval_repeat.py " + " ".join(sys.argv[1:]),
        "machine": machine_info(load_before, os.getloadavg(), 2, dtype=side["dtype"]),
        "workload": {"tasks": args.tasks, "samples": args.samples, "seed_every_turn": args.seed_every_turn,
                     "recipe": "mtrl demo (DEMO_RECIPE), Strands aircraft agent, test split, base model alone"},
        "wall_s": round(wall, 1),
        "base_strict_success": side["strict_success"],
        "against": comparisons,
    }
    for store, c in comparisons.items():
        print(f"{c['identical']} of {c['episodes']} episodes identical in every turn to {store}; "
              f"the others share {[d['shared_leading_turns'] for d in c['differing']]} leading turns")
    Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
