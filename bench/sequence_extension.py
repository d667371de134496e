"""Sequence extension vs one sample per turn: tokens through the model and time per training step.

Synthetic agent trajectories (system prompt + tools, then per turn a tool
result and a reply, each turn's prompt extending the previous one) are
trained two ways with the same PolicyUpdate, steps interleaved so both see
the same machine load:

- extension: one sample per rollout (``build_samples``), loss mask on replies;
- per_turn:  one sample per turn (``per_turn_samples``), prompt + reply.

Both train exactly the same reply tokens with the same advantages. Goals:
>= 4x fewer tokens and >= 3x less time per step. Models: the tiny test Llama,
and SmolLM2-135M (the converted folder when it exists, otherwise a randomly
initialised model of the same shape: compute does not depend on the weights'
values). ``--precision-probe`` also times fp32 against bf16 autocast.

    python bench/sequence_extension.py --precision-probe   # tiny + smollm2, writes bench/results/...
    python bench/sequence_extension.py --models tiny --steps 5 --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from _machine import cpu_bf16
from mtrl_runtime.algorithms import build_samples, per_turn_samples
from mtrl_runtime.testing import tiny_model, tiny_tokenizer
from mtrl_runtime.training import PolicyUpdate, UpdateSettings, build_policy
from mtrl_runtime.types import Rollout, RolloutStatus, Turn

SMOLLM2_FOLDER = Path.home() / ".cache" / "mtrl" / "models" / "smollm2-135m-instruct"
RESULTS = Path(__file__).parent / "results" / "sequence_extension.json"


@dataclass(frozen=True)
class Shape:
    """Trajectory shape: tokens of the system prompt, per-turn glue (tool result + template) and reply."""

    rollouts: int
    turns: int
    system: int
    glue: int
    completion: int


def synthetic_rollout(rng: random.Random, vocab: int, shape: Shape, rollout_id: str) -> Rollout:
    """An extended multi-turn rollout of random tokens (ids >= 3 avoid the special tokens)."""

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(3, vocab) for _ in range(n))

    def jitter(n: int) -> int:
        return max(1, int(n * rng.uniform(0.75, 1.25)))

    turns, prompt = [], tokens(shape.system)
    for index in range(shape.turns):
        prompt = prompt + tokens(jitter(shape.glue))
        completion = tokens(jitter(shape.completion))
        turns.append(
            Turn(
                rollout_id=rollout_id, index=index, messages=(), prompt_ids=prompt,
                completion_ids=completion, logprobs=tuple(-rng.uniform(0.5, 3.0) for _ in completion),
                finish_reason="stop", completion_text="",
            )
        )
        prompt = prompt + completion
    return Rollout(id=rollout_id, task_id="t", group_id="g", status=RolloutStatus.COMPLETED,
                   turns=tuple(turns), reward=1.0)


def load_model(name: str) -> tuple[Any, int, str]:
    """(model, vocab size, description)."""
    if name == "tiny":
        tokenizer = tiny_tokenizer()
        return tiny_model(tokenizer), len(tokenizer), "tiny Llama (hidden 64, 2 layers)"
    if SMOLLM2_FOLDER.is_dir():
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(SMOLLM2_FOLDER, dtype=torch.float32)
        return model, model.config.vocab_size, f"SmolLM2-135M-Instruct ({SMOLLM2_FOLDER})"
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
        rope_theta=100000.0, tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval(), 49152, "SmolLM2-135M shape, random weights (folder not found)"


def run_model(name: str, shape: Shape, steps: int, precision: str, budget: int) -> dict[str, Any]:
    model, vocab, description = load_model(name)
    rng = random.Random(0)
    rollouts = [synthetic_rollout(rng, vocab, shape, f"r{i}") for i in range(shape.rollouts)]
    advantages = [[rng.choice([-1.0, 1.0])] * shape.turns for _ in rollouts]
    batches = {
        "extension": [s for r, a in zip(rollouts, advantages) for s in build_samples(r, a)],
        "per_turn": [s for r, a in zip(rollouts, advantages) for s in per_turn_samples(r, a)],
    }
    policy = build_policy(model, None, rank=32, alpha=64)
    settings = UpdateSettings(learning_rate=1e-6, micro_batch_tokens=budget, precision=precision)
    update = PolicyUpdate(policy, settings)
    timings: dict[str, list[float]] = {mode: [] for mode in batches}
    last: dict[str, dict[str, float]] = {}
    for step in range(steps + 1):  # step 0 warms up
        for mode, samples in batches.items():
            metrics = update.step(samples)
            last[mode] = metrics
            if step > 0:
                timings[mode].append(metrics["train/step_seconds"])
    modes = {}
    for mode, samples in batches.items():
        modes[mode] = {
            "samples": len(samples),
            "tokens_real": last[mode]["train/tokens_real"],
            "tokens_forward": last[mode]["train/tokens_forward"],
            "tokens_trained": last[mode]["train/tokens_trained"],
            "micro_batches": last[mode]["train/micro_batches"],
            "step_seconds_median": statistics.median(timings[mode]),
            "step_seconds_min": min(timings[mode]),
            "step_seconds_all": timings[mode],
        }
    ext, per = modes["extension"], modes["per_turn"]
    assert ext["tokens_trained"] == per["tokens_trained"], "both modes must train the same tokens"
    return {
        "model": name,
        "description": description,
        "shape": shape.__dict__,
        "precision": precision,
        "autocast": str(update.autocast_dtype),
        "micro_batch_tokens": budget,
        "modes": modes,
        "ratios": {
            "tokens_real": per["tokens_real"] / ext["tokens_real"],
            "tokens_forward": per["tokens_forward"] / ext["tokens_forward"],
            "step_time_median": per["step_seconds_median"] / ext["step_seconds_median"],
            "step_time_min": per["step_seconds_min"] / ext["step_seconds_min"],
        },
    }


def precision_probe(name: str, shape: Shape, steps: int, budget: int) -> dict[str, float]:
    """Median extension-step seconds in fp32 and with bf16 autocast, interleaved."""
    model, vocab, _ = load_model(name)
    rng = random.Random(1)
    rollouts = [synthetic_rollout(rng, vocab, shape, f"r{i}") for i in range(shape.rollouts)]
    samples = [s for r in rollouts for s in build_samples(r, [1.0] * shape.turns)]
    policy = build_policy(model, None, rank=32, alpha=64)
    updates = {
        p: PolicyUpdate(policy, UpdateSettings(learning_rate=1e-6, micro_batch_tokens=budget, precision=p))
        for p in ("fp32", "bf16")
    }
    times: dict[str, list[float]] = {p: [] for p in updates}
    for step in range(steps + 1):
        for p, update in updates.items():
            seconds = update.step(samples)["train/step_seconds"]
            if step > 0:
                times[p].append(seconds)
    return {f"{p}_step_seconds_median": statistics.median(t) for p, t in times.items()}


def print_result(result: dict[str, Any]) -> None:
    print(f"\n== {result['description']}  shape={result['shape']}  autocast={result['autocast']}")
    print(f"{'mode':<10} {'samples':>8} {'tokens':>9} {'padded':>9} {'trained':>8} {'s/step':>8}")
    for mode, m in result["modes"].items():
        print(f"{mode:<10} {m['samples']:>8} {m['tokens_real']:>9.0f} {m['tokens_forward']:>9.0f} "
              f"{m['tokens_trained']:>8.0f} {m['step_seconds_median']:>8.3f}")
    r = result["ratios"]
    tok_ok = "ok" if r["tokens_real"] >= 4 else "BELOW GOAL"
    time_ok = "ok" if r["step_time_median"] >= 3 else "BELOW GOAL"
    print(f"per_turn / extension: tokens x{r['tokens_real']:.2f} (goal >= 4: {tok_ok}), "
          f"padded x{r['tokens_forward']:.2f}, time x{r['step_time_median']:.2f} (goal >= 3: {time_ok})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2"], choices=["tiny", "smollm2"])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per mode (after one warm-up)")
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    parser.add_argument("--micro-batch-tokens", type=int, default=4096)
    parser.add_argument("--precision-probe", action="store_true", help="also time fp32 vs bf16 autocast")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (1 keeps timings steady on a shared machine)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    shapes = {  # agent-like: a long system prompt with tools, tool results, short replies
        "tiny": Shape(rollouts=8, turns=8, system=300, glue=80, completion=60),
        "smollm2": Shape(rollouts=2, turns=8, system=200, glue=60, completion=40),
    }
    report: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "platform": platform.platform(), "processor": platform.processor(),
            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "cuda": torch.cuda.is_available(), **cpu_bf16(),
            "dtype": "fp32 weights; each result's autocast says the update's precision",
        },
        "results": [],
    }
    for name in args.models:
        result = run_model(name, shapes[name], args.steps, args.precision, args.micro_batch_tokens)
        print_result(result)
        report["results"].append(result)
        if args.precision_probe:
            probe = precision_probe(name, shapes[name], args.steps, args.micro_batch_tokens)
            print(f"precision probe ({name}, extension step): {probe}")
            result["precision_probe"] = probe
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
