"""Two roles against one shared policy: the aircraft example's planner + worker agent, SmolLM2-135M-Instruct, CPU.

Both runs use the same agent code, tasks, seed and load (``examples/aircraft_inspection/roles.yaml`` and
``roles_shared.yaml``, shrunk by the flags): ``roles`` trains one LoRA adapter per role (the planner on its own
reward, the plan's score; the worker on the episode's), ``shared`` one adapter serving and learning both calls
on the episode's reward. Per step: the episode's reward (the worker's figure), the plan's score (the planner's),
and seconds per step. Training figures from few steps on a small load: noise bounds are wide; the file says the
load.

    python bench/roles.py [--steps 3] [--group-size 2] [--batch 1] [--max-tokens 64]

Writes bench/results/roles.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _machine import cpu_bf16, machine_info  # noqa: E402
from mtrl_runtime.config import MtrlConfig  # noqa: E402
from mtrl_runtime.training import MultiTurnRLTrainer  # noqa: E402

RUNS = {"roles": ("roles.yaml", "run"), "shared": ("roles_shared.yaml", "run_one_policy")}


def run_one(name: str, args: argparse.Namespace, tmp: Path) -> dict:
    from examples.aircraft_inspection import roles as agents

    config_file, agent = RUNS[name]
    config = MtrlConfig.from_yaml(ROOT / "examples" / "aircraft_inspection" / config_file).with_overrides({
        "core.run_dir": str(tmp / name), "core.max_steps": args.steps, "core.group_size": args.group_size,
        "core.train_batch_size": args.batch, "core.sampling_params.max_tokens": args.max_tokens,
        "core.dataset": str(ROOT / "examples" / "aircraft_inspection" / "instances" / "train.jsonl"),
        "core.seed": args.seed, "advanced.checkpoint_every": 0,
        "advanced.engine_options": {"dtype": "auto", "num_threads": args.threads},
    })
    started = time.perf_counter()
    result = MultiTurnRLTrainer(agent_env=getattr(agents, agent), config=config, tracking=False).train(progress=False)
    wall = time.perf_counter() - started
    steps = [{"step": r.step, "reward_mean": r.metrics["rollout/reward/mean"],
              "plan_score_mean": r.metrics.get("rollout/metrics/plan_score"),
              "seconds": r.metrics["time/step"],
              **{k: v for k, v in r.metrics.items() if k.startswith("role/") and k.endswith(
                  ("rollout/reward/mean", "train/tokens_trained", "frozen"))}} for r in result.reports]
    return {"run": name, "config": f"examples/aircraft_inspection/{config_file}", "agent": agent, "steps": steps,
            "reward_mean_over_steps": statistics.fmean(s["reward_mean"] for s in steps),
            "plan_score_mean_over_steps": statistics.fmean(s["plan_score_mean"] or 0.0 for s in steps),
            "wall_s": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "roles.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run_one(name, args, Path(tmp)) for name in RUNS]
    out = {"bench": "roles", "args": vars(args), "runs": runs,
           "machine": machine_info(load_before, os.getloadavg(), args.threads, dtype="bf16" if cpu_bf16()["cpu_native_bf16"] else "fp32")}
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({r["run"]: {k: r[k] for k in ("reward_mean_over_steps", "plan_score_mean_over_steps", "wall_s")}
                      for r in runs}, indent=2))


if __name__ == "__main__":
    main()
