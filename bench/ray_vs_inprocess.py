"""The Ray executor against the in-process executor: rollouts/s and per-rollout overhead, scripted engine.

One coordinator is served on 127.0.0.1 over the ``scripted`` engine (no
model runs, so the figures are the executors' own cost). The same
OpenAI-client agent (``--turns`` chat calls, then a reward) runs:

- in-process: on this process's event loop (``InProcessExecutor``);
- Ray tasks: one Ray task per rollout (``RayExecutor``, ``--task-cpus`` each);
- Ray actors: ``--actors`` async actors running many rollouts each.

For each: ``--sequential`` rollouts one at a time (median wall time per
rollout; the overhead is the difference to in-process), and ``--rollouts``
rollouts with ``--concurrency`` in flight, best of ``--repeats`` (rollouts/s). Ray runs a local
cluster of ``--ray-cpus`` CPUs (no auth, no dashboard, its files in a temp
folder); worker start-up is excluded by a warm-up round. The machine may be
shared: the load average before and after is reported.

    python bench/ray_vs_inprocess.py [--rollouts 32] [--concurrency 16] [--sequential 8] [--turns 2]
                                     [--ray-cpus 2] [--task-cpus 0.5] [--actors 2] [--repeats 3]

Writes bench/results/ray_vs_inprocess.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import openai

from mtrl_adapters import aupdate_reward
from mtrl_runtime.config import MtrlConfig
from mtrl_runtime.coordinator import Coordinator
from mtrl_runtime.engines import ScriptedEngine
from mtrl_runtime.executors import InProcessExecutor, RayExecutor
from mtrl_runtime.server import create_app, start_server
from mtrl_runtime.store import SQLiteStore
from mtrl_runtime.testing import tiny_tokenizer
from mtrl_runtime.types import RolloutSpec, RolloutStatus, SamplingParams, Task

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "ray_vs_inprocess.json"
TURNS = {"n": 2}  # read by the agent; pickled with it (by value: this is __main__) when a Ray executor is built


async def agent(task: Any) -> None:
    """``TURNS`` chat calls (each reply answered with "Go on."), then a reward."""
    client = openai.AsyncOpenAI(api_key="sk-unused", max_retries=0)
    messages: list[dict[str, Any]] = [{"role": "user", "content": task.prompt}]
    for _ in range(TURNS["n"]):
        reply = await client.chat.completions.create(model="policy", messages=messages)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}]
    await aupdate_reward(1.0)


class Served:
    """The coordinator on loopback over the scripted engine, and rollouts opened on it."""

    def __init__(self, folder: Path) -> None:
        self.store = SQLiteStore(folder / "bench.db")
        self.coordinator = Coordinator(ScriptedEngine(tiny_tokenizer(), lambda r, p: "Fine. DONE"), self.store,
                                       MtrlConfig())
        self.server = start_server(create_app(self.coordinator), "127.0.0.1", 0)
        self.count = 0

    def spec(self) -> RolloutSpec:
        self.count += 1
        task = Task(id=f"t{self.count}", prompt=f"Task number {self.count}.")
        handle = self.coordinator.create_rollout(task)
        return RolloutSpec(handle.rollout_id, handle.group_id, task, handle.token, self.server.url, "policy",
                           SamplingParams(max_tokens=32), max_turns=TURNS["n"], timeout_s=300)

    def close(self) -> None:
        self.server.stop()
        self.store.close()


async def run_batch(executor: Any, served: Served, n: int, concurrency: int) -> float:
    """Run ``n`` rollouts, ``concurrency`` at a time; returns the wall time. Every rollout must complete."""
    slots = asyncio.Semaphore(concurrency)

    async def one() -> Any:
        async with slots:
            return await executor.run(served.spec())

    started = time.perf_counter()
    outcomes = await asyncio.gather(*(one() for _ in range(n)))
    elapsed = time.perf_counter() - started
    bad = [o.error for o in outcomes if o.status is not RolloutStatus.COMPLETED]
    if bad:
        raise RuntimeError(f"{len(bad)} of {n} rollouts did not complete: {bad[:2]}")
    return elapsed


async def measure(name: str, executor: Any, served: Served, args: argparse.Namespace) -> dict[str, Any]:
    await run_batch(executor, served, max(4, args.concurrency // 2), args.concurrency)  # warm-up: workers, connections
    singles = []
    for _ in range(args.sequential):
        singles.append(await run_batch(executor, served, 1, 1))
    batch_s = min([await run_batch(executor, served, args.rollouts, args.concurrency) for _ in range(args.repeats)])
    return {
        "executor": name,
        "sequential_ms_per_rollout_median": round(1000 * statistics.median(singles), 2),
        "sequential_ms_per_rollout_mean": round(1000 * statistics.mean(singles), 2),
        "concurrent_seconds": round(batch_s, 3),
        "rollouts_per_s": round(args.rollouts / batch_s, 2),
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rollouts", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--sequential", type=int, default=8)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--ray-cpus", type=int, default=2)
    parser.add_argument("--task-cpus", type=float, default=0.5)
    parser.add_argument("--actors", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3, help="concurrent batches per executor; the best counts")
    args = parser.parse_args()
    TURNS["n"] = args.turns
    import ray

    os.environ["RAY_AUTH_MODE"] = "disabled"
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="mtrl-bench-ray-") as tmp:
        served = Served(Path(tmp))
        try:
            results = [await measure("in-process", InProcessExecutor(agent), served, args)]
            ray.init(num_cpus=args.ray_cpus, include_dashboard=False, _temp_dir=str(Path(tmp) / "ray"),
                     log_to_driver=False)
            try:
                for name, executor in (
                    (f"ray tasks ({args.task_cpus:g} CPU each)", RayExecutor(agent, num_cpus=args.task_cpus)),
                    (f"ray actors ({args.actors} async actors)",
                     RayExecutor(agent, num_cpus=0, actors=args.actors, actor_concurrency=args.concurrency)),
                ):
                    results.append(await measure(name, executor, served, args))
                    await executor.close()
            finally:
                ray.shutdown()
        finally:
            served.close()
    load_after = os.getloadavg()
    base = results[0]
    for row in results:
        row["overhead_ms_per_rollout"] = round(row["sequential_ms_per_rollout_median"] - base["sequential_ms_per_rollout_median"], 2)
        row["rollouts_per_s_vs_in_process"] = round(row["rollouts_per_s"] / base["rollouts_per_s"], 2)
    print(f"scripted engine, {args.turns} turns per rollout, {args.rollouts} rollouts x {args.concurrency} in flight; "
          f"Ray: local cluster of {args.ray_cpus} CPUs; load average {load_before[0]:.2f} -> {load_after[0]:.2f} "
          f"on {os.cpu_count()} CPUs")
    print(f"{'executor':<30}{'median ms/rollout, 1 at a time':>32}{'overhead ms':>13}{'rollouts/s':>12}{'vs in-process':>15}")
    for row in results:
        print(f"{row['executor']:<30}{row['sequential_ms_per_rollout_median']:>32}{row['overhead_ms_per_rollout']:>13}"
              f"{row['rollouts_per_s']:>12}{row['rollouts_per_s_vs_in_process']:>14}x")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "ray_vs_inprocess",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in load_after], "dtype": "none (scripted engine: no model runs)"},
        "sizes": {"rollouts": args.rollouts, "concurrency": args.concurrency, "sequential": args.sequential,
                  "repeats": args.repeats,
                  "turns": args.turns, "ray_cpus": args.ray_cpus, "task_cpus": args.task_cpus, "actors": args.actors},
        "results": results,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(REPO)}")


if __name__ == "__main__":
    asyncio.run(main())
