"""``mtrl demo``: the main job. Train SmolLM2-135M-Instruct on the aircraft inspection SOP, on CPU.

It trains the Strands agent of ``examples/aircraft_inspection`` with LoRA
through the embedded hf engine, then evaluates the base model and the
trained adapter side by side on the held-out test split (same tasks, same
seeds) and prints a table: strict task success, per-field accuracy, pass@k,
completion rate. It ends by saying where the MLflow run is and how to serve
the trained agent.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from typing import Any, Iterator, Mapping

from ._command import Command

# The small-CPU recipe (DESIGN.md's defaults scaled to 2 cores and a 135M model).
DEMO_RECIPE: dict[str, Any] = {
    "core": {
        "model": "smollm2-135m",
        "engine": "hf",
        "run_dir": "runs/demo",
        "group_size": 4,
        "train_batch_size": 2,
        "max_steps": 10,
        "learning_rate": 1e-4,
        "advantage_method": "group_based",
        "loss_fn": "ppo",
        "lora_rank": 16,
        "lora_alpha": 32,
        "sampling_params": {"temperature": 0.7, "max_tokens": 96},
        "val_sampling_params": {"temperature": 0.7, "max_tokens": 96},
        "max_turns": 9,
        "pass_k_values": [1, 2],
        "success_threshold": 1.0,
        "val_every": 0,
        "seed": 0,
    },
    "advanced": {
        "chat_format": "hermes",  # SmolLM2's <tool_call> format (what the tokenizer is detected as)
        "micro_batch_tokens": 4096,
        "rollout_timeout_s": 900,
        "max_concurrency": 16,
        "checkpoint_every": 4,
        "engine_options": {"dtype": "auto", "num_threads": 2},  # auto: bf16 where the CPU has it natively
        # the next step's rollouts run while the trainer updates, one version behind at most: 1.24x faster
        # training with the same strict success on 2 cores (two runs a side, docs/performance.md); --staleness 0
        # trains synchronously
        "async_config": {"enabled": True, "max_steps_off_policy": 1},
    },
}

TABLE_ROWS = (
    ("strict task success", "val/strict/success_rate"),
    ("reward (mean)", "val/reward/mean"),
    ("strict pass@1", "val/strict/pass_k_1"),
    ("strict pass@2", "val/strict/pass_k_2"),
    ("completion rate", "val/completed_frac"),
    ("answer well-formed", "val/metrics/format_ok"),
    ("field accuracy (all)", "val/metrics/field_acc"),
)


def _demo_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--steps", type=int, help=f"training steps (default {DEMO_RECIPE['core']['max_steps']})")
    p.add_argument("--run-dir", help="the run folder (default runs/demo)")
    p.add_argument("--staleness", type=int,
                   help="rollouts of the next steps run while the trainer updates, at most this many versions behind "
                        "(advanced.async_config.max_steps_off_policy; 0: synchronous; default: the recipe's)")
    p.add_argument("--eval-tasks", type=int, default=25, help="test tasks to evaluate (default: the whole split, 25)")
    p.add_argument("--samples", type=int, default=2, help="samples per test task (pass@k up to this)")
    p.add_argument("--fields", default="full", help="answer fields: full (six), three, or decision")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    p.add_argument("--agent-logs", action="store_true",
                   help="show the agent framework's warnings (an unknown tool name, a refused turn) while it runs")


@contextlib.contextmanager
def _agent_logs(show: bool) -> Iterator[None]:
    """Hide Strands' log lines while the demo runs, unless ``show``; the level is restored after.

    Strands logs each call of an unknown tool and each turn refused past
    ``max_turns``: the agent's own mistakes, which training is there to
    fix. The trajectory store records every one of them (tool calls with
    their errors), so the demo's progress stays readable without them.
    """
    logger = logging.getLogger("strands")
    before = logger.level
    if not show:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(before)


def _rows(split: str, fields: str) -> list[dict[str, Any]]:
    from mtrl_examples.aircraft_inspection import load_instances

    rows = []
    for row in load_instances(split):
        rows.append({**row, "data": {**row["data"], "fields": fields}})
    return rows


def _table(base: Mapping[str, float], trained: Mapping[str, float]) -> Any:
    from rich.table import Table

    table = Table(title="aircraft inspection, held-out test split")
    table.add_column("metric")
    table.add_column("base", justify="right")
    table.add_column("trained", justify="right")
    table.add_column("change", justify="right")
    per_field = "val/metrics/field_acc_"  # the evaluator's name for the rollout metric field_acc/<field>
    keys = list(TABLE_ROWS) + [
        (f"  {k[len(per_field):]}", k) for k in sorted({*base, *trained}) if k.startswith(per_field)
    ]
    for label, key in keys:
        if key in base or key in trained:
            b, t = base.get(key, float("nan")), trained.get(key, float("nan"))
            table.add_row(label, f"{b:.3f}", f"{t:.3f}", f"{t - b:+.3f}")
    return table


def _demo(args: argparse.Namespace) -> int:
    from rich.console import Console

    from mtrl_examples.aircraft_inspection import FIELD_SETS, strict_score
    from mtrl_examples.aircraft_inspection.agent import run

    from ..evaluation import MultiTurnRLEvaluator
    from ..training import MultiTurnRLTrainer
    from ._demo_timing import demo_timing, timing_lines
    from ._load_sampler import LoadSampler
    from ._precision import resolve_precision

    console = Console()
    if args.fields not in FIELD_SETS:
        raise SystemExit(f"--fields: expected one of {', '.join(FIELD_SETS)}, got {args.fields!r}")
    fields = FIELD_SETS[args.fields]
    config, precision = resolve_precision(demo_config(args.steps, args.run_dir, args.staleness))
    console.print(f"[bold]mtrl demo[/]: {config.core.model}, LoRA r{config.core.lora_rank}, "
                  f"{config.core.max_steps} steps × {config.core.train_batch_size} tasks × {config.core.group_size} rollouts, "
                  + training_mode(config))
    console.print(precision)
    trainer = MultiTurnRLTrainer(agent_env=run, training_dataset=_rows("train", args.fields), config=config,
                                 tracking=not args.no_mlflow)
    load = LoadSampler(interval_s=15.0).start()  # through training and evaluation, for the closing lines
    started = time.perf_counter()
    with _agent_logs(args.agent_logs):
        result = trainer.train(progress=True)
    training_s = time.perf_counter() - started
    console.print(f"trained steps {result.start_step + 1}..{result.final_step}; adapter: {result.output_adapter_path}")

    evaluator = MultiTurnRLEvaluator(
        model=trainer,
        dataset=_rows("test", args.fields),
        evaluate_base_model=True,
        strict_scorer=lambda text, truth: strict_score(text, truth, fields),
        max_tasks=args.eval_tasks,
        max_samples=args.samples,
        tracking=not args.no_mlflow,
    )
    started = time.perf_counter()
    with _agent_logs(args.agent_logs):
        evaluation = evaluator.evaluate()
    evaluation_s = time.perf_counter() - started
    load_while_running = load.stop()
    base = evaluation.base.metrics if evaluation.base else {}
    trained = evaluation.fine_tuned.metrics if evaluation.fine_tuned else {}
    console.print(_table(base, trained))
    if evaluation.report is not None:
        console.print(f"report: {evaluation.report}")
    if result.tracking_uri:
        from ..tracking import ui_command

        console.print(f"MLflow run {result.mlflow_run_id}: open it with\n  {ui_command(result.tracking_uri)}",
                      markup=False, highlight=False)
    console.print(f"serve the trained agent (OpenAI-compatible, http://127.0.0.1:8731/v1):\n"
                  f"  mtrl serve --adapter {config.run_dir} --inference\n"
                  f"or export it (a peft adapter; --merged for a standalone model folder vLLM serves too):\n"
                  f"  mtrl export {config.run_dir} {config.run_dir / 'export'} --merged")
    timing = demo_timing([r.metrics for r in result.reports], training_s, evaluation_s, load_while_running,
                         int(config.advanced.engine_options.get("num_threads") or 1))
    for line in timing_lines(timing, precision):
        console.print(line)
    return 0


def demo_config(steps: int | None = None, run_dir: str | None = None, staleness: int | None = None) -> Any:
    """The demo recipe as an ``MtrlConfig`` with the command line's overrides (None: the recipe's).

    ``staleness`` > 0 trains asynchronously, the next steps' rollouts running while the trainer updates, at
    most that many versions behind (``advanced.async_config``); 0 trains synchronously.
    """
    from ..config import MtrlConfig

    overrides: dict[str, Any] = {"core.max_steps": steps, "core.run_dir": run_dir}
    if staleness is not None:
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise SystemExit(f"--staleness: expected an int >= 0, got {staleness!r}")
        overrides.update({"advanced.async_config.enabled": staleness > 0,
                          "advanced.async_config.max_steps_off_policy": staleness})
    return MtrlConfig.from_dict(DEMO_RECIPE).with_overrides({k: v for k, v in overrides.items() if v is not None})


def training_mode(config: Any) -> str:
    """How ``config`` trains, in words: synchronous, or asynchronous with its staleness bound."""
    asynchronous = config.advanced.async_config
    if asynchronous.enabled and asynchronous.max_steps_off_policy > 0:
        return f"asynchronous (rollouts at most {asynchronous.max_steps_off_policy} version(s) behind)"
    return "synchronous"


DEMO = Command("demo", "train SmolLM2-135M on the aircraft inspection SOP on CPU, then compare it with the base",
               _demo_args, _demo)
