"""The policy update with peft's LoRA input cast and without it, under bf16 autocast: SmolLM2-135M, aircraft rows.

peft casts every LoRA layer's input to the adapter weights' dtype (fp32)
before the adapter's matmuls; under autocast those matmuls cast it back to
bf16. The update now leaves the input as it is while it runs
(``training/update/_precision.lora_inputs_uncast``). This benchmark builds
``--rows`` samples shaped like a demo step's (the aircraft prompt shared,
then ``--own`` tokens of each rollout's turns, ``--trained`` of them
generated) and times ``PolicyUpdate.step`` on two policies (same seed, same
LoRA init), one with the update as it is and one with peft's cast put back,
alternating, and checks that the two give the same loss and the same
weights after every step.

    python bench/lora_autocast.py [--rows 8] [--own 700] [--trained 270] [--repeats 3] [--threads 2]

Writes bench/results/lora_autocast.json.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from _machine import load_note, machine_info, model_dtype
from shared_prefix_update import make_samples, run_from_command_line
from mtrl_runtime.engines import resolve_model
from mtrl_runtime.engines.hf._pretrained import load_pretrained
from mtrl_runtime.training import PolicyUpdate, UpdateSettings, build_policy
from mtrl_runtime.training.update import _step

RESULTS = Path(__file__).resolve().parent / "results" / "lora_autocast.json"
SIDES = ("peft_cast", "uncast")


@contextlib.contextmanager
def peft_cast() -> Any:
    """The update as it was: peft's input cast left on."""
    kept = _step.lora_inputs_uncast
    _step.lora_inputs_uncast = lambda *_: contextlib.nullcontext()
    try:
        yield
    finally:
        _step.lora_inputs_uncast = kept


def main(args: argparse.Namespace) -> dict[str, Any]:
    torch.set_num_threads(args.threads)
    folder = resolve_model("smollm2-135m")
    updates = {}
    for side in SIDES:
        torch.manual_seed(0)
        model, tokenizer = load_pretrained(folder, "bf16", "cpu")
        policy = build_policy(model, tokenizer, rank=16, alpha=32)
        updates[side] = PolicyUpdate(policy, UpdateSettings(learning_rate=1e-4, micro_batch_tokens=args.budget,
                                                            precision="bf16"))
    samples, prefix_len = make_samples(tokenizer, args)
    load_before = os.getloadavg()
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    losses: dict[str, list[float]] = {side: [] for side in SIDES}
    for _ in range(args.repeats):
        for side in SIDES:
            with peft_cast() if side == "peft_cast" else contextlib.nullcontext():
                started = time.perf_counter()
                metrics = updates[side].step(samples)
                times[side].append(time.perf_counter() - started)
            losses[side].append(metrics["train/loss"])
    load_after = os.getloadavg()
    weights = {side: dict(updates[side].policy.model.named_parameters()) for side in SIDES}
    same_weights = all(torch.equal(p, weights["uncast"][name]) for name, p in weights["peft_cast"].items()
                       if p.requires_grad)
    cast, uncast = statistics.median(times["peft_cast"]), statistics.median(times["uncast"])
    result = {
        "benchmark": "lora_autocast",
        "machine": machine_info(load_before, load_after, args.threads, dtype=model_dtype(model)),
        "note": load_note(load_before, load_after, "both sides alternate, so they share the load"),
        "shape": {"rows": args.rows, "shared_prefix_tokens": prefix_len, "own_tokens": args.own,
                  "trained_tokens_per_row": args.trained, "micro_batch_tokens": args.budget,
                  "weights": "bf16 base, fp32 LoRA r16", "autocast": "bf16"},
        "peft_cast": {"step_s": [round(t, 2) for t in times["peft_cast"]], "median_s": round(cast, 2)},
        "uncast": {"step_s": [round(t, 2) for t in times["uncast"]], "median_s": round(uncast, 2)},
        "same_losses": losses["peft_cast"] == losses["uncast"],
        "same_weights_after": same_weights,
        "speedup": round(cast / uncast, 2),
    }
    print(f"peft's cast {cast:.1f} s/step, uncast {uncast:.1f} s/step: {cast / uncast:.2f}x; "
          f"same losses {result['same_losses']}, same weights {same_weights}")
    return result


if __name__ == "__main__":
    run_from_command_line(__doc__, main, RESULTS, own=700, trained=270, budget=4096)  # the demo recipe's budget
