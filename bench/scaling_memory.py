"""Memory per model size for docs/scaling.md: counted parameters, and a measured LoRA step per rank on CPU.

Counted (``--sizes``): each Qwen3 size is built from its published
configuration on the meta device (no memory), its parameters and the LoRA
rank-32 parameters on all seven projections counted from the module
shapes. From the counts, the bytes a GPU holds for weights and optimizer
state under FSDP2 at 1, 2, 4 and 8 GPUs: LoRA keeps the frozen base in
bf16 (2 B per parameter) and the LoRA weights, gradients and AdamW moments
in fp32 (16 B per LoRA parameter); full fine-tuning keeps fp32 master
weights, gradients and two AdamW moments (16 B per parameter); both are
divided by the GPU count (every parameter is sharded), plus one decoder
layer gathered whole in bf16 while it runs. Activations come on top and
depend on tokens per micro-batch (docs/scaling.md).

Measured (``--measure``): a Qwen3-shaped model of ``--hidden`` and
``--layers`` (random weights, vocab 151,936 as Qwen3's) takes one LoRA
step of ``--rows`` x ``--length`` tokens in one process and in a torchrun
job of two; each process reports its resident memory before the step and
its peak during it (VmHWM, reset before the step). fp32 weights (a CPU
run: no bf16 frozen base), one torch thread per process.

    python bench/scaling_memory.py [--measure] [--hidden 1024] [--layers 28] [--rows 2] [--length 512]

Writes bench/results/scaling_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "scaling_memory.json"
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GB = 1e9

# Qwen3 sizes as their published config.json files give them
QWEN3 = {
    "0.6B": dict(hidden_size=1024, num_hidden_layers=28, intermediate_size=3072, num_attention_heads=16,
                 num_key_value_heads=8, tie_word_embeddings=True),
    "1.7B": dict(hidden_size=2048, num_hidden_layers=28, intermediate_size=6144, num_attention_heads=16,
                 num_key_value_heads=8, tie_word_embeddings=True),
    "4B": dict(hidden_size=2560, num_hidden_layers=36, intermediate_size=9728, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=True),
    "8B": dict(hidden_size=4096, num_hidden_layers=36, intermediate_size=12288, num_attention_heads=32,
               num_key_value_heads=8, tie_word_embeddings=False),
    "14B": dict(hidden_size=5120, num_hidden_layers=40, intermediate_size=17408, num_attention_heads=40,
                num_key_value_heads=8, tie_word_embeddings=False),
    "32B": dict(hidden_size=5120, num_hidden_layers=64, intermediate_size=25600, num_attention_heads=64,
                num_key_value_heads=8, tie_word_embeddings=False),
}


def qwen3(size_kwargs: dict[str, Any]) -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=151936, head_dim=128, max_position_embeddings=40960, **size_kwargs)


def count(name: str, rank: int = 32) -> dict[str, Any]:
    import torch
    from transformers import Qwen3ForCausalLM

    with torch.device("meta"):
        model = Qwen3ForCausalLM(qwen3(QWEN3[name]))
    params = sum(p.numel() for p in model.parameters())  # tied weights counted once
    lora = sum(rank * (m.in_features + m.out_features) for n, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and n.rsplit(".", 1)[-1] in TARGETS)
    layer = sum(p.numel() for p in model.model.layers[0].parameters())
    per_gpu = {}
    for gpus in (1, 2, 4, 8):
        gathered = layer * 2 if gpus > 1 else 0  # FSDP: the running layer's whole bf16 weights
        per_gpu[str(gpus)] = {
            "lora_gb": round(((params * 2 + lora * 16) / gpus + gathered) / GB, 2),
            "full_gb": round((params * 16 / gpus + gathered) / GB, 2),
        }
    return {"parameters": params, "lora_r32_parameters": lora, "layer_parameters": layer,
            "weights_and_optimizer_per_gpu": per_gpu}


def measure_child(folder: Path, rows: int, length: int, mode: str) -> None:
    """One process of the measured part: load, (shard), reset the peak, one LoRA step, report."""
    import torch

    from mtrl_runtime.training import (PolicyUpdate, ShardedUpdate, UpdateSettings, build_policy,
                                       build_sharded_policy, init_ranks)
    from mtrl_runtime.training.distributed import exit_rank, leave_job
    from mtrl_runtime.types import Sample

    torch.set_num_threads(1)
    ranks = init_ranks() if mode == "fsdp" else None
    torch.manual_seed(0)
    settings = UpdateSettings(precision="fp32", gradient_checkpointing="off", fit_memory=False, logprob_chunk_tokens=0,
                              micro_batch_tokens=length)
    if ranks is None:
        update: Any = PolicyUpdate(build_policy(folder / "model", lora=True, rank=32, alpha=64, device="cpu"), settings)
    else:  # only rank 0 reads the weights; every rank fills its shards from them
        policy, initial = build_sharded_policy(folder / "model", ranks.leader, lora=True, rank=32, alpha=64)
        update = ShardedUpdate.build(policy, settings, ranks, initial)
    rng = random.Random(0)
    samples = []
    for i in range(rows):
        ids = tuple(rng.randrange(1, 151936) for _ in range(length))
        mask = (0,) * (length // 2) + (1,) * (length - length // 2)
        samples.append(Sample(f"r{i}", "g", 0, ids, mask, tuple(-10.0 * m for m in mask),
                              tuple((1.0 if i % 2 else -1.0) * m for m in mask), tuple(m - 1 for m in mask)))
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)  # give freed pages (the unsharded weights) back before measuring
    before = _status("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM: the peak from here on
    if ranks is not None and not ranks.leader:
        update.follow()
    else:
        update.step(samples)
        if ranks is not None:
            update.stop()
    peak = _status("VmHWM")
    rank = 0 if ranks is None else ranks.rank
    print("MEASURED " + json.dumps({"mode": mode, "rank": rank, "rss_before_step_gb": round(before / GB, 3),
                                    "peak_in_step_gb": round(peak / GB, 3)}), flush=True)
    if ranks is not None:
        leave_job()
        exit_rank(0)  # without the interpreter's shutdown, which gloo's threads can abort


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import Qwen3ForCausalLM

    me = str(Path(__file__).resolve())
    shape = {**QWEN3["0.6B"], "hidden_size": args.hidden, "num_hidden_layers": args.layers}
    out: dict[str, Any] = {"shape": {"hidden": args.hidden, "layers": args.layers, "vocab": 151936,
                                     "rows": args.rows, "tokens_per_row": args.length, "lora_rank": 32}}
    with tempfile.TemporaryDirectory(prefix="mtrl-scaling-mem-") as tmp:
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(qwen3(shape))
        out["shape"]["parameters"] = sum(p.numel() for p in model.parameters())
        model.save_pretrained(Path(tmp) / "model")
        del model
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        runs = {
            "one_process": [sys.executable, me, "--child", tmp, "one"],
            "world_2": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                        "--nproc-per-node", "2", me, "--child", tmp, "fsdp"],
        }
        for name, cmd in runs.items():
            cmd = cmd + ["--rows", str(args.rows), "--length", str(args.length)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
            out[name] = sorted((json.loads(line.split("MEASURED ", 1)[1]) for line in done.stdout.splitlines()
                                if line.startswith("MEASURED ")), key=lambda r: r["rank"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        measure_child(Path(args.child[0]), args.rows, args.length, args.child[1])
        return
    from _machine import load_note, machine_info

    load_before = os.getloadavg()
    result: dict[str, Any] = {"command": "python bench/scaling_memory.py " + " ".join(sys.argv[1:]),
                              "counted": {name: count(name) for name in QWEN3}}
    if args.measure:
        result["measured_cpu"] = measure(args)
    load_after = os.getloadavg()
    result["machine"] = machine_info(load_before, load_after, 1, dtype="fp32")
    result["load"] = load_note(load_before, load_after, "memory figures do not depend on it; times are not reported")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
