"""mtrl's training step against TRL's GRPOTrainer: training tokens/s (generation excluded) and wall time per step.

Both sides train SmolLM2-135M-Instruct (the converted local folder) with
the same settings: LoRA r16 alpha 32 on q/k/v/o/gate/up/down, dropout 0;
LoRA weights in fp32; ``--precision`` for the training forward: ``bf16``
(bf16 autocast, base weights bf16 unless ``--weights fp32``) or ``fp32``
(no autocast, fp32 weights); ``auto`` (the default) takes bf16 where this
CPU computes it natively (AVX512-BF16/AMX: the probe the engines use) and
fp32 elsewhere, each side's best precision on the machine; one prompt per step with 8
completions of exactly ``--max-tokens`` tokens (eos cannot end them: mtrl's
engine runs with no eos ids, TRL with ``min_new_tokens``), so every step
trains the same prompt + completion tokens on both sides; the same fixed
prompts (all the same length), the same reward (characters / 256, so a
group's rewards differ), learning rate, no KL term, one optimizer step per
batch, constant learning rate, ``--threads`` torch threads.

- mtrl: the real trainer (``MultiTurnRLTrainer``, synchronous loop) with the
  embedded hf engine sharing the policy's weights, and a single-turn
  OpenAI-client agent calling the endpoint on 127.0.0.1.
- TRL: ``GRPOTrainer`` (generation with transformers ``generate``), in the
  separate ``.venv-trl`` environment, driven by ``bench/_trl_runner.py``.

The two take turns step by step: mtrl's step ``i``, then TRL's step ``i``
(the TRL process waits on a pipe while mtrl runs and mtrl waits inside its
``on_step`` hook while TRL runs), so both see the same machine load.

What is timed per step:

- training time: mtrl's ``train/step_seconds`` (``PolicyUpdate.step``:
  forward, loss, backward, clipping, AdamW step); TRL's step less its
  ``_prepare_inputs`` (generation, rewards, advantages), see the runner;
- training tokens: prompt + completion tokens of the samples trained
  (mtrl ``train/tokens_real``; TRL the attention masks of its batch);
- wall time: from the end of the previous step to the end of this one,
  generation, rewards and bookkeeping included (mtrl: between calls of its
  ``on_step`` hook, less the time the hook spent running TRL).

``--warmup`` steps are excluded, then ``--steps`` are measured. If
``.venv-trl`` is missing, the TRL side is skipped with a message;
``--setup`` creates it (python3.11, torch 2.13.0 CPU, this environment's
transformers / peft / accelerate versions, TRL 1.16.0).

    python bench/trl_vs_mtrl.py [--steps 4] [--warmup 2] [--threads 2] [--precision auto|bf16|fp32]
                                [--weights fp32|bf16] [--max-tokens 64]
                                [--trl-gradient-checkpointing] [--no-trl] [--out PATH]
    python bench/trl_vs_mtrl.py --setup

Writes bench/results/trl_vs_mtrl.json (or ``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

import openai

from _machine import cpu_bf16
from mtrl_adapters import aupdate_reward

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "trl_vs_mtrl.json"
TRL_VENV = REPO / ".venv-trl"
RUNNER = REPO / "bench" / "_trl_runner.py"
TRL_VERSION = "1.16.0"
TORCH_VERSION = "2.13.0"  # pinned: an unpinned torch pulls the CUDA build
PROMPTS = [  # each is 37 tokens once SmolLM2's chat template is applied: the same tokens per step whatever the order
    "Explain how a bicycle stays upright.",
    "Describe a day at the beach.",
    "Write a poem about the moon.",
    "Explain why the sky is blue.",
    "Write a letter to a friend.",
]
TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def setup_commands() -> list[list[str]]:
    """The commands that create ``.venv-trl`` with this environment's transformers, peft and accelerate."""
    pip = [str(TRL_VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
    pinned = [f"{name}=={metadata.version(name)}" for name in ("transformers", "peft", "accelerate")]
    return [
        ["python3.11", "-m", "venv", str(TRL_VENV)],
        pip + [f"torch=={TORCH_VERSION}"],
        pip + pinned + [f"trl=={TRL_VERSION}"],
    ]


def create_trl_env() -> None:
    for command in setup_commands():
        print("+", " ".join(command), flush=True)
        subprocess.run(command, check=True)


def trl_python() -> Path | None:
    python = TRL_VENV / "bin" / "python"
    return python if python.is_file() else None


def make_agent() -> Any:
    """A single-turn OpenAI-client agent; reward: characters in the reply / 256 (TRL's reward is the same).

    It makes its client once, as an agent in production does (mtrl routes a
    shared client's calls per rollout); a client per call costs ~30 ms of CPU
    for its TLS context, taken from the decoding engine on 2 cores.
    """
    clients: list[openai.AsyncOpenAI] = []

    async def agent(task: Any) -> None:
        if not clients:
            clients.append(openai.AsyncOpenAI(api_key="sk-unused", max_retries=0))
        reply = await clients[0].chat.completions.create(
            model="policy", messages=[{"role": "user", "content": task.prompt}])
        await aupdate_reward(len(reply.choices[0].message.content or "") / 256)

    return agent


class TrlSide:
    """The TRL runner process (``bench/_trl_runner.py``): started, then run one step per ``step()``."""

    def __init__(self, python: Path, setup: dict[str, Any], folder: Path, runner: Path = RUNNER) -> None:
        self.log_path = folder / "trl.log"
        self.log = self.log_path.open("w")
        started = time.perf_counter()
        self.proc = subprocess.Popen(
            [str(python), str(runner), json.dumps(setup)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, text=True, cwd=folder, env=dict(os.environ, TOKENIZERS_PARALLELISM="false"),
        )
        self.info = self._read()
        self.info["startup_s"] = round(time.perf_counter() - started, 1)

    def _read(self) -> dict[str, Any]:
        line = self.proc.stdout.readline()
        if not line:
            self.log.flush()
            tail = self.log_path.read_text()[-3000:]
            raise RuntimeError(f"the TRL runner ended (exit {self.proc.wait()}); the end of its log:\n{tail}")
        return json.loads(line)

    def step(self) -> dict[str, Any]:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        except (BrokenPipeError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Interleave:
    """mtrl's ``on_step`` hook: records mtrl's step, then runs TRL's step of the same index."""

    def __init__(self, trl: TrlSide | None, total: int) -> None:
        self.trl = trl
        self.total = total
        self.mtrl: list[dict[str, Any]] = []
        self.trl_rows: list[dict[str, Any]] = []
        self.resumed: float | None = None  # when the hook last returned: mtrl's next step starts there

    def __call__(self, report: Any) -> bool:
        now = time.perf_counter()
        m = report.metrics
        row = {
            "step": report.step,
            "wall_s": now - self.resumed if self.resumed is not None else None,
            "generation_s": m["time/rollout"],
            "train_s": m.get("train/step_seconds"),  # absent when the step skipped its update
            "update_s": m["time/update"],
            "tokens": m.get("train/tokens_real", 0.0),
            "completion_tokens": m.get("train/tokens_trained", 0.0),
            "padded_tokens": m.get("train/tokens_forward", 0.0),
            "samples": m.get("train/samples", 0.0),
        }
        self.mtrl.append(row)
        line = f"step {report.step}: mtrl wall {_fmt(row['wall_s'])} s, train {_fmt(row['train_s'])} s"
        if self.trl is not None:
            trl = self.trl.step()
            self.trl_rows.append(trl)
            line += f" | TRL wall {trl['wall_s']:.1f} s, train {trl['train_s']:.1f} s"
        print(line, flush=True)
        self.resumed = time.perf_counter()
        return len(self.mtrl) >= self.total


def resolve_precision(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """``auto`` -> bf16 on a CPU that computes it natively, fp32 elsewhere; the weights follow unless given."""
    if args.precision == "auto":
        from mtrl_runtime.engines.hf import auto_dtype  # the engines' own rule: bf16 where the CPU computes it

        args.precision = auto_dtype("cpu")
    if args.weights is None:
        args.weights = args.precision
    if args.precision == "fp32" and args.weights == "bf16":
        parser.error("--weights bf16 with --precision fp32: fp32 training needs fp32 base weights (--precision auto "
                     "picks fp32 on a CPU without native bf16; pass --precision bf16 to measure bf16 autocast anyway)")


def precision_label(args: argparse.Namespace) -> str:
    """What both sides ran, as the results and the printout name it."""
    if args.precision == "fp32":
        return "fp32 weights, fp32 (no autocast)"
    return f"{args.weights} weights, bf16 autocast"


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def mtrl_config(args: argparse.Namespace, model: Path, folder: Path) -> Any:
    from mtrl_runtime.config import MtrlConfig

    return MtrlConfig.from_dict({
        "core": {
            "model": str(model), "run_dir": str(folder / "mtrl-run"), "group_size": args.group_size,
            "train_batch_size": 1, "max_steps": args.warmup + args.steps + 1,  # +1: no final checkpoint in a step
            "learning_rate": args.learning_rate, "lora_rank": 16, "lora_alpha": 32, "max_turns": 1,
            "sampling_params": {"max_tokens": args.max_tokens, "temperature": 1.0, "top_p": 1.0},
        },
        "advanced": {
            "precision": args.precision, "checkpoint_every": 0, "lora_dropout": 0.0, "kl_coef": 0.0,
            "lora_target_modules": TARGET_MODULES, "max_concurrency": args.group_size,
            "reward_range": [0.0, 64.0],  # characters / 256 passes 1 past ~60 tokens; TRL's reward is the same
        },
    })


def trl_setup(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    return {
        "model": str(model), "prompts": PROMPTS, "threads": args.threads, "bf16": args.precision == "bf16",
        "weights": {"fp32": "float32", "bf16": "bfloat16"}[args.weights],
        "gradient_checkpointing": args.trl_gradient_checkpointing, "group_size": args.group_size,
        "max_tokens": args.max_tokens, "learning_rate": args.learning_rate, "steps": args.warmup + args.steps,
        "seed": 0, "lora_rank": 16, "lora_alpha": 32, "target_modules": TARGET_MODULES,
    }


def run_sides(args: argparse.Namespace, python: Path | None, folder: Path) -> tuple[Interleave, dict[str, Any] | None]:
    """Start TRL (if any), then train mtrl with the hook that steps TRL after each mtrl step."""
    import torch

    from mtrl_runtime.engines import HFEngine, resolve_model
    from mtrl_runtime.training import MultiTurnRLTrainer

    torch.set_num_threads(args.threads)
    model = resolve_model("smollm2-135m")
    trl = TrlSide(python, trl_setup(args, model), folder) if python is not None else None
    hook = Interleave(trl, args.warmup + args.steps)
    engine = HFEngine(model, dtype=args.weights, eos_token_ids=(), num_threads=args.threads)  # no eos: full length
    try:
        MultiTurnRLTrainer(
            agent_env=make_agent(), training_dataset=[{"id": f"p{i}", "prompt": p} for i, p in enumerate(PROMPTS)],
            config=mtrl_config(args, model, folder), engine=engine, tracking=False,
        ).train(progress=False, on_step=hook)
    finally:
        asyncio.run(engine.close())
        if trl is not None:
            trl.close()
    return hook, trl.info if trl is not None else None


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures over the measured steps: tokens/s over the training part, wall time per step."""
    trained = [r for r in rows if r.get("train_s")]
    walls = [r["wall_s"] for r in rows]
    tokens = sum(r["tokens"] for r in trained)
    return {
        "steps": len(rows),
        "train_tokens_per_s": round(tokens / sum(r["train_s"] for r in trained), 1) if trained else None,
        "tokens_per_step": round(tokens / len(trained), 1) if trained else None,
        "train_s_mean": round(statistics.fmean(r["train_s"] for r in trained), 2) if trained else None,
        "generation_s_mean": round(statistics.fmean(r["generation_s"] for r in rows), 2),
        "wall_s_per_step_mean": round(statistics.fmean(walls), 2),
        "wall_s_per_step_median": round(statistics.median(walls), 2),
    }


def trl_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [dict(r, tokens=r["prompt_tokens"] + r["completion_tokens"]) for r in rows]


def write_results(args: argparse.Namespace, hook: Interleave, trl_info: dict[str, Any] | None,
                  load: tuple[tuple[float, ...], tuple[float, ...]], elapsed: float, out: Path) -> None:
    mtrl = summarize(hook.mtrl[args.warmup:])
    trl = summarize(trl_rows(hook.trl_rows[args.warmup:])) if trl_info is not None else None
    ratios = None
    if trl is not None and mtrl["train_tokens_per_s"] and trl["train_tokens_per_s"]:
        ratios = {"train_tokens_per_s": round(mtrl["train_tokens_per_s"] / trl["train_tokens_per_s"], 2),
                  "wall_per_step": round(trl["wall_s_per_step_mean"] / mtrl["wall_s_per_step_mean"], 2)}
    print(f"SmolLM2-135M-Instruct, LoRA r16, {precision_label(args)}, {args.group_size} x "
          f"{args.max_tokens} tokens per step, {args.threads} threads, {args.steps} steps after {args.warmup} "
          f"warm-up; load average {load[0][0]:.2f} -> {load[1][0]:.2f} on {os.cpu_count()} CPUs")
    print(f"{'':<24}{'mtrl':>10}{'TRL':>10}{'ratio':>8}")
    for label, key, better in (("train tokens/s", "train_tokens_per_s", "high"),
                               ("wall s/step (mean)", "wall_s_per_step_mean", "low"),
                               ("generation s/step", "generation_s_mean", "low"),
                               ("train s/step", "train_s_mean", "low"),
                               ("tokens/step", "tokens_per_step", None)):
        a, b = mtrl[key], trl[key] if trl else None
        ratio = f"{(a / b if better == 'high' else b / a):.2f}x" if better and a and b else "-"
        print(f"{label:<24}{a if a is not None else '-':>10}{b if b is not None else '-':>10}{ratio:>8}")
    print("goal (issue 21): mtrl >= 3x TRL in wall time per step, each side in its best precision for the CPU")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "trl_vs_mtrl",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "loadavg_before": [round(x, 2) for x in load[0]],
                    "loadavg_after": [round(x, 2) for x in load[1]], **cpu_bf16(),
                    "dtype": precision_label(args)},
        "model": "SmolLM2-135M-Instruct",
        "settings": {"weights": args.weights, "precision": args.precision,
                     "autocast": "bf16" if args.precision == "bf16" else None,
                     "lora": {"rank": 16, "alpha": 32, "dropout": 0.0,
                     "target_modules": TARGET_MODULES}, "group_size": args.group_size, "prompts_per_step": 1,
                     "max_tokens": args.max_tokens, "learning_rate": args.learning_rate, "threads": args.threads,
                     "warmup_steps": args.warmup, "measured_steps": args.steps,
                     "trl_gradient_checkpointing": args.trl_gradient_checkpointing},
        "mtrl": {"summary": mtrl, "steps": hook.mtrl},
        "trl": {"summary": trl, "steps": hook.trl_rows, "runner": trl_info} if trl_info is not None else None,
        "ratio_mtrl_over_trl": ratios,
        "skipped": None if trl_info is not None else "no .venv-trl (python bench/trl_vs_mtrl.py --setup)",
        "elapsed_s": round(elapsed, 1),
        "command": " ".join(["python", *sys.argv]),
    }, indent=2) + "\n")
    print(f"wrote {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="measured steps per side")
    parser.add_argument("--warmup", type=int, default=2, help="steps per side not measured")
    parser.add_argument("--threads", type=int, default=2, help="torch threads on both sides")
    parser.add_argument("--precision", choices=["auto", "bf16", "fp32"], default="auto",
                        help="the training forward: bf16 autocast or fp32; auto: bf16 where the CPU computes it "
                             "natively")
    parser.add_argument("--weights", choices=["fp32", "bf16"], default=None,
                        help="dtype of the base weights (default: the precision's; fp32 precision needs fp32)")
    parser.add_argument("--max-tokens", type=int, default=64, help="tokens per completion")
    parser.add_argument("--group-size", type=int, default=8, help="completions per prompt (one prompt per step)")
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--trl-gradient-checkpointing", action="store_true",
                        help="TRL's own default; off by default here, as mtrl does not use it")
    parser.add_argument("--no-trl", action="store_true", help="measure the mtrl side only")
    parser.add_argument("--setup", action="store_true", help="create .venv-trl for the TRL side, then exit")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON results")
    args = parser.parse_args()
    if args.setup:
        create_trl_env()
        return
    resolve_precision(args, parser)
    if args.steps < 1 or args.warmup < 1:
        parser.error(f"--steps and --warmup must be >= 1, got {args.steps} and {args.warmup}")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch starts its thread pool (here and in TRL)

    python = None if args.no_trl else trl_python()
    if python is None and not args.no_trl:
        print(f"{TRL_VENV.relative_to(REPO)} not found: TRL side skipped. Create it with "
              "`python bench/trl_vs_mtrl.py --setup`, which runs:")
        for command in setup_commands():
            print("   ", " ".join(command))
    load_before = os.getloadavg()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="mtrl-bench-trl-vs-mtrl-") as tmp:
        hook, trl_info = run_sides(args, python, Path(tmp))
    write_results(args, hook, trl_info, (load_before, os.getloadavg()), time.perf_counter() - started, args.out)


if __name__ == "__main__":
    main()
