"""The MLflow UI's CPU on one run's store, with MLflow's job runner and without it, alternately.

``mlflow ui`` (MLflow 3) also starts a job runner by default: a process that
starts Huey consumers, each importing MLflow, for MLflow's server-side jobs.
Viewing a run's metrics and traces needs none of them;
``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false`` leaves them out. Each round starts
``mlflow ui --workers 1`` on an empty SQLite store both ways (the order
swapped every round), waits for ``/health``, then watches the server's
process session for ``--watch`` seconds more: the CPU its processes spent
(from ``/proc``), how many there were at most::

    .venv/bin/python bench/mlflow_ui_cpu.py --rounds 2

Results: ``bench/results/mlflow_ui_cpu.json``. Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _machine import load_note, machine_info, save_results

from mtrl_runtime.testing import free_port
from mtrl_runtime.tracking import VIEWER_ENV

RESULTS = Path(__file__).resolve().parent / "results" / "mlflow_ui_cpu.json"
TICK = os.sysconf("SC_CLK_TCK")
SIDES = {"with jobs (default)": {}, "without jobs": VIEWER_ENV}


def session_cpu(sid: int) -> tuple[float, int]:
    """CPU seconds (user + system) of the live processes of session ``sid``, and how many there are."""
    total, count = 0.0, 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # the process ended between listing and reading
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state is fields[0]
        if int(fields[3]) == sid:  # the session id
            total += (int(fields[11]) + int(fields[12])) / TICK
            count += 1
    return total, count


def one(extra_env: dict[str, str], watch_s: float) -> dict[str, float]:
    """Start the UI, time it to ``/health``, watch its session ``watch_s`` more seconds, stop it."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "MLFLOW_ENABLE_TELEMETRY": "false", **extra_env}
        started = time.monotonic()
        proc = subprocess.Popen(
            [str(Path(sys.executable).with_name("mlflow")), "ui", "--port", str(port), "--backend-store-uri",
             f"sqlite:///{tmp}/mlflow.db", "--workers", "1"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            while True:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                        break
                except OSError:
                    if proc.poll() is not None or time.monotonic() - started > 120:
                        raise RuntimeError(f"mlflow ui did not answer /health (exit {proc.poll()})")
                    time.sleep(0.2)
            up_s = time.monotonic() - started
            cpu_up, most = session_cpu(proc.pid)
            end = time.monotonic() + watch_s
            while time.monotonic() < end:
                most = max(most, session_cpu(proc.pid)[1])
                time.sleep(0.5)
            cpu_after, _ = session_cpu(proc.pid)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    return {"up_s": round(up_s, 2), "cpu_at_health_s": round(cpu_up, 2),
            "cpu_after_watch_s": round(cpu_after, 2), "most_processes": most}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--watch", type=float, default=20.0, help="seconds to watch after /health answers")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for r in range(args.rounds):
        order = list(SIDES) if r % 2 == 0 else list(reversed(SIDES))
        for side in order:
            runs[side].append(one(SIDES[side], args.watch))
            print(f"round {r + 1} {side}: {runs[side][-1]}", flush=True)
    load_after = os.getloadavg()
    summary = {side: {key: statistics.median(run[key] for run in rows) for key in rows[0]}
               for side, rows in runs.items()}
    with_jobs, without = summary["with jobs (default)"], summary["without jobs"]
    results = {
        "command": f"python bench/mlflow_ui_cpu.py --rounds {args.rounds} --watch {args.watch:g}",
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine_info(load_before, load_after, 0, dtype="none (no model)"),
        "load": load_note(load_before, load_after, "CPU seconds are still each side's own"),
        "watch_s": args.watch,
        "runs": runs,
        "median": summary,
        "cpu_ratio_without_over_with": round(without["cpu_after_watch_s"] / with_jobs["cpu_after_watch_s"], 3),
    }
    save_results(args.out, results)
    for side, row in summary.items():
        print(f"{side}: /health after {row['up_s']:.1f} s ({row['cpu_at_health_s']:.1f} s of CPU), "
              f"{row['cpu_after_watch_s']:.1f} s of CPU {args.watch:g} s later, {row['most_processes']:.0f} processes")
    print(f"without / with: {results['cpu_ratio_without_over_with']:.2f}x the CPU")


if __name__ == "__main__":
    main()
