"""Two roles against one shared policy: the aircraft example's planner + worker agent, SmolLM2-135M-Instruct, CPU.

Both arms use the same agent code, tasks, seeds and load (``examples/aircraft_inspection/roles.yaml`` and
``roles_shared.yaml``, shrunk by the flags): ``roles`` trains one LoRA adapter per role (the planner on its own
reward, the plan's score; the worker on the episode's), ``shared`` one adapter serving and learning both calls
on the episode's reward. Each arm runs once per seed of ``--seeds``. Per step: the episode's reward
(``episode_reward_mean``, in both arms; ``logged_reward_mean`` is the loop's ``rollout/reward/mean``, which a run
with roles logs as the mean of its roles'), the plan's score, each role's own reward and trained tokens
(``roles``), the tokens trained, and seconds per step, with the 1-minute load average when the step ended.
Training figures from few steps on a small load: noise bounds are wide; the file says the load.

    python bench/roles.py [--steps 3] [--group-size 2] [--batch 1] [--max-tokens 64] [--seeds 0 1] [--arms roles shared]

``--arms`` runs only those arms: two processes, one an arm (each with its own ``--out``), run both under the same
load.

Writes bench/results/roles.json after every step (a stopped bench keeps the steps it finished; ``finished``
says whether a run reached ``--steps``).
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
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _machine import cpu_bf16, machine_info  # noqa: E402
from mtrl_runtime.config import MtrlConfig  # noqa: E402
from mtrl_runtime.training import MultiTurnRLTrainer  # noqa: E402

RUNS = {"roles": ("roles.yaml", "run"), "shared": ("roles_shared.yaml", "run_one_policy")}


ROLE_FIGURES = ("rollout/reward/mean", "train/tokens_trained", "frozen")  # each role's, per step (``role/<r>/``)


# The episode's reward per step: a run with roles logs ``rollout/reward/mean`` as the mean of its roles' (the plan's
# score and the episode's, here), so its episode figure is the worker's, whom the agent rewards by the episode's
EPISODE_REWARD = {"roles": "role/worker/rollout/reward/mean", "shared": "rollout/reward/mean"}


def step_figures(name: str, report: object) -> dict:
    """One step's figures: the episode's reward, the plan's score, each role's own, tokens trained, seconds, load."""
    metrics = report.metrics
    return {"step": report.step, "episode_reward_mean": metrics[EPISODE_REWARD[name]],
            "logged_reward_mean": metrics["rollout/reward/mean"],
            "plan_score_mean": metrics.get("rollout/metrics/plan_score"),
            "tokens_trained": metrics.get("train/tokens_trained", 0.0),
            "seconds": metrics["time/step"], "load_1min": os.getloadavg()[0],
            **{k: v for k, v in metrics.items() if k.startswith("role/") and k.endswith(ROLE_FIGURES)}}


def _mean_of(values: list) -> float | None:
    """The mean of the steps that reported a value (None where none did: never a 0 for a missing figure)."""
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def run_one(name: str, seed: int, args: argparse.Namespace, tmp: Path, save: Callable[[dict], None]) -> dict:
    """One arm's run at ``seed``; ``save`` gets the run's figures so far after every step (``finished`` False),
    then the whole run."""
    from examples.aircraft_inspection import roles as agents

    config_file, agent = RUNS[name]
    config = MtrlConfig.from_yaml(ROOT / "examples" / "aircraft_inspection" / config_file).with_overrides({
        "core.run_dir": str(tmp / f"{name}-seed{seed}"), "core.max_steps": args.steps,
        "core.group_size": args.group_size,
        "core.train_batch_size": args.batch, "core.sampling_params.max_tokens": args.max_tokens,
        "core.dataset": str(ROOT / "examples" / "aircraft_inspection" / "instances" / "train.jsonl"),
        "core.seed": seed, "advanced.checkpoint_every": 0,
        "advanced.engine_options": {"dtype": "auto", "num_threads": args.threads},
    })
    steps: list[dict] = []
    started = time.perf_counter()

    def figures(finished: bool) -> dict:
        return {"run": name, "seed": seed, "config": f"examples/aircraft_inspection/{config_file}", "agent": agent,
                "finished": finished, "steps": steps,
                "episode_reward_mean_over_steps": _mean_of([s["episode_reward_mean"] for s in steps]),
                "plan_score_mean_over_steps": _mean_of([s["plan_score_mean"] for s in steps]),
                "wall_s": time.perf_counter() - started}

    def record(report: object) -> None:
        steps.append(step_figures(name, report))
        print(json.dumps({"run": name, "seed": seed, **steps[-1]}), flush=True)
        save(figures(finished=False))

    MultiTurnRLTrainer(agent_env=getattr(agents, agent), config=config, tracking=False).train(
        progress=False, on_step=record)
    return figures(finished=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="one run of each arm per seed")
    parser.add_argument("--arms", nargs="+", choices=list(RUNS), default=list(RUNS), help="the arms to run")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "roles.json"))
    args = parser.parse_args()
    load_before = os.getloadavg()
    dtype = "bf16" if cpu_bf16()["cpu_native_bf16"] else "fp32"
    runs: list[dict] = []

    def save(current: dict | None = None) -> None:
        out = {"bench": "roles", "args": vars(args), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "runs": runs + ([current] if current is not None else []),
               "machine": machine_info(load_before, os.getloadavg(), args.threads, dtype=dtype)}
        Path(args.out).write_text(json.dumps(out, indent=2) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for name in args.arms:
                runs.append(run_one(name, seed, args, Path(tmp), save))
                save()
                print(json.dumps({k: runs[-1][k] for k in ("run", "seed", "episode_reward_mean_over_steps",
                                                           "plan_score_mean_over_steps", "wall_s")}), flush=True)

if __name__ == "__main__":
    main()
