"""Asynchronous against synchronous training: wall-clock per step on the same task and seed.

The task is the synthetic two-step lookup task of the learning test (a real
Strands agent, the tiny model, the endpoint on 127.0.0.1, full fine-tuning),
run three ways with the same seed: the synchronous loop, and the
asynchronous loop with ``max_steps_off_policy`` 1 and 2 (rollouts of the
next steps run while the trainer updates). Twice: with an instant tool,
and with a tool that takes ``--tool-latency`` seconds (I/O the agent waits
on, as a real API or sandbox would), since that is the time async can hide.

Per configuration: mean and median seconds per step (step 0 excluded: it
has nothing to overlap with), time the trainer waited for rollouts, time in
the update, the mean staleness of trained samples, and the reward reached.

    python bench/async_vs_sync.py [--steps 10] [--tool-latency 0.1]

Writes bench/results/async_vs_sync.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the task lives beside the learning test

import torch  # noqa: E402

import _lookup_task as lookup  # noqa: E402
from _machine import cpu_bf16  # noqa: E402
from mtrl_runtime.config import MtrlConfig  # noqa: E402
from mtrl_runtime.training import MultiTurnRLTrainer  # noqa: E402

MODES = {"sync": None, "async_staleness_1": 1, "async_staleness_2": 2}


def run_one(mode: str, bound: int | None, steps: int, latency: float, seed: int) -> dict:
    lookup.TOOL_LATENCY_S = latency
    advanced = {"async_config": {"enabled": bound is not None, "max_steps_off_policy": bound or 0}}
    with tempfile.TemporaryDirectory() as tmp:
        cfg = lookup.config(Path(tmp) / "run", max_steps=steps, train_batch_size=4, seed=seed, advanced=advanced)
        started = time.perf_counter()
        result = MultiTurnRLTrainer(
            agent_env=lookup.agent, training_dataset=lookup.tasks(), config=MtrlConfig.from_dict(cfg),
            engine=lookup.build_engine(seed=seed), tracking=False,
        ).train(progress=False)
        wall = time.perf_counter() - started
    per_step = [r.metrics["time/step"] for r in result.reports[1:]]
    mean = lambda key: statistics.fmean(r.metrics[key] for r in result.reports[1:])  # noqa: E731
    return {
        "mode": mode,
        "max_steps_off_policy": bound or 0,
        "tool_latency_s": latency,
        "steps": steps,
        "seconds_per_step_mean": statistics.fmean(per_step),
        "seconds_per_step_median": statistics.median(per_step),
        "rollout_wait_s_mean": mean("time/rollout_wait"),
        "update_s_mean": mean("time/update"),
        "staleness_mean": mean("async/staleness_mean"),
        "stale_samples_dropped": sum(r.metrics["async/stale_samples_dropped"] for r in result.reports),
        "reward_last": result.reports[-1].metrics["rollout/reward/mean"],
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--tool-latency", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "async_vs_sync.json"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for latency in (0.0, args.tool_latency):
        for mode, bound in MODES.items():
            row = run_one(mode, bound, args.steps, latency, args.seed)
            rows.append(row)
            print(f"tool {latency:.2f}s  {mode:18s} {row['seconds_per_step_mean']:.3f} s/step "
                  f"(wait {row['rollout_wait_s_mean']:.3f}, update {row['update_s_mean']:.3f}, "
                  f"staleness {row['staleness_mean']:.2f}, reward {row['reward_last']:.2f})", flush=True)
    speedups = {}
    for latency in (0.0, args.tool_latency):
        base = next(r for r in rows if r["mode"] == "sync" and r["tool_latency_s"] == latency)
        for r in rows:
            if r["tool_latency_s"] == latency and r["mode"] != "sync":
                speedups[f"{r['mode']}@tool_{latency:g}s"] = base["seconds_per_step_mean"] / r["seconds_per_step_mean"]
    out = {
        "benchmark": "async_vs_sync",
        "command": "python bench/async_vs_sync.py " + " ".join(sys.argv[1:]),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "load_average_1m": os.getloadavg()[0], **cpu_bf16(),
                    "dtype": "fp32 (the tiny model's weights; precision: auto autocast in the update)"},
        "task": "tests/_lookup_task.py: Strands agent, tiny model, 4 prompts x 8 rollouts per step, full fine-tuning",
        "results": rows,
        "speedup_vs_sync": speedups,
    }
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(speedups, indent=2))


if __name__ == "__main__":
    main()
