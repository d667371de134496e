"""Opening a new run folder's embedded MLflow store: MLflow creating it vs a copy of mtrl's migrated template.

A new run's ``mlflow.db`` used to be made by MLflow itself (its first tables,
then every schema migration); ``_mlflow_template.prepare_store`` now copies a
migrated empty store from ``$MTRL_CACHE/mlflow`` first. Each round opens one
new store each way, the order swapped every round, each in a fresh process
(as ``mtrl train`` and ``mtrl eval`` meet it), and times the CPU seconds of
opening it: ``prepare_store`` (the template side only) and an ``MlflowClient``
listing its experiments, which is where MLflow creates, checks and
initializes a store. ``mlflow`` is imported before the clock starts; MLflow's
SQL store modules (SQLAlchemy models, alembic), which it imports on first
use, are imported before the clock too (``before``: the store's own cost)
or inside it (``counted``: what a new process pays in all). The template
is built once before the rounds (not counted)::

    .venv/bin/python bench/mlflow_store.py --rounds 5
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

from _machine import load_note, machine_info

ROOT = Path(__file__).resolve().parent.parent
CHILD = """
import sys, time
from mlflow import MlflowClient
from mtrl_runtime._mlflow_template import prepare_store
db, side, imports = sys.argv[1], sys.argv[2], sys.argv[3]
if imports == "before":  # MLflow's SQL store stack (SQLAlchemy models, alembic), else imported on first use
    import mlflow.store.tracking.sqlalchemy_store, mlflow.store.db.utils
start = time.process_time()
if side == "template":
    assert prepare_store(db) == "template"
else:
    import os; os.makedirs(os.path.dirname(db), exist_ok=True)
MlflowClient(tracking_uri="sqlite:///" + db).search_experiments()
print(time.process_time() - start)
"""
SIDES = ("mlflow", "template")
IMPORTS = ("before", "counted")  # MLflow's SQL store modules imported before the clock, or inside it


def open_once(db: Path, side: str, imports: str, env: dict[str, str]) -> float:
    out = subprocess.run([sys.executable, "-c", CHILD, str(db), side, imports], env=env, cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results/mlflow_store.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mlflow-store-bench-"))
    env = {**os.environ, "MTRL_CACHE": str(work / "cache"), "PYTHONPATH": str(ROOT)}
    load_before = os.getloadavg()
    open_once(work / "warm" / "mlflow.db", "template", "before", env)  # builds the template: not counted
    cpu: dict[str, dict[str, list[float]]] = {imports: {side: [] for side in SIDES} for imports in IMPORTS}
    for r in range(args.rounds):
        for imports in IMPORTS:
            for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                cpu[imports][side].append(open_once(work / f"{imports}-{side}-{r}" / "mlflow.db", side, imports, env))
    load_after = os.getloadavg()
    median = {imports: {side: statistics.median(v) for side, v in by_side.items()} for imports, by_side in cpu.items()}
    result = {
        "bench": "mlflow_store",
        "what": "CPU seconds to open a new run folder's embedded MLflow store, a fresh process each; "
                "'before': MLflow's SQL store modules imported before the clock starts (the store alone), "
                "'counted': imported on first use inside the clock (what a new process meets)",
        "rounds": args.rounds,
        "cpu_s": cpu,
        "median_cpu_s": median,
        "ratio_mlflow_over_template": {i: m["mlflow"] / m["template"] for i, m in median.items()},
        "machine": machine_info(load_before, load_after, threads=1, dtype="none (no model: SQLite and MLflow only)"),
        "note": load_note(load_before, load_after, "CPU seconds are little affected, the wall would be"),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("cpu_s", "median_cpu_s", "ratio_mlflow_over_template")}, indent=2))


if __name__ == "__main__":
    main()
