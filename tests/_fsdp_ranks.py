"""One rank of the FSDP2 test job; started by tests/test_distributed.py through torchrun.

    torchrun --standalone --nproc-per-node 2 tests/_fsdp_ranks.py CASE_DIR

CASE_DIR holds ``model/`` (a tiny Qwen3 saved with save_pretrained) and
``steps.pt`` (a list of sample lists, one per step). For LoRA and for full
fine-tuning, every rank builds the policy from the folder (rank 0's LoRA
initialisation is broadcast), shards it, and rank 0 leads the steps, a
weights save and a checkpoint save while rank 1 follows. Rank 0 writes each
step's metrics and the gathered weights to ``<CASE_DIR>/<kind>.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from mtrl_runtime.training import ShardedUpdate, UpdateSettings, build_policy, init_ranks


def settings(kind: str) -> UpdateSettings:
    """fp32 (no bf16 rounding between the two layouts); LoRA with activation checkpointing (the GPU default)."""
    return UpdateSettings(precision="fp32", learning_rate=1e-2, gradient_checkpointing="on" if kind == "lora" else "off")


def main(case: Path) -> None:
    ranks = init_ranks()
    steps = torch.load(case / "steps.pt", weights_only=False)
    for kind in ("lora", "full"):
        torch.manual_seed(1234 + ranks.rank)  # rank 1's own LoRA init must not matter: rank 0's is broadcast
        policy = build_policy(case / "model", lora=kind == "lora", rank=4, alpha=8, device="cpu")
        sharded = ShardedUpdate.build(policy, settings(kind), ranks)
        if not ranks.leader:
            sharded.follow()
            sharded.full_state()  # the leader gathers after the stop, outside the command protocol
            continue
        metrics = [sharded.step(samples) for samples in steps]
        sharded.save_weights(case / f"{kind}-weights")
        sharded.save_checkpoint(case / f"{kind}-checkpoint")
        sharded.stop()
        torch.save({"metrics": metrics, "state": sharded.full_state()}, case / f"{kind}.pt")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
