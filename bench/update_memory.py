"""Peak memory and speed of one LoRA update step on a Qwen3-0.6B-shaped model, before and after issue 22.

The model is built from Qwen3-0.6B's configuration (28 layers, hidden
1024, vocab 151,936, bf16, tied embeddings) with random weights and saved
to a folder, then each variant runs in a fresh process that loads it the
way the trainer does (``policy_from_config``, LoRA rank 32 on all seven
projections, bf16 autocast) and takes one ``PolicyUpdate.step`` over
``--rows`` samples of ``--length`` tokens (the last ``--trained`` of each
carry the loss, as a multi-turn rollout's generated turns do). Peak RSS is
the child's ``ru_maxrss``; "step peak" subtracts its RSS just before the
step (the loaded model).

Variants (settings only; the old path is still selectable):
- before: frozen base fp32, full-vocab logits of every trained position at
  once (``logprob_chunk_tokens: 0``), no checkpointing, fixed micro-batches;
- after: the defaults (frozen base bf16, 512-position logit chunks,
  checkpointing "auto", micro-batches sized from free memory);
- after+ckpt: the defaults with ``gradient_checkpointing: on``.

    python bench/update_memory.py [--rows 2] [--length 2048] [--trained 1536] [--threads 2] [--folder DIR]

Writes bench/results/update_memory.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "update_memory.json"

VARIANTS: dict[str, dict[str, Any]] = {
    "before": {"frozen_base_dtype": "fp32", "logprob_chunk_tokens": 0, "gradient_checkpointing": "off",
               "fit_micro_batches": False},
    "after": {},
    "after+ckpt": {"gradient_checkpointing": "on"},
}


def qwen3_06b_config() -> Any:
    from transformers import Qwen3Config

    return Qwen3Config(
        vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643,
        eos_token_id=151645, pad_token_id=151643, dtype="bfloat16",
    )


def build_folder(folder: Path) -> None:
    import torch
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(0)
    with torch.device("cpu"):
        model = Qwen3ForCausalLM(qwen3_06b_config()).to(torch.bfloat16)
    model.save_pretrained(folder)


def make_samples(args: argparse.Namespace) -> list[Any]:
    from mtrl_runtime.types import Sample

    rng = random.Random(0)
    samples = []
    for i in range(args.rows):
        ids = tuple(rng.randrange(100, 150000) for _ in range(args.length))
        mask = tuple([0] * (args.length - args.trained) + [1] * args.trained)
        samples.append(Sample(
            rollout_id=f"r{i}", group_id="g", segment=0, token_ids_T=ids, loss_mask_T=mask,
            behaviour_logprobs_T=tuple(-12.0 if m else 0.0 for m in mask),
            advantages_T=tuple((1.0 if i % 2 else -1.0) if m else 0.0 for m in mask),
            policy_version_T=tuple(0 if m else -1 for m in mask),
        ))
    return samples


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(args: argparse.Namespace) -> None:
    """One variant, in this process: load, one step, print a JSON line."""
    import torch

    from mtrl_runtime.config import MtrlConfig
    from mtrl_runtime.training import PolicyUpdate, UpdateSettings, policy_from_config

    torch.set_num_threads(args.threads)
    advanced = {"train_device": "cpu", "micro_batch_tokens": args.length, **VARIANTS[args.variant]}
    config = MtrlConfig.from_dict({"core": {"lora_rank": 32, "lora_alpha": 64, "learning_rate": 1e-6},
                                   "advanced": advanced})
    policy = policy_from_config(config, args.folder)
    update = PolicyUpdate(policy, UpdateSettings.from_config(config))
    samples = make_samples(args)
    budget, recompute = update.step_plan()
    estimate = update.memory_estimate(recompute)
    base_rss = rss_bytes()
    started = time.perf_counter()
    metrics = update.step(samples)
    seconds = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({
        "variant": args.variant, "settings": advanced,
        "frozen_dtypes": sorted({str(p.dtype) for p in policy.model.parameters() if not p.requires_grad}),
        "peak_rss_gb": round(peak / 2**30, 2), "rss_before_step_gb": round(base_rss / 2**30, 2),
        "step_peak_gb": round((peak - base_rss) / 2**30, 2),
        "estimated_step_gb": round(estimate.need(budget, loaded=True, optimizer_ready=False) / 2**30, 2),
        "step_seconds": round(seconds, 1), "tokens": metrics["train/tokens_real"],
        "tokens_per_s": round(metrics["train/tokens_real"] / seconds, 1), "loss": metrics["train/loss"],
        "micro_batches": metrics["train/micro_batches"], "micro_batch_budget": budget,
        "gradient_checkpointing": recompute,
    }))


def main(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _machine import load_note, machine_info

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="qwen3-0.6b-") as tmp:
        folder = Path(args.folder) if args.folder else Path(tmp) / "model"
        if not (folder / "config.json").is_file():
            build_folder(folder)
        runs = {}
        for variant in VARIANTS:
            cmd = [sys.executable, __file__, "--child", variant, "--folder", str(folder), "--rows", str(args.rows),
                   "--length", str(args.length), "--trained", str(args.trained), "--threads", str(args.threads)]
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            runs[variant] = json.loads(out.strip().splitlines()[-1])
            print(json.dumps(runs[variant]), flush=True)
    load_after = os.getloadavg()
    before, after = runs["before"], runs["after"]
    result = {
        "command": "python bench/update_memory.py " + " ".join(sys.argv[1:]),
        "model": "Qwen3-0.6B shape from config, random weights, LoRA r=32 on q/k/v/o/gate/up/down, bf16 autocast",
        "samples": {"rows": args.rows, "length": args.length, "trained_per_row": args.trained},
        "runs": runs,
        "peak_rss_ratio_before_over_after": round(before["peak_rss_gb"] / after["peak_rss_gb"], 2),
        "peak_rss_ratio_before_over_after_ckpt": round(before["peak_rss_gb"] / runs["after+ckpt"]["peak_rss_gb"], 2),
        "tokens_per_s_ratio_after_over_before": round(after["tokens_per_s"] / before["tokens_per_s"], 2),
        "tokens_per_s_ratio_ckpt_over_after": round(runs["after+ckpt"]["tokens_per_s"] / after["tokens_per_s"], 2),
        "machine": machine_info(load_before, load_after, args.threads,
                                dtype={v: "/".join(r["frozen_dtypes"]) + " frozen base, bf16 autocast"
                                       for v, r in runs.items()}),
        "load_note": load_note(load_before, load_after, "times are slower than on an idle machine"),
    }
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--trained", type=int, default=1536)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", choices=sorted(VARIANTS))
    parser.add_argument("--folder", help="where the random Qwen3-0.6B-shaped model is (built there if absent)")
    parsed = parser.parse_args()
    if parsed.child:
        parsed.variant = parsed.child
        child(parsed)
    else:
        print(json.dumps(main(parsed), indent=2))
