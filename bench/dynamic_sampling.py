"""Dynamic sampling: rollouts spent and wasted per useful group, and useful groups per step, refill off vs on.

Two coordinators are served on 127.0.0.1 over the scripted engine (no model
runs: rollout counts do not depend on one); the training loop's own
collection (``training.sample_step``) runs the same steps of the same
seeded schedule on each, once with ``advanced.dynamic_sampling`` off and
once on, the two modes alternating step by step. Each task has a success
rate ``q`` (spread evenly over ``[0, 1]`` across the dataset, so the easiest
and hardest tasks mostly score all alike, as in a real run); a rollout
succeeds (reward 1, else 0) with probability ``q``, drawn from a generator
seeded by the rollout's task, step and slot in the group, so both modes see
the same coin flips for the same group.

A group is useful when the update trains on it (rewards not all equal under
``group_based``). Figures per mode: rollouts per useful group, rollouts
*wasted* per useful group (those of groups without signal), useful groups
per step (of ``--batch``), the share of steps with a full batch, the rounds
and the collection time per step.

    python bench/dynamic_sampling.py [--tasks 64] [--batch 8] [--group 4] [--steps 30] [--bound 8] [--seed 0]

Writes bench/results/dynamic_sampling.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from _machine import load_note, machine_info  # noqa: E402

from mtrl_adapters import aupdate_reward, current_rollout, rollout  # noqa: E402
from mtrl_runtime.config import MtrlConfig  # noqa: E402
from mtrl_runtime.coordinator import Coordinator  # noqa: E402
from mtrl_runtime.engines import ScriptedEngine  # noqa: E402
from mtrl_runtime.executors import InProcessExecutor  # noqa: E402
from mtrl_runtime.rollouts import Dispatcher, TaskSchedule, load_tasks  # noqa: E402
from mtrl_runtime.server import create_app, start_server  # noqa: E402
from mtrl_runtime.store import SQLiteStore  # noqa: E402
from mtrl_runtime.testing import tiny_tokenizer  # noqa: E402
from mtrl_runtime.training import sample_step  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "dynamic_sampling.json"


def make_agent() -> Any:
    import openai

    clients: dict[int, Any] = {}
    slots: Counter[str] = Counter()

    @rollout
    async def agent(task: Any) -> None:
        ctx = current_rollout()
        slot = slots[ctx.group_id]
        slots[ctx.group_id] += 1
        loop = id(asyncio.get_running_loop())
        if loop not in clients:
            clients[loop] = openai.AsyncOpenAI(base_url="http://bench.invalid/v1", api_key="unused", max_retries=0)
        await clients[loop].chat.completions.create(model="policy", messages=[{"role": "user", "content": task.prompt}])
        coin = random.Random(f"{task.id}:{ctx.group_id.split('-')[0]}:{slot}").random()  # same in both modes
        await aupdate_reward(1.0 if coin < task.data["q"] else 0.0)

    return agent


def config(args: argparse.Namespace, enabled: bool) -> MtrlConfig:
    return MtrlConfig.from_dict({
        "core": {"group_size": args.group, "train_batch_size": args.batch, "seed": args.seed, "max_turns": 1,
                 "sampling_params": {"max_tokens": 4}},
        "advanced": {"max_concurrency": 64, "rollout_timeout_s": 60,
                     "dynamic_sampling": {"enabled": enabled, "max_extra_groups": args.bound}},
    })


async def run(args: argparse.Namespace, sides: dict[str, Any], schedule: TaskSchedule) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in sides}
    for step in range(args.steps):
        for name, (dispatcher, cfg) in sides.items():
            started = time.perf_counter()
            sampled = await sample_step(dispatcher, schedule, step, cfg)
            out[name].append({**sampled.metrics, "seconds": time.perf_counter() - started,
                              "groups": len(sampled.batch.groups)})
    return out


def summary(steps: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    spent = sum(s["analysis/rollouts_spent"] for s in steps)
    useful = sum(s["analysis/useful_groups"] for s in steps)
    return {
        "rollouts": int(spent),
        "useful_groups": int(useful),
        "rollouts_per_useful_group": round(spent / useful, 3) if useful else None,
        "wasted_rollouts_per_useful_group": round((spent - useful * args.group) / useful, 3) if useful else None,
        "useful_groups_per_step": round(useful / len(steps), 3),
        "full_batch_steps_frac": round(sum(s["analysis/useful_groups"] >= args.batch for s in steps) / len(steps), 3),
        "refilled_groups_per_step": round(sum(s["analysis/refilled_groups"] for s in steps) / len(steps), 3),
        "refill_rounds_per_step": round(sum(s["analysis/refill_rounds"] for s in steps) / len(steps), 3),
        "collect_seconds_per_step": round(sum(s["seconds"] for s in steps) / len(steps), 4),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8, help="core.train_batch_size")
    parser.add_argument("--group", type=int, default=4, help="core.group_size")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--bound", type=int, default=8, help="advanced.dynamic_sampling.max_extra_groups")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = [{"id": f"task-{i}", "prompt": f"question {i}", "data": {"q": i / (args.tasks - 1)}} for i in range(args.tasks)]
    schedule = TaskSchedule.of(load_tasks(rows), args.batch, args.seed)
    load_before = os.getloadavg()
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    handles, stores = [], []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            sides = {}
            for name, enabled in (("off", False), ("on", True)):
                cfg = config(args, enabled)
                store = SQLiteStore(Path(tmp) / f"{name}.db")
                coordinator = Coordinator(ScriptedEngine(tiny_tokenizer(), lambda request, text: "DONE"), store, cfg)
                handle = start_server(create_app(coordinator), "127.0.0.1", 0)
                handles.append(handle)
                stores.append(store)
                sides[name] = (Dispatcher(coordinator, InProcessExecutor(make_agent()), cfg, handle.url, handle.loop), cfg)
            per_step = asyncio.run(run(args, sides, schedule))
        finally:
            for handle in handles:
                handle.stop()
            for store in stores:
                store.close()
    load_after = os.getloadavg()
    result = {name: summary(steps, args) for name, steps in per_step.items()}
    off, on = result["off"], result["on"]
    ratios = {
        "useful_groups_per_step_on_over_off": round(on["useful_groups_per_step"] / off["useful_groups_per_step"], 3),
        "rollouts_per_useful_group_on_over_off": round(on["rollouts_per_useful_group"] / off["rollouts_per_useful_group"], 3),
        "collect_seconds_per_step_on_over_off": round(on["collect_seconds_per_step"] / off["collect_seconds_per_step"], 3),
    }
    for name, row in result.items():
        print(f"refill {name:3}: " + ", ".join(f"{k} {v}" for k, v in row.items()))
    print("ratios: " + ", ".join(f"{k} {v}" for k, v in ratios.items()))
    print(f"uptime: {uptime_before}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "command": "python bench/dynamic_sampling.py " + " ".join(sys.argv[1:]),
        "config": vars(args),
        "machine": machine_info(load_before, load_after, threads=0, dtype="none (scripted engine: no model runs)"),
        "uptime": uptime_before,
        "load": load_note(load_before, load_after, "the seconds are noisy; the rollout counts are not"),
        "results": result,
        "ratios": ratios,
        "per_step": {name: [{k: round(v, 4) for k, v in s.items()} for s in steps] for name, steps in per_step.items()},
    }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
