"""A short mtrl command on the scripted engine, this tree against another, run alternately: wall and CPU seconds.

Most of such a command's time is start-up (imports, loading the tokenizer),
paid by every ``mtrl collect`` / ``check`` / ``eval`` on the scripted engine
and by each of the docs' code blocks that the test suite runs. Each round
runs the command once from each tree, the order swapped every round, each
in a fresh process started in that tree (``python -m`` puts the working
folder first on ``sys.path``; ``PYTHONPATH`` names the tree too) with its own
``--run-dir``. The tree before is an archive of an earlier commit::

    mkdir /tmp/old && git archive 662fb00~1 mtrl_runtime mtrl_adapters examples | tar -x -C /tmp/old
    .venv/bin/python bench/cli_startup.py --tree /tmp/old --rounds 3

``--command train`` runs one scripted training step instead of the
collection (``mtrl train examples/aircraft_inspection/scripted.yaml``: torch,
transformers' model classes, a LoRA update on SmolLM2's weights), the
command most docs blocks run.

Both trees run with the same virtualenv and the same caches; the first run
of each tree is a warm-up, not counted (it fills ``$MTRL_CACHE``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import DTYPE_NAMES, load_note, machine_info
from _rounds import rotated

ROOT = Path(__file__).resolve().parent.parent
SCRIPTED = "examples/aircraft_inspection/scripted.yaml"
COMMANDS = {  # --command: the mtrl command line each round runs (its --run-dir added)
    # scripted rollouts only: transformers' tokenizer, no torch
    "collect": ["collect", SCRIPTED, "--agent", "examples.aircraft_inspection.agent:run",
                "--dataset", "examples/aircraft_inspection/instances/train.jsonl", "-n", "2"],
    # one scripted step and its LoRA update on SmolLM2's weights: torch and transformers' model classes
    "train": ["train", SCRIPTED, "--agent", "examples.aircraft_inspection.agent:run",
              "--no-mlflow"],
}


def ran_dtype(command: str) -> str | dict[str, str]:
    """What ``command`` computes in: nothing for a collection; for a training step, the update's dtype as the
    trainer resolves the recipe's ``precision`` on this CPU (``resolve_autocast``; None is fp32)."""
    if command == "collect":
        return "none (scripted engine: no weights)"
    import torch

    from mtrl_runtime.config import MtrlConfig
    from mtrl_runtime.training import resolve_autocast

    autocast = resolve_autocast(MtrlConfig.from_yaml(ROOT / SCRIPTED).advanced.precision, torch.device("cpu"))
    return {"update": "fp32" if autocast is None else DTYPE_NAMES[str(autocast)]}


def run_once(tree: Path, run_dir: Path, command: list[str]) -> dict[str, float]:
    """One ``mtrl`` ``command`` from ``tree``: its wall seconds and the CPU seconds of the process."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), os.environ.get("PYTHONPATH", "")])}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mtrl_runtime.cli", *command, "--run-dir", str(run_dir)],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{tree}: mtrl {' '.join(command)} exited {done.returncode}: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", type=Path, required=True, help="the source tree to compare with (mtrl_runtime, ...)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--command", choices=sorted(COMMANDS), default="collect", help="what each round runs")
    parser.add_argument("--out", type=Path, help="default: bench/results/cli_startup.json (.train.json for train)")
    args = parser.parse_args()
    command = COMMANDS[args.command]
    out = args.out or ROOT / "bench/results" / ("cli_startup.json" if args.command == "collect"
                                                else f"cli_startup.{args.command}.json")
    if args.rounds < 1:
        raise SystemExit(f"--rounds: must be >= 1, got {args.rounds}")
    trees = {"before": args.tree.resolve(), "after": ROOT}
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for name, tree in trees.items():  # warm-up: fills the caches each tree uses
            run_once(tree, Path(tmp) / f"warm-{name}", command)
        for i, name in rotated(list(trees), args.rounds):
            runs[name].append(run_once(trees[name], Path(tmp) / f"{name}-{i}", command))
    load_after = os.getloadavg()
    median = {name: {key: statistics.median(r[key] for r in rs) for key in ("wall_s", "cpu_s")}
              for name, rs in runs.items()}
    result = {
        "command": "mtrl " + " ".join(command),
        "trees": {name: str(tree) for name, tree in trees.items()},
        "rounds": args.rounds,
        "runs": runs,
        "median": median,
        "ratio_wall": round(median["before"]["wall_s"] / median["after"]["wall_s"], 2),
        "ratio_cpu": round(median["before"]["cpu_s"] / median["after"]["cpu_s"], 2),
        "machine": machine_info(load_before, load_after, threads=1, dtype=ran_dtype(args.command)),
        "note": load_note(load_before, load_after, "the seconds are pessimistic, the ratio noisier"),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median", "ratio_wall", "ratio_cpu", "note")}, indent=2))


if __name__ == "__main__":
    main()
