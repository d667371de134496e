"""The test suite's own time: README's test command, timed, its CPU and the load through it, one run per call.

Runs ``python -m pytest -q -n 3`` (README's command; other pytest arguments
after ``--``) in this tree or another checkout (``--tree``: a clean clone,
the tree before a change), and records the wall time, the CPU of pytest and
everything it waited for (``RUSAGE_CHILDREN``: the workers, the ``mtrl``
commands of the docs blocks, ``torchrun`` jobs), the result line (passed,
failed, skipped), and the load sampled every 15 s through the run with other
processes' share of the cores' time (the demo's ``LoadSampler``), so that a
run on a shared machine says so.

    python bench/suite_time.py --label after [--tree PATH] [-- -n 3 tests/test_x.py]

Writes bench/results/suite_time.<label>.json. The issue's figure: at most 10
minutes on the CI machine kind (2 cores), README's command on a clean clone.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _machine import machine_info

from mtrl_runtime.cli._load_sampler import LoadSampler

REPO = Path(__file__).resolve().parent.parent
README_ARGS = ["-q", "-n", "3"]
RESULT = re.compile(r"^=*\s*(?P<line>(?:\d+ \w+(?:, )?)+) in [\d.]+s", re.MULTILINE)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _commit(tree: Path) -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree, capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else "unknown"


def counts(result_line: str) -> dict[str, int]:
    """``{"passed": 1600, "skipped": 63, ...}`` from pytest's last line."""
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", result_line)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="names the results file: suite_time.<label>.json")
    parser.add_argument("--tree", type=Path, default=REPO, help="the checkout to run (default this one)")
    parser.add_argument("pytest_args", nargs="*", help="after --: pytest's arguments (default README's -q -n 3)")
    args = parser.parse_args()
    tree = args.tree.resolve()
    command = [str(tree / ".venv" / "bin" / "python"), "-m", "pytest", *(args.pytest_args or README_ARGS)]
    log_path = REPO / "runs" / f"suite_time.{args.label}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    load_before, cpu_before = os.getloadavg(), _children_cpu()
    sampler = LoadSampler(15.0).start()
    started = time.perf_counter()
    with log_path.open("w") as log:
        code = subprocess.run(command, cwd=tree, stdout=log, stderr=subprocess.STDOUT).returncode
    wall = time.perf_counter() - started
    load = sampler.stop()
    cpu = _children_cpu() - cpu_before
    found = RESULT.findall(log_path.read_text())
    result: dict[str, Any] = {
        "benchmark": "suite_time",
        "label": args.label,
        "command": " ".join(["python", "-m", "pytest", *(args.pytest_args or README_ARGS)]),
        "tree": str(tree),
        "commit": _commit(tree),
        "exit_code": code,
        "result": found[-1].strip() if found else None,
        "counts": counts(found[-1]) if found else {},
        "wall_s": round(wall, 1),
        "cpu_s": round(cpu, 1),  # pytest, its workers and what they waited for
        "cpu_use": round(cpu / wall, 2),  # of one core: 2.0 is both cores busy
        "load_while_running": {"median": round(load.median, 2), "peak": round(load.peak, 2), "samples": len(load.loads),
                               "others_cpu_share": None if load.others_cpu_share is None
                               else round(load.others_cpu_share, 3)},
        "log": str(log_path),
        "machine": machine_info(load_before, os.getloadavg(), 3, dtype="none (the suite's own models vary)"),
    }
    out = REPO / "bench" / "results" / f"suite_time.{args.label}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("wall_s", "cpu_s", "cpu_use", "result", "load_while_running")}))
    sys.exit(0 if code == 0 else 1)


if __name__ == "__main__":
    main()
