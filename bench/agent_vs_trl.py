"""The aircraft inspection agent trained by mtrl and by TRL's GRPOTrainer, side by side: time per step and learning.

The job users run (``mtrl demo``'s recipe): SmolLM2-135M-Instruct, LoRA r16
alpha 32 on the seven projections, 2 tasks x 4 rollouts per step, learning
rate 1e-4, temperature 0.7, at most 9 model calls per episode, the SOP and
worked example as the prompt, the six fixture tools, the dense per-field
reward, no KL term. Each side in its best precision on the machine (bf16
where the CPU computes it natively, else fp32: the engines' own rule).

- mtrl: the real trainer with the example's real Strands agent
  (``examples.aircraft_inspection.agent:run``) on the embedded hf engine.
- TRL: ``GRPOTrainer`` in its multi-turn environment mode
  (``environment_factory``: the tools as methods of an environment class, as
  TRL's docs teach), in ``.venv-trl`` (``bench/_trl_agent_runner.py``).

Synchronous mtrl and TRL take turns step by step (mtrl's step i, then TRL's
step i), so both see the same machine load. ``--mtrl-async`` then trains
mtrl again in its default asynchronous mode (rollouts of the next step during
the update), alone: the overlap cannot take turns with another process.

Learning: every ``--val-every`` steps each side's adapter is kept (mtrl's
checkpoint, TRL's ``save_pretrained``; the time to save is outside the
step); after training, the same evaluator (``MultiTurnRLEvaluator``, the
strict scorer, the same seeds) scores the base model and every kept adapter
on the held-out test tasks, so the two sides differ only in how they trained.

What TRL cannot express of this task (the run records it, the README of the
results repeats it): a per-call token cap (``max_tokens`` 96 per model call;
TRL bounds the whole episode with ``max_completion_length``, here 9 x 96
model tokens plus the tool results); the turn limit counts model calls in
mtrl and tool rounds in TRL (``max_tool_calling_iterations`` = 8 for 9
calls); SmolLM2's template has no tools, so both sides render with mtrl's
Hermes-style ChatML template and TRL parses with its Hermes response
template, set by hand.

    python bench/agent_vs_trl.py [--steps 10] [--val-every 5] [--runs 2] [--first-seed 0] [--mtrl-async]
                                 [--eval-tasks 25] [--eval-samples 2] [--no-trl] [--out PATH]
    python bench/agent_vs_trl.py --setup        # creates .venv-trl (the same as bench/trl_vs_mtrl.py --setup)

TRL trains the step's 8 episodes in micro-batches of ``--trl-micro-batch``
(2; one optimizer step per step, as mtrl): all 8 at once (its settings'
``per_device_train_batch_size`` 8) ran the machine out of its 24 GiB in
the first step (the runner killed at 21.8 GB resident, 2026-12-03): the
logits of 8 episodes of up to ~3,000 tokens over a 49,152-token vocabulary.

Writes bench/results/agent_vs_trl.json (or ``--out``) once the base model is scored, then after each
seed, trained and scored whole (``settings.runs_done`` says how many), so a run stopped early keeps what it finished, and the
step rows of the run in progress to ``agent_vs_trl.partial.json`` after each step.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from _machine import machine_info, save_results
import trl_vs_mtrl
from trl_vs_mtrl import TRL_VENV, create_trl_env, trl_python

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "agent_vs_trl.json"
RUNNER = REPO / "bench" / "_trl_agent_runner.py"
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FIELDS = "full"  # the demo's default answer: all six fields


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def tasks(split: str) -> list[dict[str, Any]]:
    from mtrl_examples.aircraft_inspection import load_instances

    return [{**row, "data": {**row["data"], "fields": FIELDS}} for row in load_instances(split)]


def mtrl_config(args: argparse.Namespace, run_dir: Path, asynchronous: bool, seed: int) -> Any:
    from mtrl_runtime.cli._precision import resolve_precision
    from mtrl_runtime.cli.demo import demo_config

    config = demo_config(args.steps + 1, str(run_dir), 1 if asynchronous else 0)  # +1: no checkpoint inside step N
    config = config.with_overrides({"core.seed": seed, "advanced.checkpoint_every": args.val_every,
                                    "advanced.keep_checkpoints": args.steps + 2})
    return resolve_precision(config)[0]


class TrlSide(trl_vs_mtrl.TrlSide):
    """``bench/trl_vs_mtrl.py``'s runner process on the agent runner, which also saves its adapter between steps."""

    def __init__(self, python: Path, setup: dict[str, Any], folder: Path) -> None:
        super().__init__(python, setup, folder, runner=RUNNER)

    def save(self, path: Path) -> dict[str, Any]:
        self.proc.stdin.write(f"save {path}\n")
        self.proc.stdin.flush()
        return self._read()


def trl_setup(args: argparse.Namespace, config: Any, model: Path, seed: int) -> dict[str, Any]:
    from mtrl_runtime.chat import CHATML_TOOLS_TEMPLATE

    core = config.core
    max_tokens = core.sampling_params.max_tokens
    return {
        "model": str(model), "chat_template": CHATML_TOOLS_TEMPLATE, "tasks": tasks("train"),
        "threads": args.threads, "bf16": config.advanced.precision == "bf16",
        "weights": "bfloat16" if config.advanced.precision == "bf16" else "float32",
        "group_size": core.group_size, "tasks_per_step": core.train_batch_size, "max_turns": core.max_turns,
        # TRL bounds the whole episode: every call's cap plus the tool results (about 60 tokens each)
        "max_completion_length": core.max_turns * (max_tokens + args.tool_result_tokens),
        "temperature": core.sampling_params.temperature, "learning_rate": core.learning_rate,
        "steps": args.steps, "seed": seed, "lora_rank": core.lora_rank, "lora_alpha": core.lora_alpha,
        "target_modules": TARGET_MODULES, "micro_batch": args.trl_micro_batch,
    }


class Interleave:
    """mtrl's ``on_step`` hook: records mtrl's step, keeps adapters at validation steps, then runs TRL's step."""

    def __init__(self, trl: TrlSide | None, total: int, val_every: int, folder: Path,
                 progress: Callable[["Interleave"], None]) -> None:
        self.trl, self.total, self.val_every, self.folder = trl, total, val_every, folder
        self.progress = progress  # called after each step with this hook (the step rows so far)
        self.load_started = os.getloadavg()
        self.mtrl: list[dict[str, Any]] = []
        self.trl_rows: list[dict[str, Any]] = []
        self.trl_adapters: dict[int, str] = {}
        self.resumed: float | None = None
        self.started = time.perf_counter()

    def __call__(self, report: Any) -> bool:
        now = time.perf_counter()
        m = report.metrics
        self.mtrl.append({
            "step": report.step, "wall_s": now - (self.resumed if self.resumed is not None else self.started),
            "rollout_s": m.get("time/rollout"), "update_s": m.get("time/update"),
            "tokens_trained": m.get("train/tokens_real", 0.0), "samples": m.get("train/samples", 0.0),
            "reward_mean": m.get("rollout/reward/mean"), "load": load_avg(),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        })
        done = len(self.mtrl) >= self.total
        line = f"step {report.step}: mtrl wall {self.mtrl[-1]['wall_s']:.1f} s"
        if self.trl is not None:
            row = self.trl.step()
            row["load"] = load_avg()
            self.trl_rows.append(row)
            line += f" | TRL wall {row['wall_s']:.1f} s (generation {row['generation_s']:.1f} s)"
            steps_done = len(self.trl_rows)
            if steps_done % self.val_every == 0 or done:
                path = self.folder / "trl-adapters" / f"step-{steps_done}"
                self.trl.save(path)
                self.trl_adapters[steps_done] = str(path)
        print(line, flush=True)
        self.progress(self)
        self.resumed = time.perf_counter()
        return done


def train_mtrl(args: argparse.Namespace, folder: Path, seed: int, asynchronous: bool,
               trl_python_path: Path | None) -> dict[str, Any]:
    from mtrl_runtime.engines import resolve_model
    from mtrl_runtime.training import MultiTurnRLTrainer

    from mtrl_examples.aircraft_inspection.agent import run

    label = "mtrl-async" if asynchronous else "mtrl-sync"
    run_dir = folder / f"{label}-seed{seed}"
    config = mtrl_config(args, run_dir, asynchronous, seed)
    model = resolve_model(config.core.model)
    trl = None
    if trl_python_path is not None:
        trl = TrlSide(trl_python_path, trl_setup(args, config, model, seed), folder / f"trl-seed{seed}")
    hook = Interleave(trl, args.steps, args.val_every, folder / f"trl-seed{seed}",
                      lambda h: write_progress(args, label, seed, config.advanced.precision, h))
    try:
        MultiTurnRLTrainer(agent_env=run, training_dataset=tasks("train"), config=config,
                           tracking=False).train(progress=False, on_step=hook)
    finally:
        if trl is not None:
            trl.close()
    mtrl_adapters = {}
    for step_dir in sorted((run_dir / "checkpoints").glob("step-*")):
        found = sorted(step_dir.rglob("adapter_config.json"))
        if found:
            mtrl_adapters[int(step_dir.name.split("-")[1]) - 1] = str(found[0].parent)  # step-N holds N-1 steps
    return {"label": label, "seed": seed, "steps": hook.mtrl, "adapters": mtrl_adapters,
            "precision": config.advanced.precision,
            "trl": None if trl is None else {"steps": hook.trl_rows, "adapters": hook.trl_adapters,
                                             "runner": trl.info}}


def write_progress(args: argparse.Namespace, label: str, seed: int, precision: str, hook: Interleave) -> None:
    """The step rows of the run in progress, both sides, to ``<out>.partial.json`` after each step: a run stopped
    before its seed is trained and scored keeps its time figures."""
    save_results(args.out.with_suffix(".partial.json"), {
        "benchmark": "agent_vs_trl (in progress)", "label": label, "seed": seed, "steps_done": len(hook.mtrl),
        "machine": machine_info(hook.load_started, tuple(os.getloadavg()), args.threads, dtype=precision),
        "mtrl": hook.mtrl, "trl": hook.trl_rows, "command": " ".join(["python", *sys.argv]),
    })


def evaluate(args: argparse.Namespace, adapter: str | None, seed: int) -> dict[str, float]:
    """Strict success of ``adapter`` (None: the base model) on the held-out test tasks, the same way for both sides."""
    from mtrl_runtime.cli._precision import resolve_precision
    from mtrl_runtime.cli.demo import demo_config
    from mtrl_runtime.evaluation import MultiTurnRLEvaluator

    from mtrl_examples.aircraft_inspection import FIELD_SETS, strict_score
    from mtrl_examples.aircraft_inspection.agent import run

    fields = FIELD_SETS[FIELDS]
    with tempfile.TemporaryDirectory(prefix="mtrl-bench-eval-") as tmp:
        config = resolve_precision(demo_config(1, tmp, 0).with_overrides({"core.seed": seed}))[0]
        evaluator = MultiTurnRLEvaluator(
            agent_env=run, dataset=tasks("test"), config=config, adapter=adapter, evaluate_base_model=adapter is None,
            strict_scorer=lambda text, truth: strict_score(text, truth, fields), max_tasks=args.eval_tasks,
            max_samples=args.eval_samples, tracking=False, output_path=tmp)
        result = evaluator.evaluate()
    side = result.base if adapter is None else result.fine_tuned
    keys = ("val/strict/success_rate", "val/strict/pass_k_1", "val/reward/mean")
    return {k: round(float(side.metrics[k]), 4) for k in keys if k in side.metrics}


def summarize(rows: list[dict[str, Any]], rollout_key: str, update_key: str) -> dict[str, Any]:
    walls = [r["wall_s"] for r in rows]
    return {
        "steps": len(rows),
        "wall_s_per_step_mean": round(statistics.fmean(walls), 1),
        "wall_s_per_step_median": round(statistics.median(walls), 1),
        "rollout_s_mean": round(statistics.fmean(r[rollout_key] or 0.0 for r in rows), 1),
        "update_s_mean": round(statistics.fmean(r[update_key] or 0.0 for r in rows), 1),
        "tokens_trained_per_step": round(statistics.fmean(r["tokens_trained"] for r in rows), 1),
        "peak_rss_mb": max((r.get("peak_rss_mb") or 0.0) for r in rows),
    }


def trl_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(r, tokens_trained=r["prompt_tokens"] + r["completion_tokens"]) for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--val-every", type=int, default=5, help="keep each side's adapter every N steps")
    parser.add_argument("--runs", type=int, default=2, help="runs a side (seeds FIRST..FIRST+N-1)")
    parser.add_argument("--first-seed", type=int, default=0,
                        help="the first run's seed (FIRST): a later run adds seeds to an earlier one's")
    parser.add_argument("--mtrl-async", action="store_true", help="also train mtrl in its default async mode, alone")
    parser.add_argument("--eval-tasks", type=int, default=25, help="held-out test tasks (the whole split: 25)")
    parser.add_argument("--eval-samples", type=int, default=2, help="samples per test task")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tool-result-tokens", type=int, default=64,
                        help="tokens allowed per tool result in TRL's whole-episode completion budget")
    parser.add_argument("--trl-micro-batch", type=int, default=2,
                        help="episodes per TRL forward/backward (the step's 8 in micro-batches, one optimizer step)")
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--setup", action="store_true", help="create .venv-trl, then exit")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.setup:
        create_trl_env()
        return
    python = None if args.no_trl else trl_python()
    if python is None and not args.no_trl:
        raise SystemExit(f"no {TRL_VENV}: run `python bench/agent_vs_trl.py --setup` first (or pass --no-trl)")
    started = time.perf_counter()
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="mtrl-bench-agent-vs-trl-") as tmp:
        folder = Path(tmp)
        print("evaluating the base model on the test tasks", flush=True)
        base = evaluate(args, None, 0)
        report = save_results(args.out, build_report(args, runs, base, load_before, time.perf_counter() - started))
        seeds = range(args.first_seed, args.first_seed + args.runs)
        for done, seed in enumerate(seeds, 1):  # each seed trained and scored whole, the report written after it
            (folder / f"trl-seed{seed}").mkdir()
            these = [train_mtrl(args, folder, seed, False, python)]
            if args.mtrl_async:
                these.append(train_mtrl(args, folder, seed, True, None))
            print(f"evaluating seed {seed}'s kept adapters on the test tasks", flush=True)
            for r in these:
                r["eval"] = {step: evaluate(args, path, r["seed"]) for step, path in sorted(r["adapters"].items())}
                if r["trl"] is not None:
                    r["trl"]["eval"] = {step: evaluate(args, path, r["seed"])
                                        for step, path in sorted(r["trl"]["adapters"].items())}
            runs.extend(these)
            report = save_results(args.out, build_report(args, runs, base, load_before, time.perf_counter() - started))
            print(f"wrote {args.out} ({done} of {args.runs} runs a side)", flush=True)
    print(json.dumps(report["summary"], indent=2))


def build_report(args: argparse.Namespace, runs: list[dict[str, Any]], base: dict[str, float],
                 load_before: tuple[float, ...], elapsed: float) -> dict[str, Any]:
    summary: dict[str, Any] = {"base": base}
    for label in ("mtrl-sync", "mtrl-async"):
        mine = [r for r in runs if r["label"] == label]
        if mine:
            summary[label] = [dict(summarize(r["steps"], "rollout_s", "update_s"), seed=r["seed"],
                                   strict_success=r["eval"]) for r in mine]
    trl = [r for r in runs if r["trl"] is not None]
    if trl:
        summary["trl"] = [dict(summarize(trl_rows(r["trl"]["steps"]), "generation_s", "train_s"), seed=r["seed"],
                               strict_success=r["trl"]["eval"]) for r in trl]
        trl_wall = statistics.fmean(s["wall_s_per_step_mean"] for s in summary["trl"])
        summary["ratio_wall_per_step_trl_over_mtrl"] = {
            label: round(trl_wall / statistics.fmean(s["wall_s_per_step_mean"] for s in summary[label]), 2)
            for label in ("mtrl-sync", "mtrl-async") if label in summary}
    precision = runs[0]["precision"] if runs else None
    return {
        "benchmark": "agent_vs_trl",
        "machine": machine_info(tuple(load_before), tuple(os.getloadavg()), args.threads,
                                dtype=precision or "unknown"),
        "settings": {"steps": args.steps, "val_every": args.val_every, "runs": args.runs, "first_seed": args.first_seed,
                     "runs_done": len({r["seed"] for r in runs}),
                     "eval_tasks": args.eval_tasks, "eval_samples": args.eval_samples, "threads": args.threads,
                     "trl_micro_batch": args.trl_micro_batch,
                     "recipe": "mtrl demo (SmolLM2-135M, LoRA r16, 2 tasks x 4 rollouts, lr 1e-4, 96 tokens/call, "
                               "9 calls)", "tool_result_tokens": args.tool_result_tokens},
        "trl_cannot_express": [
            "a per-call token cap: max_completion_length bounds the whole episode (model and tool tokens)",
            "the turn limit as model calls: max_tool_calling_iterations counts tool rounds (8 for 9 calls)",
            "tool-call parsing for a template it does not know: the Hermes response template is set by hand",
        ],
        "summary": summary,
        "runs": runs,
        "elapsed_s": round(elapsed, 1),
        "command": " ".join(["python", *sys.argv]),
    }


if __name__ == "__main__":
    main()
