"""Warm start vs RL alone on the aircraft example: base → warm start (SFT) → RL, against RL from the base.

Both arms train the aircraft agent (``examples/aircraft_inspection``, the
Strands agent ``mtrl demo`` trains) with ``mtrl demo``'s recipe
(``cli.demo.DEMO_RECIPE``: SmolLM2-135M, LoRA r16, hf engine) under the same
wall-time budget, and run the same validation passes on the same test tasks
(``--val-tasks`` of the test split, fixed seeds, the strict scorer: every
answer field exact) every ``--val-every`` steps, before the first step and
after the last:

- ``rl_only``: RL from the base model until ``--budget-s`` seconds have passed.
- ``warm_start``: demonstrations, then ``mtrl sft`` (``warmstart.sft``), then
  RL from its adapter (``advanced.init_adapter``) for what is left of the
  same budget. The demonstrations' and the SFT's time count against it.
  ``--demos solver``: the reference solver's episodes
  (``examples/aircraft_inspection/solver.py``) for the first ``--demo-tasks``
  training aircraft, replayed through the real agent by the scripted engine
  (the agent's own prompts and tool schemas; SmolLM2's token ids) and kept
  when reward and strict score are 1. ``--demos rejection``: the base
  model's own rollouts of those tasks (``--demo-samples`` each), kept when
  both are 1 (rejection sampling).

The report (``bench/results/warm_start.json``, or ``--out``): strict
success of the base (RL alone's pass at step 0), of the warm start before RL
(the warm arm's pass at step 0), and of both arms after their budget; each
pass with the seconds spent so far; the seconds the warm arm took to reach
RL alone's final strict success, against RL alone's whole budget (the goal:
at most half). ``--tiny`` runs the whole pipeline on a tiny random model
(seconds; its figures mean nothing) to check the script.

    python bench/warm_start.py [--budget-s 7200] [--demos solver|rejection] [--demo-tasks 4] [--sft-epochs 3]
                               [--val-every 2] [--val-tasks 10] [--tiny] [--out PATH]

The machine is shared: run it when the load average is below the CPU count,
and read ``machine.loadavg_*`` in the results before comparing runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))

from _machine import load_note, machine_info  # noqa: E402

from mtrl_runtime.cli.demo import DEMO_RECIPE  # noqa: E402
from mtrl_runtime.config import MtrlConfig  # noqa: E402
from mtrl_runtime.engines import resolve_model  # noqa: E402
from mtrl_runtime.engines.hf import auto_dtype  # noqa: E402
from mtrl_runtime.evaluation import StrictScorer  # noqa: E402
from mtrl_runtime.rollouts import collect_rollouts, load_tasks  # noqa: E402
from mtrl_runtime.training import MultiTurnRLTrainer  # noqa: E402
from mtrl_runtime.warmstart import SftSettings, conversation_renderer, sft, store_demonstrations  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "warm_start.json"
STRICT = "val/strict/success_rate"


def rows(split: str, n: int | None = None) -> list[dict[str, Any]]:
    from mtrl_examples.aircraft_inspection import load_instances

    return [{**row, "data": {**row["data"], "fields": "full"}} for row in load_instances(split)][:n]


def strict(text: str, truth: Any) -> float:
    from mtrl_examples.aircraft_inspection import FIELD_SETS, strict_score

    return strict_score(text, truth, FIELD_SETS["full"])


def recipe(args: argparse.Namespace, run_dir: Path, model: str) -> MtrlConfig:
    """The demo's recipe, run for as many steps as the budget allows, validating every ``--val-every`` steps."""
    config = MtrlConfig.from_dict(DEMO_RECIPE)
    overrides: dict[str, Any] = {"core.run_dir": str(run_dir), "core.max_steps": args.max_steps,
                                 "core.val_every": args.val_every, "core.pass_k_values": [1],
                                 "core.model": model, "advanced.checkpoint_every": 0,
                                 # synchronous, as the recorded figures ran (the demo trains one version behind)
                                 "advanced.async_config.enabled": False,
                                 "advanced.engine_options": {"dtype": "float32" if args.tiny else "auto",
                                                             "num_threads": 2}}
    if args.tiny:  # a tiny random model: few steps, short replies, small LoRA
        overrides.update({"core.group_size": 2, "core.train_batch_size": 1, "core.lora_rank": 4,
                          "core.lora_alpha": 8, "core.sampling_params": {"temperature": 0.7, "max_tokens": 16},
                          "core.val_sampling_params": {"temperature": 0.7, "max_tokens": 16}, "core.max_turns": 2,
                          "advanced.precision": "fp32"})
    return config.with_overrides(overrides)


def rl(args: argparse.Namespace, config: MtrlConfig, budget_s: float, started: float) -> dict[str, Any]:
    """Train until ``budget_s`` seconds after ``started`` (or ``--max-steps``); the validation passes with times."""
    from mtrl_examples.aircraft_inspection.agent import run

    passes: list[dict[str, float]] = []
    train_started = time.perf_counter()

    def on_step(report: Any) -> bool:
        elapsed = time.perf_counter() - started
        if STRICT in report.metrics:
            passes.append({"step": report.step, "seconds": round(elapsed, 1), "strict": report.metrics[STRICT]})
            print(f"  step {report.step}: strict {report.metrics[STRICT]:.3f} at {elapsed:.0f} s", flush=True)
        return elapsed >= budget_s

    trainer = MultiTurnRLTrainer(agent_env=run, training_dataset=rows("train"), config=config,
                                 validation_dataset=rows("test", args.val_tasks), strict_scorer=strict,
                                 tracking=False)
    result = trainer.train(progress=False, on_step=on_step)
    last = result.reports[-1].metrics if result.reports else {}
    if STRICT in last and (not passes or passes[-1]["step"] != result.reports[-1].step):
        passes.append({"step": result.reports[-1].step, "seconds": round(time.perf_counter() - started, 1),
                       "strict": last[STRICT]})
    before = passes[0]["strict"] if passes and passes[0]["step"] == 0 else None  # the pass before any update
    return {"steps": result.final_step, "rl_seconds": round(time.perf_counter() - train_started, 1),
            "passes": passes, "before_rl_strict": before, "final_strict": passes[-1]["strict"] if passes else None}


def demonstrations(args: argparse.Namespace, work: Path, model: str) -> tuple[list[Any], dict[str, Any]]:
    """The warm start's demonstrations (``--demos``) from the first ``--demo-tasks`` training aircraft."""
    from mtrl_examples.aircraft_inspection.agent import run
    from mtrl_examples.aircraft_inspection.scripted import script

    train = rows("train", args.demo_tasks)
    config = recipe(args, work / "demos", model)
    if args.demos == "solver":  # the solver's episodes, replayed through the agent: its prompts, SmolLM2's ids
        script_file = work / "solver_script.json"
        script_file.write_text(json.dumps(script(train)))
        config = config.with_overrides({"core.engine": "scripted", "core.group_size": 1, "core.max_turns": 9,
                                        "core.sampling_params": {"max_tokens": 4096},
                                        "advanced.engine_options": {"script_file": str(script_file)}})
    else:  # the base model's own rollouts
        config = config.with_overrides({"core.group_size": args.demo_samples})
    collected = asyncio.run(collect_rollouts(config, run, load_tasks(train)))
    from transformers import AutoTokenizer

    renderer = conversation_renderer(AutoTokenizer.from_pretrained(resolve_model(model)), config.advanced.chat_format,
                                     config.advanced.history_training)
    demos, selection = store_demonstrations(work / "demos", renderer, min_reward=1.0,
                                            strict=StrictScorer(strict), success_threshold=1.0)
    return demos, {"source": args.demos, "tasks": len(train), "rollouts": len(collected.rollouts),
                   "selection": selection.summary(), "kept": len(demos)}


def warm_arm(args: argparse.Namespace, work: Path, model: str) -> dict[str, Any]:
    started = time.perf_counter()
    demos, demo_info = demonstrations(args, work, model)
    demo_s = time.perf_counter() - started
    print(f"warm start: {demo_info['selection']} ({demo_s:.0f} s)", flush=True)
    if not demos:
        return {"demonstrations": demo_info, "error": "no demonstration passed the filters: nothing to warm-start on"}
    config = recipe(args, work / "warm", model)
    sft_started = time.perf_counter()
    result = sft(config, demos, work / "sft", SftSettings(epochs=args.sft_epochs, learning_rate=args.sft_lr,
                                                          held_out=0.25 if len(demos) > 2 else 0.0,
                                                          batch_size=4, seed=0))
    sft_s = time.perf_counter() - sft_started
    config = config.with_overrides({"advanced.init_adapter": str(result.adapter)})
    out = rl(args, config, args.budget_s, started)
    return {"demonstrations": demo_info, "demo_seconds": round(demo_s, 1), "sft_seconds": round(sft_s, 1),
            "sft": {"held_out_before": result.held_out_before,
                    "epochs": [{"train": e.train_loss, "held_out": e.held_out_loss} for e in result.epochs]},
            **out}


def bench_model(args: argparse.Namespace, work: Path) -> str:
    """The demo's model, or with ``--tiny`` a tiny random Llama saved under ``work`` (its context widened: the
    aircraft prompts are longer than 4096 tiny tokens)."""
    if not args.tiny:
        return DEMO_RECIPE["core"]["model"]
    from mtrl_runtime.testing import save_tiny_model

    model = str(save_tiny_model(work / "tiny"))
    config_file = Path(model) / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "max_position_embeddings": 32768}))
    return model


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget-s", type=float, default=7200.0, help="wall-time budget of each arm (default 7200)")
    parser.add_argument("--max-steps", type=int, default=1000, help="a bound on the steps of each arm")
    parser.add_argument("--demos", choices=("solver", "rejection"), default="solver")
    parser.add_argument("--demo-tasks", type=int, default=4, help="training aircraft to take demonstrations of")
    parser.add_argument("--demo-samples", type=int, default=8, help="--demos rejection: base rollouts per task")
    parser.add_argument("--sft-epochs", type=int, default=3)
    parser.add_argument("--sft-lr", type=float, default=2e-4)
    parser.add_argument("--val-every", type=int, default=2, help="validation pass every N steps (and at 0 and the end)")
    parser.add_argument("--val-tasks", type=int, default=10, help="test aircraft per validation pass")
    parser.add_argument("--tiny", action="store_true", help="a tiny random model: check the pipeline in seconds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(2)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="warm_start-") as tmp:
        work = Path(tmp)
        model = bench_model(args, work)
        print(f"rl_only: {args.budget_s:.0f} s of RL from the base", flush=True)
        started = time.perf_counter()
        rl_only = rl(args, recipe(args, work / "rl_only", model), args.budget_s, started)
        print(f"warm_start: demonstrations ({args.demos}), SFT, then RL, {args.budget_s:.0f} s in all", flush=True)
        warm = warm_arm(args, work, model)
    load_after = os.getloadavg()
    target = rl_only["final_strict"]
    reached = None
    if target is not None and "passes" in warm:
        reached = next((p["seconds"] for p in warm["passes"] if p["strict"] >= target), None)
    warm["reached"] = reached
    summary = {
        "base_strict": rl_only["before_rl_strict"],
        "warm_start_strict_before_rl": warm.get("before_rl_strict"),
        "rl_only_final_strict": target,
        "warm_start_final_strict": warm.get("final_strict"),
        "warm_start_seconds_to_rl_only_final": reached,
        "rl_only_budget_s": args.budget_s,
        # the goal: warm start reaches RL alone's final strict success in at most half RL alone's time; undefined
        # when RL alone ends no better than the base (there is nothing to reach)
        "goal_met": None if target is None or rl_only["before_rl_strict"] is None
        or target <= rl_only["before_rl_strict"] else (reached is not None and reached <= args.budget_s / 2),
    }
    result = {
        "bench": "warm_start",
        "command": "python bench/warm_start.py " + " ".join(sys.argv[1:]),
        "model": "tiny random Llama (--tiny: the figures mean nothing)" if args.tiny else DEMO_RECIPE["core"]["model"],
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": machine_info(load_before, load_after, threads=2,
                                dtype="fp32" if args.tiny else auto_dtype("cpu")),  # what the recipe's auto ran
        "load": load_note(load_before, load_after, "both arms share the 2 cores with other work: compare with care"),
        "summary": summary,
        "arms": {"rl_only": rl_only, "warm_start": warm},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
