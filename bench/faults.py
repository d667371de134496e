"""Fault injection at volume: every fault of tests/_faults.py, many groups, one coordinator; counts what was lost.

A coordinator is served on 127.0.0.1 over the scripted engine; the real
``Dispatcher`` runs ``--groups`` groups of ``--group-size`` rollouts per
fault (and as many healthy groups) through ``InProcessExecutor`` in one
step, then one more step of healthy groups to show the coordinator still
serves. Prints, per fault: rollouts attempted, completed, failed and timed
out by reason, groups kept and dropped, seconds per rollout; then the
totals and ``lost``: rollouts the coordinator created that are missing
from the store, not final, still live, or completed without turns or
reward. ``lost`` must be 0 (the exit status is 1 otherwise).

    python bench/faults.py [--groups 2] [--group-size 4] [--concurrency 32] [--timeout 10] [--policy keep_survivors]

Writes bench/results/faults.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the fault catalog is shared with tests/test_faults.py

from _faults import EXPECTED, FAULTS, FaultAgent, FaultPolicy, fault_of, fault_task  # noqa: E402

from mtrl_runtime.config import MtrlConfig  # noqa: E402
from mtrl_runtime.coordinator import Coordinator  # noqa: E402
from mtrl_runtime.engines import ScriptedEngine  # noqa: E402
from mtrl_runtime.executors import InProcessExecutor  # noqa: E402
from mtrl_runtime.server import create_app, start_server  # noqa: E402
from mtrl_runtime.store import SQLiteStore  # noqa: E402
from mtrl_runtime.testing import tiny_tokenizer  # noqa: E402
from mtrl_runtime.rollouts import Dispatcher  # noqa: E402
from mtrl_runtime.types import RolloutStatus  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "faults.json"


def reason(error: str | None) -> str:
    """The first line of a rollout's error, without ids: what the table groups failures by."""
    line = (error or "").splitlines()[0] if error else ""
    return line.split(" - {")[0][:90]


def lost(store: SQLiteStore, coordinator: Coordinator) -> list[str]:
    """Why each lost rollout counts as lost (see the module docstring)."""
    problems = []
    stored = store.rollouts()
    created = coordinator.counters["rollouts_created"]
    if len(stored) != created:
        problems.append(f"{created - len(stored)} rollouts created but not stored")
    problems += [f"{r.id}: still {r.status.value}" for r in stored if not r.status.is_final]
    problems += [f"{rid}: still live in the coordinator" for rid in coordinator.live_rollout_ids()]
    problems += [
        f"{r.id}: completed without turns or reward" for r in stored
        if r.status is RolloutStatus.COMPLETED and (not r.turns or r.reward is None)
    ]
    return problems


async def run(args: argparse.Namespace, coordinator: Coordinator, handle: Any, config: MtrlConfig) -> dict[str, Any]:
    agent = FaultAgent()
    executor = InProcessExecutor(agent)
    dispatcher = Dispatcher(coordinator, executor, config, handle.url, handle.loop)
    tasks = [fault_task(f, i) for f in [*FAULTS, "healthy"] for i in range(args.groups)]
    started = time.monotonic()
    faulty = await dispatcher.collect(0, tasks)
    fault_s = time.monotonic() - started
    healthy = await dispatcher.collect(1, [fault_task("healthy", 100 + i) for i in range(args.groups)])
    await executor.close()
    await agent.aclose()
    return {"fault_step": faulty, "healthy_step": healthy, "fault_step_s": fault_s}


def table(batch: Any) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for group in batch.groups:
        fault = fault_of(group.task.id)
        row = rows.setdefault(fault, {"attempted": 0, "completed": 0, "failed": Counter(), "timed_out": Counter(),
                                      "groups_kept": 0, "groups_dropped": 0, "unexpected": 0, "seconds": []})
        row["groups_dropped" if group.dropped else "groups_kept"] += 1
        for r in group.finished:
            row["attempted"] += 1
            row["seconds"].append((r.finished_at or r.created_at) - r.created_at)
            if r.status is RolloutStatus.COMPLETED:
                row["completed"] += 1
            else:
                row[r.status.value][reason(r.error)] += 1
            if fault != "flaky_agent" and r.status.value != EXPECTED[fault].status:
                row["unexpected"] += 1
    for row in rows.values():
        seconds = sorted(row.pop("seconds"))
        row["seconds_median"] = round(seconds[len(seconds) // 2], 3)
        row["seconds_max"] = round(seconds[-1], 3)
        row["failed"], row["timed_out"] = dict(row["failed"]), dict(row["timed_out"])
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=2, help="groups per fault")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=10.0, help="advanced.rollout_timeout_s")
    parser.add_argument("--concurrency", type=int, default=32, help="advanced.max_concurrency (rollouts at once)")
    parser.add_argument("--policy", default="keep_survivors", choices=["drop_group", "keep_survivors", "retry"])
    args = parser.parse_args()
    config = MtrlConfig.from_dict({
        "core": {"group_size": args.group_size, "max_turns": 4},
        "advanced": {"rollout_timeout_s": args.timeout, "max_concurrency": args.concurrency,
                     "group_policy": {"on_failure": args.policy, "min_survivors": 1, "max_retries": 1}},
    })
    with tempfile.TemporaryDirectory() as tmp:
        store = SQLiteStore(Path(tmp) / "trajectories.db")
        coordinator = Coordinator(ScriptedEngine(tiny_tokenizer(), FaultPolicy()), store, config)
        handle = start_server(create_app(coordinator), "127.0.0.1", 0)
        try:
            out = asyncio.run(run(args, coordinator, handle, config))
            problems = lost(store, coordinator)
        finally:
            handle.stop()
            store.close()
    rows = table(out["fault_step"])
    healthy_ok = sum(len(g.kept) for g in out["healthy_step"].groups)
    totals = {
        "attempted": sum(r["attempted"] for r in rows.values()) + args.groups * args.group_size,
        "completed": sum(r["completed"] for r in rows.values()) + healthy_ok,
        "failed": sum(sum(r["failed"].values()) for r in rows.values()),
        "timed_out": sum(sum(r["timed_out"].values()) for r in rows.values()),
        "unexpected_status": sum(r["unexpected"] for r in rows.values()),
        "lost": len(problems),
    }
    print(f"{'fault':22} {'tried':>5} {'done':>5} {'failed':>6} {'t/o':>4} {'kept':>4} {'drop':>4} {'med s':>6} {'max s':>6}  reason")
    for fault, r in rows.items():
        why = "; ".join(f"{n}x {k}" for k, n in {**r["failed"], **r["timed_out"]}.items())
        print(f"{fault:22} {r['attempted']:5} {r['completed']:5} {sum(r['failed'].values()):6} "
              f"{sum(r['timed_out'].values()):4} {r['groups_kept']:4} {r['groups_dropped']:4} "
              f"{r['seconds_median']:6.2f} {r['seconds_max']:6.2f}  {why[:110]}")
    print(f"after the faults: {healthy_ok}/{args.groups * args.group_size} healthy rollouts completed")
    print("totals: " + ", ".join(f"{k} {v}" for k, v in totals.items()))
    for problem in problems[:20]:
        print("LOST:", problem)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "command": "python bench/faults.py " + " ".join(sys.argv[1:]),
        "machine": {"python": platform.python_version(), "cpus": __import__("os").cpu_count(), "dtype": "none (scripted engine: no model runs)"},
        "config": vars(args), "fault_step_seconds": round(out["fault_step_s"], 2),
        "per_fault": rows, "healthy_after": healthy_ok, "totals": totals, "lost_detail": problems[:100],
    }, indent=1))
    return 0 if totals["lost"] == 0 and totals["unexpected_status"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
