"""The coordinator's app made on a scripted engine, this tree against another: CPU seconds of ``create_app``.

Every coordinator start makes the app: each ``mtrl`` command that serves
the policy (train, collect, eval, serve, online) and each test that serves
one. Each round makes it in a fresh process from each tree, the order
swapped every round, and times the first ``create_app`` of the process and
the median of the ten after it (the first pays pydantic's schema building
once). The tree before is an archive of an earlier commit::

    mkdir /tmp/old && git archive HEAD~1 mtrl_runtime | tar -x -C /tmp/old
    .venv/bin/python bench/app_startup.py --tree /tmp/old --rounds 5

Writes bench/results/app_startup.json (``--out``). Measured when the protocols'
OpenAPI paths became lazy (built when the document is first asked for): the
first app of a process costs about the same either way (110 to 118 ms of
CPU, most of it imports that moved from the schemas' building to FastAPI's
first route: pydantic.v1), every later app 72 -> 8 ms, which is what a
process that makes many apps (a test worker, a bench) gains.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from _machine import machine_info
from _rounds import rotated

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import json, statistics, sys, tempfile, time
from pathlib import Path
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.server import create_app
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.testing import tiny_tokenizer

tok, folder, times = tiny_tokenizer(), Path(tempfile.mkdtemp()), []
for i in range(11):
    store = SQLiteStore(folder / f"s{i}.db")
    coordinator = Coordinator(ScriptedEngine(tok, ["hi"]), store, MtrlConfig())
    start = time.process_time()
    create_app(coordinator)
    times.append(time.process_time() - start)
    store.close()
print(json.dumps({"first_s": times[0], "after_s": statistics.median(times[1:])}))
"""


def probe(tree: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as cwd:  # one working folder for both trees: it is first on sys.path
        done = subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, capture_output=True, text=True, check=True,
                              env={**os.environ, "PYTHONPATH": str(tree)})
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True, help="the other checkout (an archive of mtrl_runtime)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "app_startup.json")
    args = parser.parse_args()
    trees = {"this": ROOT, "other": args.tree.resolve()}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    load_before = os.getloadavg()
    for _, name in rotated(list(trees), args.rounds):
        runs[name].append(probe(trees[name]))
    summary = {name: {key: statistics.median(r[key] for r in rs) for key in ("first_s", "after_s")}
               for name, rs in runs.items()}
    keys = ("first_s", "after_s")
    result = {
        "benchmark": "app_startup", "rounds": args.rounds, "trees": {k: str(v) for k, v in trees.items()},
        "median": summary, "runs": runs,
        "machine": machine_info(load_before, os.getloadavg(), threads=1, dtype="none (no model)"),
        "ratio_other_to_this": {key: summary["other"][key] / summary["this"][key] for key in keys},
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for name, figures in summary.items():
        first, after = figures["first_s"] * 1000, figures["after_s"] * 1000
        print(f"{name:6s} first create_app {first:6.1f} ms CPU, then {after:6.1f} ms")
    print("other / this: first %.2fx, then %.2fx" % tuple(result["ratio_other_to_this"].values()))


if __name__ == "__main__":
    main()
