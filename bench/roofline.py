"""What this machine can compute at best, and what a training step of SmolLM2-135M must cost on it.

A speed goal stated as a ratio to another trainer ("3x TRL's step") is only
reachable if the machine has room for it. This bench measures the room on
the machine it runs on, in fp32 and in bf16 (and records which the engines
pick here, ``auto_dtype``):

- matmul throughput (GFLOP/s) at the shapes of SmolLM2's linears, with the
  rows of an update (1,024 tokens) and of a decode step (8 rows);
- memory bandwidth (GB/s): a copy, and a sum that only reads;
- bare floors, per dtype, for the TRL comparison's step (``bench/trl_vs_mtrl.py``: 8
  rows, ~37 prompt tokens + 64 completion tokens, LoRA r16 on every
  linear): one forward + backward of the model on those rows (FLOPs
  counted by torch's ``FlopCounterMode``, then timed without it), and one
  plain transformers decode step of 8 rows at 100 tokens of context
  (timed, and the floor its weight reads set at the measured bandwidth);
- with ``--fused``, the most fusion torch itself offers a decode step: the
  same step on transformers' static cache, eager and through
  ``torch.compile`` (inductor, weights frozen and prepacked), side by side,
  and the seconds the compilation took (the base model: what a decode
  runs once the LoRA is folded into the weights).

The floor of a step is forward + backward plus 64 decode steps with
torch's own kernels (the optimizer, the sampling, the prefill and the
bookkeeping come on top); what the hardware could do at best is the FLOPs
at the measured matmul rate and the weight reads at the measured bandwidth.

    python bench/roofline.py [--threads 2] [--repeats 5] [--fused] [--out bench/results/roofline.json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

from _machine import machine_info, model_dtype

RESULTS = Path(__file__).resolve().parent / "results" / "roofline.json"
LINEARS = {  # SmolLM2-135M's linears as (in, out) and how many per layer; 30 layers
    "q_proj/o_proj": ((576, 576), 2), "k_proj/v_proj": ((576, 192), 2), "gate_proj/up_proj": ((576, 1536), 2),
    "down_proj": ((1536, 576), 1),
}
UPDATE_ROWS, PROMPT_TOKENS, COMPLETION_TOKENS = 8, 37, 64  # the TRL comparison's step


def best_seconds(fn: Callable[[], Any], repeats: int) -> float:
    """The fastest of ``repeats`` timed calls, after one untimed call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def matmul_rates(dtype: Any, rows: int, repeats: int) -> dict[str, float]:
    """GFLOP/s of ``x @ W.T`` per linear shape, with ``rows`` rows of x."""
    import torch

    rates = {}
    for name, ((fan_in, fan_out), _) in LINEARS.items():
        x = torch.randn(rows, fan_in, dtype=dtype)
        w = torch.randn(fan_out, fan_in, dtype=dtype)
        seconds = best_seconds(lambda: torch.nn.functional.linear(x, w), repeats)
        rates[name] = round(2 * rows * fan_in * fan_out / seconds / 1e9, 1)
    return rates


def bandwidth(repeats: int, megabytes: int = 512) -> dict[str, float]:
    """GB/s of a copy (read + write counted) and of a sum (read only) over ``megabytes``."""
    import torch

    source = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    target = torch.empty_like(source)
    size = source.numel() * 4
    copy_s = best_seconds(lambda: target.copy_(source), repeats)
    read_s = best_seconds(lambda: source.sum(), repeats)
    return {"copy_gb_s": round(2 * size / copy_s / 1e9, 1), "read_gb_s": round(size / read_s / 1e9, 1)}


def model_floors(dtype: Any, repeats: int) -> dict[str, Any]:
    """Forward + backward of the TRL comparison's step, and one decode step of 8 rows, with plain torch."""
    import torch
    from peft import LoraConfig, get_peft_model
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM, DynamicCache

    from mtrl_runtime.engines import resolve_model

    model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m"), dtype=dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    peft_model = get_peft_model(model, LoraConfig(
        r=16, lora_alpha=32, lora_dropout=0.0, target_modules=[
            "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]))
    ids = torch.randint(100, 40000, (UPDATE_ROWS, PROMPT_TOKENS + COMPLETION_TOKENS))

    def forward_backward() -> None:
        logits = peft_model(input_ids=ids).logits[:, PROMPT_TOKENS - 1:-1].float()
        torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                          ids[:, PROMPT_TOKENS:].reshape(-1)).backward()
        peft_model.zero_grad(set_to_none=True)

    with FlopCounterMode(display=False) as counter:
        forward_backward()
    flops = counter.get_total_flops()
    update_s = best_seconds(forward_backward, repeats)

    context = 100
    with torch.no_grad():
        cache = DynamicCache()
        peft_model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True)
        step_ids = ids[:, :1]

        def decode_step() -> None:
            peft_model(input_ids=step_ids, past_key_values=cache, use_cache=True)
            cache.crop(-1)  # drop the column this step added

        decode_s = best_seconds(decode_step, repeats * 4)
    return {
        "dtype": model_dtype(model),
        "weight_bytes": weight_bytes,
        "forward_backward": {"tokens": int(ids.numel()), "gflop": round(flops / 1e9, 1), "seconds": round(update_s, 3),
                             "gflop_s": round(flops / update_s / 1e9, 1)},
        "decode_step_8_rows": {"context": context, "seconds": round(decode_s, 4)},
    }


def fused_decode(dtype: Any, repeats: int, context: int = 100) -> dict[str, Any]:
    """One decode step of 8 rows after ``context`` tokens on transformers' static cache: eager, and compiled by
    inductor (weights frozen: oneDNN prepacks the linears). Each side has its own cache, prefilled alike, and
    their first steps' logits are compared; every call decodes the next position (a static cache attends over
    all its columns, masked, so each step costs the same)."""
    import torch
    import torch._inductor.config as inductor_config
    from transformers import AutoModelForCausalLM, StaticCache

    from mtrl_runtime.engines import resolve_model

    model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m"), dtype=dtype).eval()
    ids = torch.randint(100, 40000, (UPDATE_ROWS, context + 1))
    calls = 2 + 4 * repeats  # the compared step, then best_seconds' warm-up call and its timed ones

    def stepper() -> Callable[[torch.Tensor], torch.Tensor]:
        cache = StaticCache(config=model.config, max_cache_len=context + calls)
        model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True)
        return lambda step_ids: model(input_ids=step_ids, past_key_values=cache, use_cache=True).logits

    with torch.no_grad(), inductor_config.patch(freezing=True):
        eager, compiled = stepper(), torch.compile(stepper(), dynamic=False)
        eager_logits = eager(ids[:, context:])
        started = time.perf_counter()
        fused_logits = compiled(ids[:, context:])
        compile_s = time.perf_counter() - started
        eager_s = best_seconds(lambda: eager(ids[:, context:]), repeats * 4)
        fused_s = best_seconds(lambda: compiled(ids[:, context:]), repeats * 4)
    return {"context": context, "eager_s": round(eager_s, 4), "compiled_s": round(fused_s, 4),
            "speedup": round(eager_s / fused_s, 2), "compile_s": round(compile_s, 1),
            "max_abs_logit_diff": round(float((fused_logits.float() - eager_logits.float()).abs().max()), 5)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fused", action="store_true", help="also time the decode step compiled by inductor")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()

    import torch

    from mtrl_runtime.engines.hf import auto_dtype

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rates = {}
    for name, kind in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        rates[name] = {"update_rows_1024": matmul_rates(kind, 1024, args.repeats),
                       "decode_rows_8": matmul_rates(kind, 8, args.repeats)}
    memory = bandwidth(args.repeats)
    floors, steps = {}, {}
    for name, kind in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        floors[name] = model_floors(kind, args.repeats)
        if args.fused:
            floors[name]["static_cache_decode_step_8_rows"] = fused_decode(kind, args.repeats)
        steps[name] = {
            "decode_step_weight_reads_s": round(floors[name]["weight_bytes"] / (memory["read_gb_s"] * 1e9), 4),
            "trl_step_s": round(floors[name]["forward_backward"]["seconds"]
                                + COMPLETION_TOKENS * floors[name]["decode_step_8_rows"]["seconds"], 2),
        }
    auto = auto_dtype("cpu")  # what the engines pick on this CPU
    results = {
        "bench": "roofline",
        "command": "python bench/roofline.py " + " ".join(f"--{k} {v}" for k, v in (("threads", args.threads),
                                                                                  ("repeats", args.repeats)))
                   + (" --fused" if args.fused else ""),
        "machine": machine_info(load_before, os.getloadavg(), args.threads,
                                dtype={name: floors[name]["dtype"] for name in floors}),
        "engines_auto_dtype": auto,
        "matmul_gflop_s": rates,
        "memory": memory,
        "smollm2_135m": floors,
        "floors": steps,
        "trl_step_is": f"forward+backward of {UPDATE_ROWS} x {PROMPT_TOKENS + COMPLETION_TOKENS} tokens + "
                       f"{COMPLETION_TOKENS} plain decode steps of {UPDATE_ROWS} rows",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps({k: results[k] for k in ("engines_auto_dtype", "matmul_gflop_s", "memory", "smollm2_135m",
                                              "floors")}, indent=1))


if __name__ == "__main__":
    main()
