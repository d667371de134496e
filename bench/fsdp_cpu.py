"""FSDP2 data-parallel training at world size 2 vs one process, on CPU: same result? what overhead?

A Qwen3-shaped model built from config (random weights; ``--hidden``,
``--layers``, ``--vocab``) and ``--rows`` samples per step of ``--tokens``
tokens (``--trained`` of them carry the loss). The same steps run on one
process (``PolicyUpdate``) and on a ``torchrun`` job of two processes
(``ShardedUpdate``, FSDP2 over gloo), one torch thread per process, in
turn. Both compute log-probabilities unchunked (``logprob_chunk_tokens=0``,
what the sharded update uses), without checkpointing, fp32 throughout, so
the sides differ only by float summation order and by the layout: packed
micro-batches in one process, one sample per rank per round in the job.
Step 0 warms up; steps 1..``--steps`` are timed.

For LoRA and for full fine-tuning it records each step's loss on both
sides, the largest and mean weight difference after the last step (as a
fraction of the learning rate: about one AdamW move), and two ratios of
median step figures, world size 2 over one process: wall-clock (2 cores
against 1: ideally 0.5) and CPU seconds summed over the ranks (the work
FSDP adds: gathers, reductions, padding; ideally 1.0). The CPU-time ratio
is the overhead figure: it holds on a shared, busy machine, where
wall-clock time depends on what else runs.

    python bench/fsdp_cpu.py [--hidden 512] [--layers 4] [--vocab 8192] [--rows 8] [--tokens 384]
                             [--trained 128] [--steps 3]

Writes bench/results/fsdp_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

RESULTS = Path(__file__).resolve().parent / "results" / "fsdp_cpu.json"
LR = 1e-3
KINDS = ("lora", "full")


def build_case(case: Path, args: argparse.Namespace) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from mtrl_runtime.types import Sample

    torch.manual_seed(0)
    heads = max(2, args.hidden // 64)
    config = Qwen3Config(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=heads // 2,
                         head_dim=64, tie_word_embeddings=True, max_position_embeddings=4096, pad_token_id=0)
    Qwen3ForCausalLM(config).save_pretrained(case / "model")
    rng = random.Random(0)
    steps = []
    for step in range(args.steps + 1):
        samples = []
        for i in range(args.rows):
            length = args.tokens - rng.randrange(0, args.tokens // 4)  # rows of different lengths, as rollouts are
            ids = tuple(rng.randrange(1, args.vocab) for _ in range(length))
            mask = (0,) * (length - args.trained) + (1,) * args.trained
            samples.append(Sample(
                rollout_id=f"s{step}-r{i}", group_id="g", segment=0, token_ids_T=ids, loss_mask_T=mask,
                behaviour_logprobs_T=tuple(-rng.uniform(8.0, 10.0) if m else 0.0 for m in mask),
                advantages_T=tuple((1.0 if i % 2 else -1.0) if m else 0.0 for m in mask),
                policy_version_T=tuple(0 if m else -1 for m in mask),
            ))
        steps.append(samples)
    torch.save(steps, case / "steps.pt")


def settings() -> Any:
    from mtrl_runtime.training import UpdateSettings

    return UpdateSettings(precision="fp32", learning_rate=LR, micro_batch_tokens=4096, gradient_checkpointing="off",
                          fit_memory=False, logprob_chunk_tokens=0)


def run_steps(update: Any, steps: list) -> tuple[list[float], list[float], list[float]]:
    """(loss, wall seconds, this process's CPU seconds) per step."""
    losses, seconds, cpu = [], [], []
    for samples in steps:
        started, started_cpu = time.perf_counter(), time.process_time()
        metrics = update.step(samples)
        seconds.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
        losses.append(metrics["train/loss"])
    return losses, seconds, cpu


def worker(case: Path, mode: str, kind: str) -> None:
    """One side of the comparison: ``one`` (this process alone) or ``fsdp`` (a rank of the torchrun job).

    In the job the leader stops the other rank after the warm-up step and
    starts it again, so each rank's CPU time of the timed steps is measured
    apart from the warm-up.
    """
    from mtrl_runtime.training import PolicyUpdate, ShardedUpdate, build_policy, build_sharded_policy, init_ranks
    from mtrl_runtime.training.distributed import exit_rank, leave_job

    torch.set_num_threads(1)
    steps = torch.load(case / "steps.pt", weights_only=False)
    ranks = init_ranks() if mode == "fsdp" else None
    torch.manual_seed(7)
    if ranks is None:
        policy = build_policy(case / "model", lora=kind == "lora", rank=16, alpha=32, device="cpu")
    else:  # only rank 0 reads the weights (and draws the LoRA initialisation); every rank fills its shards
        policy, initial = build_sharded_policy(case / "model", ranks.leader, lora=kind == "lora", rank=16, alpha=32)
    names = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    if ranks is None:
        update: Any = PolicyUpdate(policy, settings())
        losses, seconds, cpu = run_steps(update, steps)
        state = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
        others = 0.0
    else:
        update = ShardedUpdate.build(policy, settings(), ranks, initial)
        if not ranks.leader:
            update.follow()  # the warm-up step
            started = time.process_time()
            update.follow()  # the timed steps
            (case / f"fsdp-{kind}-rank{ranks.rank}.cpu").write_text(str(time.process_time() - started))
            update.full_state()
            leave_job()
            exit_rank(0)  # without the interpreter's shutdown, which gloo's threads can abort
        warm = run_steps(update, steps[:1])
        update.stop()
        timed = run_steps(update, steps[1:])
        update.stop()
        losses, seconds, cpu = (w + t for w, t in zip(warm, timed))
        state = update.full_state()
        leave_job()
        others = sum(float((case / f"fsdp-{kind}-rank{r}.cpu").read_text()) for r in range(1, ranks.world_size))
    assert sorted(state) == sorted(names)
    torch.save({"losses": losses, "seconds": seconds, "cpu": cpu, "others_cpu": others, "state": state,
                "parameters": sum(p.numel() for p in state.values())}, case / f"{mode}-{kind}.pt")


def compare(case: Path, kind: str) -> dict[str, Any]:
    one = torch.load(case / f"one-{kind}.pt", weights_only=False)
    two = torch.load(case / f"fsdp-{kind}.pt", weights_only=False)
    diffs = [float((one["state"][n] - two["state"][n]).abs().max()) for n in one["state"]]
    total = sum(t.numel() for t in one["state"].values())
    mean = sum(float((one["state"][n] - two["state"][n]).abs().sum()) for n in one["state"]) / total
    t_one, t_two = statistics.median(one["seconds"][1:]), statistics.median(two["seconds"][1:])
    timed = len(one["cpu"]) - 1
    cpu_one = sum(one["cpu"][1:]) / timed
    cpu_two = (sum(two["cpu"][1:]) + two["others_cpu"]) / timed
    return {
        "trained_parameters": one["parameters"],
        "loss_one_process": one["losses"],
        "loss_world_2": two["losses"],
        "max_loss_difference": max(abs(a - b) for a, b in zip(one["losses"], two["losses"])),
        "max_weight_difference_in_lr": max(diffs) / LR,
        "mean_weight_difference_in_lr": mean / LR,
        "step_wall_seconds_one_process": t_one,
        "step_wall_seconds_world_2": t_two,
        "wall_ratio_world_2_over_one": t_two / t_one,
        "step_cpu_seconds_one_process": cpu_one,
        "step_cpu_seconds_world_2_all_ranks": cpu_two,
        "cpu_overhead_ratio_world_2_over_one": cpu_two / cpu_one,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=384)
    parser.add_argument("--trained", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--worker", nargs=3, metavar=("CASE", "MODE", "KIND"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        case, mode, kind = args.worker
        worker(Path(case), mode, kind)
        return
    from _machine import load_note, machine_info

    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="mtrl-fsdp-bench-") as tmp:
        case = Path(tmp)
        build_case(case, args)
        me = str(Path(__file__).resolve())
        for kind in KINDS:
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            subprocess.run([sys.executable, me, "--worker", tmp, "one", kind], check=True, env=env)
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                            "--nproc-per-node", "2", me, "--worker", tmp, "fsdp", kind], check=True, env=env)
            results[kind] = compare(case, kind)
    load_after = os.getloadavg()
    out = {
        "command": "python bench/fsdp_cpu.py " + " ".join(sys.argv[1:]),
        "shape": {"model": "Qwen3 from config, random weights", "hidden": args.hidden, "layers": args.layers,
                  "vocab": args.vocab, "rows_per_step": args.rows, "tokens_per_row": f"{args.tokens * 3 // 4}..{args.tokens}",
                  "trained_per_row": args.trained, "timed_steps": args.steps, "lora_rank": 16},
        "sides": {"one_process": "PolicyUpdate, 1 torch thread",
                  "world_2": "torchrun, 2 x ShardedUpdate (FSDP2, gloo), 1 torch thread each"},
        "results": results,
        "machine": machine_info(load_before, load_after, 1, dtype="fp32"),
        "load": load_note(load_before, load_after, "both sides ran in turn on the same busy cores"),
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out["results"], indent=2))


if __name__ == "__main__":
    main()
