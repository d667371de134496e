"""One rank of the FSDP2 test job; started by tests/test_distributed.py through torchrun.

    torchrun --standalone --nproc-per-node 2 tests/_fsdp_ranks.py CASE_DIR

CASE_DIR holds ``model/`` (a tiny Qwen3 saved with save_pretrained) and
``steps.pt`` (a list of sample lists, one per step). For LoRA and for full
fine-tuning, only rank 0 reads the folder's weights; every rank builds the
policy on the meta device, shards it and receives rank 0's weights (LoRA
initialisation included); rank 0 leads the steps, a weights save and a
checkpoint save while rank 1 follows. Rank 1 writes to
``<CASE_DIR>/<kind>-rank1.pt`` what it held: the weight files it opened
(recorded by a hook on transformers' loader and safetensors), the bytes of
its parameters before and after sharding, whether its embeddings are still
tied to the head, its buffers (rotary ``inv_freq``) and the memory estimate
of its step (``PolicyUpdate.memory_estimate``); last, the frozen reference
copy of full fine-tuning with a KL term, as rank 1 holds it
(``reference-rank1.pt``). Rank 0 records the
weight files it opened too: the hook is seen to work. Rank 0 writes each
step's metrics and the gathered weights to ``<CASE_DIR>/<kind>.pt``. Then
the resume: a fresh policy (another initialisation), sharded, loads that
checkpoint (rank 0 reads it) and takes the first step's samples again;
rank 0 writes the version it loaded, the step's metrics and the gathered
weights to ``<CASE_DIR>/<kind>-resumed.pt``.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from mtrl_runtime.training import ShardedUpdate, UpdateSettings, build_sharded_policy, init_ranks
from mtrl_runtime.training.distributed import exit_rank, leave_job


def record_weight_reads() -> list[str]:
    """Every model load (``from_pretrained``) and weight file opened through safetensors in this process."""
    import safetensors
    import safetensors.torch
    import transformers.modeling_utils as modeling_utils

    reads: list[str] = []
    loader = modeling_utils.PreTrainedModel.from_pretrained.__func__

    def from_pretrained(cls, *args, **kwargs):
        reads.append(f"from_pretrained {args[0] if args else ''}")
        return loader(cls, *args, **kwargs)

    def opener(original, what):
        def opened(path, *args, **kwargs):
            reads.append(f"{what} {path}")
            return original(path, *args, **kwargs)
        return opened

    modeling_utils.PreTrainedModel.from_pretrained = classmethod(from_pretrained)
    modeling_utils.safe_open = opener(modeling_utils.safe_open, "safe_open")
    safetensors.safe_open = opener(safetensors.safe_open, "safe_open")
    safetensors.torch.load_file = opener(safetensors.torch.load_file, "load_file")
    return reads


def held_bytes(model: torch.nn.Module) -> int:
    """Bytes of parameter memory this rank holds (its local shards; nothing on the meta device)."""
    from torch.distributed.tensor import DTensor

    total, seen = 0, set()
    for param in model.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        if id(param) not in seen and not local.is_meta:
            total += local.numel() * local.element_size()
        seen.add(id(param))
    return total


def build(case: Path, kind: str, ranks, reads: list[str]) -> ShardedUpdate:
    """The policy sharded as a torchrun run builds it; rank 1 records what it held (``<kind>-rank1.pt``)."""
    before = len(reads)
    policy, initial = build_sharded_policy(case / "model", ranks.leader, lora=kind == "lora", rank=4, alpha=8)
    held_before = held_bytes(policy.model)
    sharded = ShardedUpdate.build(policy, settings(kind), ranks, initial)
    base = policy.model.get_base_model() if policy.lora else policy.model
    facts = {"reads": reads[before:], "held_before_shard": held_before, "held_after": held_bytes(policy.model),
             "tied": base.get_output_embeddings().weight is base.get_input_embeddings().weight,
             "buffers": {name: b.detach().clone() for name, b in base.named_buffers()},
             "estimate": dataclasses.asdict(sharded.update.memory_estimate(False))}
    if ranks.leader:
        torch.save(facts, case / f"{kind}-rank0.pt")
    else:
        torch.save(facts, case / f"{kind}-rank1.pt")
    return sharded


def settings(kind: str) -> UpdateSettings:
    """fp32 (no bf16 rounding between the two layouts); LoRA with activation checkpointing (the GPU default)."""
    return UpdateSettings(precision="fp32", learning_rate=1e-2, gradient_checkpointing="on" if kind == "lora" else "off")


def main(case: Path) -> None:
    ranks = init_ranks()
    reads = record_weight_reads()
    steps = torch.load(case / "steps.pt", weights_only=False)
    for kind in ("lora", "full"):
        torch.manual_seed(1234 + ranks.rank)  # rank 1's own LoRA init must not matter: rank 0's is broadcast
        sharded = build(case, kind, ranks, reads)
        if ranks.leader:
            metrics = [sharded.step(samples) for samples in steps]
            sharded.save_weights(case / f"{kind}-weights")
            sharded.save_checkpoint(case / f"{kind}-checkpoint")
            sharded.stop()
            torch.save({"metrics": metrics, "state": sharded.full_state()}, case / f"{kind}.pt")
        else:
            sharded.follow()
            sharded.full_state()  # the leader gathers after the stop, outside the command protocol

        torch.manual_seed(99 + ranks.rank)  # not the checkpoint's weights: the load must replace them
        policy, initial = build_sharded_policy(case / "model", ranks.leader, lora=kind == "lora", rank=4, alpha=8)
        resumed = ShardedUpdate.build(policy, settings(kind), ranks, initial)
        if ranks.leader:
            resumed.load_checkpoint(case / f"{kind}-checkpoint")
            loaded = resumed.version
            metrics = resumed.step(steps[0])
            resumed.stop()
            torch.save({"version_loaded": loaded, "metrics": metrics, "state": resumed.full_state()},
                       case / f"{kind}-resumed.pt")
        else:
            resumed.follow()
            resumed.full_state()
    # full fine-tuning with a KL term: the frozen reference copy, not sharded, filled whole from rank 0 too
    policy, initial = build_sharded_policy(case / "model", ranks.leader, lora=False, keep_reference=True)
    ShardedUpdate.build(policy, settings("full"), ranks, initial)
    reference = policy.reference_model
    if not ranks.leader:
        torch.save({"state": reference.state_dict(), "buffers": dict(reference.named_buffers()),
                    "tied": reference.get_output_embeddings().weight is reference.get_input_embeddings().weight},
                   case / "reference-rank1.pt")
    leave_job()  # no rank tears its connections down while another still uses them


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_rank(0)  # as mtrl train's ranks do: without the interpreter's shutdown, which gloo's threads can abort
