"""The project's own imports in a fresh process, its bytecode compiled and not, alternately: CPU seconds.

An editable install (``scripts/setup.sh``) runs the project from its source
tree, where pip compiles nothing; a clean clone has no ``__pycache__``, and
under ``PYTHONDONTWRITEBYTECODE=1`` (set on this machine and the CI's) no
process writes one, so every process that imports ``mtrl_runtime`` compiles
the modules it imports again. The test suite starts hundreds of such
processes (``mtrl`` commands, docs blocks, agents, workers). This bench
archives the project's packages at ``HEAD`` twice, compiles one copy
(``python -m compileall``, what ``scripts/setup.sh`` does), and runs the same
import line (what ``mtrl train`` imports) in a fresh process from each copy,
the order swapped every round, under ``PYTHONDONTWRITEBYTECODE=1``. The
child imports the other packages that line needs first, then times the
project's modules alone (``time.process_time``)::

    .venv/bin/python bench/project_bytecode.py --rounds 10

Results: ``bench/results/project_bytecode.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _machine import load_note, machine_info, save_results
from _rounds import rotated

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results" / "project_bytecode.json"
PACKAGES = ["mtrl_runtime", "mtrl_adapters", "examples", "integrations"]  # what scripts/setup.sh compiles
# what `mtrl train examples/aircraft_inspection/config.yaml` imports of the project: the CLI, the server, the hf
# engine, the trainer, the example's Strands agent
IMPORTS = ("import mtrl_runtime.cli.train, mtrl_runtime.cli.collect, mtrl_runtime.server, mtrl_runtime.engines.hf, "
           "mtrl_runtime.training, examples.aircraft_inspection.agent")


# The child imports every other module the import line needs first (their names in import order, from a first
# run), then times the project's own imports alone: whole processes vary by a second run to run on 2 cores,
# which would hide the tenth of a second compiling costs.
CHILD = """
import json, os, sys, time, importlib
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except Exception:  # a module that imports only as part of its package's own import order: the line below does
        pass
started = time.process_time()
exec(sys.argv[2])
print(json.dumps({"project_s": time.process_time() - started,
                  "project_modules": sum(1 for m in sys.modules.values()
                                         if (getattr(m, "__file__", None) or "").startswith(os.getcwd()))}))
"""
LIST_OTHERS = """
import json, os, sys
exec(sys.argv[1])
print(json.dumps([name for name, m in sys.modules.items()
                  if not (getattr(m, "__file__", None) or "").startswith(os.getcwd())]))
"""


def others(tree: Path) -> list[str]:
    """The modules outside ``tree`` that the import line loads, in the order it loads them."""
    done = subprocess.run([sys.executable, "-c", LIST_OTHERS, IMPORTS], cwd=tree, check=True, capture_output=True,
                          text=True, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return json.loads(done.stdout)


def one(tree: Path, preload: list[str]) -> dict[str, float]:
    """A fresh process in ``tree``: the CPU seconds of the project's own imports (the rest imported before)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(preload), IMPORTS], cwd=tree, env=env,
                          check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def modules_compiled(tree: Path) -> int:
    return sum(1 for _ in tree.rglob("*.pyc"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        trees = {"source only": Path(tmp) / "source", "compiled": Path(tmp) / "compiled"}
        archive = subprocess.run(["git", "archive", "HEAD", *PACKAGES], cwd=ROOT, check=True,
                                 capture_output=True).stdout
        for tree in trees.values():
            tree.mkdir()
            subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        subprocess.run([sys.executable, "-m", "compileall", "-q", *PACKAGES], cwd=trees["compiled"], check=True,
                       stdout=subprocess.DEVNULL)
        compiled = modules_compiled(trees["compiled"])
        preload = others(trees["source only"])
        for tree in trees.values():  # warm the file cache; not counted
            one(tree, preload)
        if modules_compiled(trees["source only"]):
            raise RuntimeError("the source-only copy gained bytecode: PYTHONDONTWRITEBYTECODE was not honoured")
        load_before = os.getloadavg()
        cpu: dict[str, list[float]] = {side: [] for side in trees}
        for _, side in rotated(list(trees), args.rounds):
            measured = one(trees[side], preload)
            cpu[side].append(round(measured["project_s"], 3))
            imported = int(measured["project_modules"])
        load_after = os.getloadavg()
    median = {side: statistics.median(values) for side, values in cpu.items()}
    results = {
        "command": f"python bench/project_bytecode.py --rounds {args.rounds}",
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_info(load_before, load_after, 0, dtype="none (imports only)"),
        "load": load_note(load_before, load_after, "each side's CPU seconds are still its own"),
        "imports": IMPORTS,
        "bytecode_files": compiled,
        "project_modules_imported": imported,
        "other_modules_imported_first": len(preload),
        "cpu_s": cpu,
        "median_cpu_s": median,
        "saved_per_process_s": round(median["source only"] - median["compiled"], 3),
    }
    save_results(args.out, results)
    print(f"the project's {imported} modules: source only {median['source only']:.3f} s of CPU; compiled "
          f"({compiled} files) {median['compiled']:.3f} s; saved {results['saved_per_process_s']:.3f} s a process")


if __name__ == "__main__":
    main()
