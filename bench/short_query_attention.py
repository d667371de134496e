"""The hf engine on CPU with its short-query attention vs plain SDPA: 8 concurrent aircraft prompts.

Both runs use SmolLM2-135M (bf16, one engine thread, fixed seeds, 32 new
tokens per prompt, eos off); one engine keeps transformers' SDPA, the other
selects ``mtrl_runtime.engines.hf._attention`` as the engine does on CPU. The
shared prompt prefix is prefilled once by the prefix cache in both runs, so
the difference is decoding. In bf16 the two attention paths round
differently, so the sampled tokens may differ; in fp32 they agree within 1e-4
(tests/test_engine_attention.py).

    python bench/short_query_attention.py

Writes bench/results/short_query_attention.json.
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

from _machine import load_note, machine_info
from mtrl_examples.aircraft_inspection import TOOL_SPECS, build_messages, load_instances
from mtrl_runtime.chat import ChatRenderer
from mtrl_runtime.engines import HFEngine, resolve_model
from mtrl_runtime.engines.hf import _engine as hf  # the module whose use_short_query_attention HFEngine calls
from mtrl_runtime.types import GenerationRequest, SamplingParams


async def timed_run(short_query: bool, args: argparse.Namespace) -> dict[str, Any]:
    original = hf.use_short_query_attention
    hf.use_short_query_attention = original if short_query else (lambda model: False)
    try:
        engine = HFEngine(resolve_model("smollm2-135m"), dtype="bf16", eos_token_ids=(), num_threads=args.threads)
    finally:
        hf.use_short_query_attention = original
    renderer = ChatRenderer(engine.tokenizer)
    requests = [
        GenerationRequest(prompt_ids=tuple(renderer.encode(renderer.render(build_messages(row), TOOL_SPECS))),
                          sampling=SamplingParams(max_tokens=args.max_tokens, seed=i))
        for i, row in enumerate(load_instances("val")[: args.prompts])
    ]
    await engine.generate(requests[0])  # warm-up: loads kernels, fills the prefix cache with the shared prompt
    started = time.perf_counter()
    generations = await asyncio.gather(*(engine.generate(request) for request in requests))
    wall_s = time.perf_counter() - started
    attention = engine.model.config._attn_implementation
    await engine.close()
    tokens = sum(len(g.completion_ids) for g in generations)
    return {"attention": attention, "wall_s": round(wall_s, 2), "tokens": tokens, "tokens_per_s": round(tokens / wall_s, 1)}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    sdpa = await timed_run(False, args)
    short = await timed_run(True, args)
    load_after = os.getloadavg()
    return {
        "benchmark": "short_query_attention",
        "model": "SmolLM2-135M-Instruct (bf16)",
        "workload": {"prompts": args.prompts, "max_tokens": args.max_tokens, "prompt": "aircraft inspection, tools rendered"},
        "machine": machine_info(load_before, load_after, args.threads, dtype="bf16"),
        "note": load_note(load_before, load_after, "times are upper bounds"),
        "sdpa": sdpa,
        "short_query": short,
        "speedup": round(sdpa["wall_s"] / short["wall_s"], 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "short_query_attention.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    result = asyncio.run(main(args))
    print(f"{args.prompts} aircraft prompts x {args.max_tokens} tokens, bf16, {args.threads} thread(s): "
          f"SDPA {result['sdpa']['wall_s']} s, short-query {result['short_query']['wall_s']} s "
          f"({result['speedup']}x); {result['note']}")
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
