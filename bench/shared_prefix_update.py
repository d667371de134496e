"""The policy update with and without computing a shared prompt prefix once: SmolLM2-135M, LoRA, aircraft shapes.

A group of multi-turn samples shares its opening (system prompt, tool
definitions, the worked example). This benchmark builds ``--rows`` samples
the way a demo step sees them: the aircraft prompt (the shared prefix) plus
``--own`` tokens of each rollout's own turns, of which the generated ones
(``--trained`` per row) carry the loss. It times ``PolicyUpdate.step`` on the
same samples with ``share_prefix`` off and on, alternating, on one policy
each (same seed, same LoRA init), and checks both give the same loss.

    python bench/shared_prefix_update.py [--rows 8] [--own 800] [--trained 300] [--repeats 3] [--threads 2]

Writes bench/results/shared_prefix_update.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from _machine import load_note, machine_info, model_dtype
from mtrl_examples.aircraft_inspection import TOOL_SPECS, build_messages, load_instances
from mtrl_runtime.chat import ChatRenderer
from mtrl_runtime.engines import resolve_model
from mtrl_runtime.engines.hf._pretrained import load_pretrained
from mtrl_runtime.training import PolicyUpdate, UpdateSettings, build_policy
from mtrl_runtime.types import Sample

RESULTS = Path(__file__).resolve().parent / "results" / "shared_prefix_update.json"


def make_samples(tokenizer: Any, args: argparse.Namespace) -> tuple[list[Sample], int]:
    renderer = ChatRenderer(tokenizer)
    rows = load_instances("train")
    # the shared part: everything before the request (system, tools, worked example)
    messages = build_messages(rows[0])
    prefix = renderer.encode(renderer.render(messages[:-1], TOOL_SPECS, add_generation_prompt=False))
    rng = random.Random(0)
    samples = []
    for i in range(args.rows):
        own = [rng.randrange(100, 40000) for _ in range(args.own)]
        ids = tuple(prefix + own)
        mask = tuple([0] * (len(ids) - args.trained) + [1] * args.trained)
        samples.append(Sample(
            rollout_id=f"r{i}", group_id="g", segment=0, token_ids_T=ids, loss_mask_T=mask,
            behaviour_logprobs_T=tuple(-2.0 if m else 0.0 for m in mask),
            advantages_T=tuple((1.0 if i % 2 else -1.0) if m else 0.0 for m in mask),
            policy_version_T=tuple(0 if m else -1 for m in mask),
        ))
    return samples, len(prefix)


def main(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    folder = resolve_model("smollm2-135m")
    updates = {}
    for share in (False, True):
        torch.manual_seed(0)
        model, tokenizer = load_pretrained(folder, "bf16", "cpu")
        policy = build_policy(model, tokenizer, rank=16, alpha=32)
        settings = UpdateSettings(learning_rate=1e-6, micro_batch_tokens=args.budget, precision="bf16",
                                  share_prefix=share)
        updates[share] = PolicyUpdate(policy, settings)
    samples, prefix_len = make_samples(tokenizer, args)
    load_before = os.getloadavg()
    times: dict[bool, list[float]] = {False: [], True: []}
    metrics: dict[bool, dict[str, float]] = {}
    for _ in range(args.repeats):
        for share in (False, True):
            started = time.perf_counter()
            metrics[share] = updates[share].step(samples)
            times[share].append(time.perf_counter() - started)
    load_after = os.getloadavg()
    plain, shared = statistics.median(times[False]), statistics.median(times[True])
    result = {
        "benchmark": "shared_prefix_update",
        "machine": machine_info(load_before, load_after, args.threads, dtype=model_dtype(model)),
        "note": load_note(load_before, load_after, "both sides alternate, so they share the load"),
        "shape": {"rows": args.rows, "shared_prefix_tokens": prefix_len, "own_tokens": args.own,
                  "trained_tokens_per_row": args.trained, "micro_batch_tokens": args.budget,
                  "weights": "bf16", "lora_rank": 16},
        "plain": {"step_s": [round(t, 2) for t in times[False]], "median_s": round(plain, 2),
                  "tokens_forward": metrics[False]["train/tokens_forward"],
                  "loss": metrics[False]["train/loss"]},
        "shared_prefix": {"step_s": [round(t, 2) for t in times[True]], "median_s": round(shared, 2),
                          "tokens_forward": metrics[True]["train/tokens_forward"],
                          "tokens_shared": metrics[True]["train/tokens_shared"],
                          "loss": metrics[True]["train/loss"]},
        "speedup": round(plain / shared, 2),
    }
    print(f"plain {plain:.1f} s/step ({metrics[False]['train/tokens_forward']:.0f} tokens forward), "
          f"shared prefix {shared:.1f} s/step ({metrics[True]['train/tokens_forward']:.0f}): "
          f"{plain / shared:.2f}x")
    return result


def run_from_command_line(doc: str, bench: Any, results: Path, own: int, trained: int, budget: int) -> None:
    """Parse the demo-shaped rows' options (these defaults), run ``bench(args)`` and write its result to --out."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--own", type=int, default=own, help="each row's own tokens after the shared prefix")
    parser.add_argument("--trained", type=int, default=trained, help="loss tokens per row (the last ones)")
    parser.add_argument("--budget", type=int, default=budget, help="micro_batch_tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=results)
    args = parser.parse_args()
    result = bench(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    run_from_command_line(__doc__, main, RESULTS, own=800, trained=300, budget=8192)
