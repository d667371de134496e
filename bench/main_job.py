"""The main job, ``mtrl demo``, timed and scored: one run per call, its figures written to bench/results.

Runs the demo as a user does (``python -m mtrl_runtime.cli demo``) in a
subprocess, from this tree or from another checkout (``--tree``: the tree
before a change, run with this venv and that tree first on the import
path), keeps its output, and records what it printed: the time split it
ends with (training = rollouts + update + other, evaluation), each step's
line, the table (strict success and the other metrics, base and trained),
the precision it chose, and the machine (CPU, native bf16, load before and
after). ``--summarize RUN_DIR LOG`` records a run made by hand with the
same command from its log instead (the figures are read the same way).

The issue's figure is a ratio of two such runs on one machine (before and
after a change), and the gain in strict success; each run is one sample of
a noisy process (the strict success of 25 tasks x 2 samples moves by
several points between seeds), so compare two runs a side where time
allows.

    python bench/main_job.py --label after [--tree PATH] [--staleness N] [--steps 10] [--run-dir DIR]
    python bench/main_job.py --label before --summarize RUN_DIR LOG [--tree PATH]

Writes bench/results/main_job.<label>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _machine import machine_info

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
PACKAGES = {"mtrl_runtime": "mtrl_runtime", "mtrl_adapters": "mtrl_adapters", "mtrl_integrations": "integrations",
            "mtrl_examples": "examples"}  # import name -> folder in a tree

TIME_LINE = re.compile(
    r"time: (?P<total>[\d.]+ (?:min|s)) in all = training (?P<training>[\d.]+ (?:min|s)) \((?P<steps>\d+) steps, "
    r"(?P<per_step>\d+) s a step: rollouts (?P<rollouts>[\d.]+ (?:min|s)), update (?P<update>[\d.]+ (?:min|s)), "
    r"other (?P<other>[\d.]+ (?:min|s))\) \+ evaluation (?P<evaluation>[\d.]+ (?:min|s))")
STEP_LINE = re.compile(r"^step (\d+)/\d+\s+reward ([\d.]+)\s+rollouts ([\d.]+) s\s+update ([\d.]+) s\s+step ([\d.]+) s",
                       re.M)
ROW = re.compile(r"│\s*(?P<label>[a-z_ @()0-9-]+?)\s*│\s*(?P<base>[\d.]+)\s*│\s*(?P<trained>[\d.]+)\s*│\s*(?P<change>[+-][\d.]+)\s*│")


def _seconds(value: str) -> float:
    number, unit = value.split()
    return float(number) * (60 if unit == "min" else 1)


def summarize(log: str) -> dict[str, Any]:
    """The figures a demo run printed (an error naming what is missing when the run did not finish)."""
    text = log.replace("\n", " ")  # rich wraps long lines
    timing = TIME_LINE.search(re.sub(r"\s+", " ", text))
    if timing is None:
        raise ValueError("the log has no closing 'time: ... in all' line: the demo did not finish")
    table = {m["label"].strip(): {"base": float(m["base"]), "trained": float(m["trained"]),
                                  "change": float(m["change"])} for m in ROW.finditer(log)}
    if "strict task success" not in table:
        raise ValueError("the log has no 'strict task success' row: the evaluation did not finish")
    load = re.search(r"load average ([\d.]+) / ([\d.]+) / ([\d.]+)", text)  # a demo before the sampled load
    flat = re.sub(r"\s+", " ", text)
    sampled = re.search(r"load while it ran \(1-min average, (\d+) samples every (\d+) s\): median ([\d.]+), "
                        r"peak ([\d.]+), above (\d+) in (\d+)% of the samples(?:; other processes' CPU (\d+)%)?", flat)
    precision = re.search(r"precision: (weights \w+, update \w+ \((?:[^()]|\([^()]*\))*\))", re.sub(r"\s+", " ", text))
    return {
        "seconds": {key: _seconds(timing[key]) for key in
                    ("total", "training", "rollouts", "update", "other", "evaluation")},
        "steps": [{"step": int(s), "reward": float(r), "rollouts_s": float(a), "update_s": float(u), "step_s": float(t)}
                  for s, r, a, u, t in STEP_LINE.findall(log)],
        "table": table,
        "strict_success": table["strict task success"],
        "precision": precision.group(1) if precision else None,
        # what the demo said of the machine at its end (1 / 5 / 15 min), and whether it called it shared
        "demo_load_average": [float(x) for x in load.groups()] if load else None,
        # what it sampled through the run (the demo since the load sampler): median and peak 1-min load, the
        # share of samples above what the demo adds + 1, and other processes' share of the cores' CPU time
        "demo_load_while_running": None if sampled is None else {
            "samples": int(sampled[1]), "interval_s": int(sampled[2]), "median": float(sampled[3]),
            "peak": float(sampled[4]), "above": int(sampled[5]), "share_above": int(sampled[6]) / 100,
            "others_cpu_share": None if sampled[7] is None else int(sampled[7]) / 100},
        "demo_says_shared": "the machine was shared" in flat,
        "asynchronous": "asynchronous" in log.split("\n", 1)[0],
    }


def run_demo(args: argparse.Namespace, log_path: Path) -> str:
    """Run the demo from ``args.tree`` (default this one); its output is written to ``log_path`` as it comes."""
    env = dict(os.environ)
    if args.tree:
        shim = Path(tempfile.mkdtemp(prefix="mtrl-tree-"))
        for name, folder in PACKAGES.items():
            (shim / name).symlink_to(Path(args.tree).resolve() / folder)
        env["PYTHONPATH"] = os.pathsep.join([str(shim), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [sys.executable, "-m", "mtrl_runtime.cli", "demo", "--run-dir", str(args.run_dir)]
    command += ["--steps", str(args.steps)] if args.steps else []
    command += ["--staleness", str(args.staleness)] if args.staleness is not None else []
    with log_path.open("w") as log:
        subprocess.run(command, cwd=args.tree or REPO, env=env, stdout=log, stderr=subprocess.STDOUT, check=True)
    return log_path.read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="names the results file: main_job.<label>.json")
    parser.add_argument("--tree", help="run the demo from this checkout (the tree before a change)")
    parser.add_argument("--staleness", type=int, help="mtrl demo --staleness")
    parser.add_argument("--steps", type=int, help="mtrl demo --steps (default the recipe's 10)")
    parser.add_argument("--run-dir", type=Path, help="the demo's run folder (default a new temp folder)")
    parser.add_argument("--summarize", nargs=2, metavar=("RUN_DIR", "LOG"), help="record a finished run from its log")
    args = parser.parse_args()
    load_before = os.getloadavg()
    started = time.time()
    commit = _commit(Path(args.tree) if args.tree else REPO)  # the code the run starts from
    if args.summarize:
        run_dir, log_path = Path(args.summarize[0]), Path(args.summarize[1])
        log, command = log_path.read_text(), "mtrl demo --run-dir " + str(run_dir) + " (run by hand; its log)"
    else:
        args.run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix=f"mtrl-demo-{args.label}-"))
        log_path = args.run_dir.with_suffix(".log")
        log, command = run_demo(args, log_path), " ".join(sys.argv)
        run_dir = args.run_dir
    figures = summarize(log)
    weights = re.match(r"weights (\w+)", figures["precision"] or "")
    result = {
        "benchmark": "main_job",
        "label": args.label,
        "command": command,
        "tree": str(Path(args.tree).resolve()) if args.tree else str(REPO),
        "commit": commit,
        "run_dir": str(run_dir),
        "log": str(log_path),
        # the demo's engine runs 2 threads; the dtype is what the demo printed it chose for this CPU
        "machine": machine_info(load_before, os.getloadavg(), 2, dtype=weights.group(1) if weights else "unknown"),
        "recorded_at": time.strftime("%Y-%m-%d %H:%M", time.localtime(started)),
        **figures,
    }
    out = RESULTS / f"main_job.{args.label}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    s, strict = result["seconds"], result["strict_success"]
    print(f"{args.label}: {s['total'] / 60:.1f} min (training {s['training'] / 60:.1f}: rollouts "
          f"{s['rollouts'] / 60:.1f}, update {s['update'] / 60:.1f}; evaluation {s['evaluation'] / 60:.1f}); "
          f"strict success {strict['base']:.2f} -> {strict['trained']:.2f} ({strict['change']:+.2f})")
    print(f"wrote {out}")


def _commit(tree: Path) -> str:
    """The tree's git commit, with "+changes" when its files differ from it."""
    head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True)
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


if __name__ == "__main__":
    main()
