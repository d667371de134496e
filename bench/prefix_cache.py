"""Prefix caching in the hf engine: a multi-turn agent workload with the cache off and on, side by side.

Shaped like the demo: ``--conversations`` aircraft-inspection episodes run
concurrently, each prompt rendered by mtrl's chat renderer from the
example's real messages and tools (a ~1,450-token system prompt + worked
example shared by all, then the task). Every turn extends the previous one
token-in-token-out (prompt + completion + a short tool result, through
``PromptBuilder``), for ``--turns`` turns. SmolLM2-135M-Instruct, sampling
at temperature 1 with fixed seeds, so both modes produce the same tokens.
Each mode gets a fresh engine (the "on" run starts cold). Prints wall time,
prefill tokens computed and the ratios; writes
bench/results/prefix_cache.json with the load average before and after.

    python bench/prefix_cache.py [--conversations 8] [--turns 3] [--max-tokens 32] [--threads N] [--dtype fp32]
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

from _conversation import Conversation
from _machine import load_note, machine_info

from mtrl_examples.aircraft_inspection import load_instances
from mtrl_runtime.chat import ChatRenderer, PromptBuilder
from mtrl_runtime.engines import HFEngine, resolve_model
from mtrl_runtime.types import GenerationRequest, SamplingParams

async def run_mode(folder: Path, cache_tokens: int, args: argparse.Namespace) -> dict[str, Any]:
    engine = HFEngine(folder, dtype=args.dtype, num_threads=args.threads, prefix_cache_tokens=cache_tokens)
    builder = PromptBuilder(ChatRenderer(engine.tokenizer))
    conversations = [Conversation(builder, row) for row in load_instances("train")[: args.conversations]]
    turns, completions = [], []
    started = time.perf_counter()
    try:
        for turn in range(args.turns):
            before = (engine.stats.prompt_tokens, engine.stats.prefill_tokens)
            turn_started = time.perf_counter()
            requests = [
                GenerationRequest(c.plan.prompt_ids,
                                  SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=100 * i + turn))
                for i, c in enumerate(conversations)
            ]
            gens = await asyncio.gather(*(engine.generate(r) for r in requests))
            turns.append({
                "turn": turn + 1,
                "wall_s": round(time.perf_counter() - turn_started, 2),
                "prompt_tokens": engine.stats.prompt_tokens - before[0],
                "prefill_tokens": engine.stats.prefill_tokens - before[1],
            })
            completions.append([g.completion_ids for g in gens])
            for c, g in zip(conversations, gens):
                c.advance(g.completion_ids, g.finish_reason, turn + 1)
        wall_s = time.perf_counter() - started
    finally:
        await engine.close()
    stats = engine.stats
    return {
        "prefix_cache_tokens": cache_tokens,
        "wall_s": round(wall_s, 2),
        "prompt_tokens": stats.prompt_tokens,
        "prefill_tokens": stats.prefill_tokens,
        "prefix_hit_tokens": stats.prefix_hit_tokens,
        "hit_rate": round(stats.prefix_hit_rate, 3),
        "completion_tokens": stats.tokens,
        "cached_tokens_at_end": engine.prefix_cache.tokens if engine.prefix_cache is not None else 0,
        "turns": turns,
        "_completions": completions,
    }


async def main(args: argparse.Namespace) -> dict[str, Any]:
    folder = resolve_model("smollm2-135m")
    load_before = os.getloadavg()
    off = await run_mode(folder, 0, args)
    on = await run_mode(folder, args.cache_tokens, args)
    load_after = os.getloadavg()
    same = off.pop("_completions") == on.pop("_completions")
    return {
        "benchmark": "prefix_cache",
        "model": f"SmolLM2-135M-Instruct ({args.dtype})",
        "workload": {"conversations": args.conversations, "turns": args.turns, "max_tokens": args.max_tokens,
                     "prompt": "aircraft inspection: system prompt + worked example + task, tools rendered"},
        "machine": machine_info(load_before, load_after, args.threads or torch.get_num_threads(), dtype=args.dtype),
        "note": load_note(load_before, load_after, "times are upper bounds"),
        "off": off,
        "on": on,
        "same_tokens": same,
        "prefill_ratio": round(off["prefill_tokens"] / max(on["prefill_tokens"], 1), 1),
        "speedup": round(off["wall_s"] / on["wall_s"], 2),
    }


def report(data: dict[str, Any]) -> None:
    print(f"{'turn':>4} {'prompt tok':>10} | {'off: prefill':>12} {'wall s':>7} | {'on: prefill':>11} {'wall s':>7}")
    for a, b in zip(data["off"]["turns"], data["on"]["turns"]):
        print(f"{a['turn']:>4} {a['prompt_tokens']:>10} | {a['prefill_tokens']:>12} {a['wall_s']:>7} | "
              f"{b['prefill_tokens']:>11} {b['wall_s']:>7}")
    off, on = data["off"], data["on"]
    print(f"total: off {off['prefill_tokens']} prefill tokens in {off['wall_s']} s; on {on['prefill_tokens']} in "
          f"{on['wall_s']} s (hit rate {on['hit_rate']:.1%}): {data['prefill_ratio']}x fewer tokens, "
          f"{data['speedup']}x faster; same tokens: {data['same_tokens']}")
    m = data["machine"]
    print(f"{m['cpus']} CPUs, {m['engine_threads']} engine threads, load {m['loadavg_before']} -> "
          f"{m['loadavg_after']}: {data['note']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--cache-tokens", type=int, default=32768, help="prefix_cache_tokens of the 'on' run")
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of the engine worker (default: torch's)")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "prefix_cache.json"))
    args = parser.parse_args()
    data = asyncio.run(main(args))
    report(data)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")
