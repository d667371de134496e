"""The hf engine decoding with a LoRA adapter: folded into the base weights vs peft's LoRA layers.

One engine (SmolLM2-135M, bf16, fixed seeds, eos off) loads a real peft
adapter (r16 on the seven projections, non-zero B); rounds alternate between
the adapter folded (the engine's default, ``engines.hf._lora_fold``) and
unfolded (each LoRA layer runs ``base(x) + scale * B(A(x))``), each round
decoding the same requests. Two workloads: the TRL benchmark's (8 short
prompts x 64 tokens) and the demo's (8 aircraft prompts x 32 tokens, the
shared ~1,500-token prompt prefilled once by the prefix cache). The
logprobs of the folded engine's tokens are rescored unfolded to show the
price in precision (bf16 rounds W0 + delta once).

    python bench/lora_fold.py

Writes bench/results/lora_fold.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from _machine import load_note, machine_info, model_dtype
from _prompts import QUESTIONS
from mtrl_examples.aircraft_inspection import TOOL_SPECS, build_messages, load_instances
from mtrl_runtime.chat import ChatRenderer
from mtrl_runtime.engines import HFEngine, resolve_model
from mtrl_runtime.types import GenerationRequest, SamplingParams

TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def save_adapter(model_folder: Path, out: Path) -> Path:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_folder, dtype=torch.bfloat16)
    config = LoraConfig(r=16, lora_alpha=32, target_modules=TARGET_MODULES, init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(out)
    return out


def workloads(renderer: ChatRenderer, args: argparse.Namespace) -> dict[str, list[GenerationRequest]]:
    short = [renderer.encode(renderer.render([{"role": "user", "content": q}], None)) for q in QUESTIONS]
    aircraft = [renderer.encode(renderer.render(build_messages(row), TOOL_SPECS)) for row in load_instances("val")[:8]]
    return {
        "short prompts x 64 tokens": [GenerationRequest(tuple(ids), SamplingParams(max_tokens=64, seed=i))
                                      for i, ids in enumerate(short)],
        "aircraft prompts x 32 tokens": [GenerationRequest(tuple(ids), SamplingParams(max_tokens=32, seed=i))
                                         for i, ids in enumerate(aircraft)],
    }


def set_folded(engine: HFEngine, folded: bool) -> None:
    """Fold or unfold on the engine's worker (torch work elsewhere would slow its decoding: engines/hf/_worker.py)."""
    def switch() -> None:
        with engine.weights_lock:
            engine.lora_fold.fold() if folded else engine.lora_fold.unfold()
            engine.invalidate_prefix_cache()
        assert engine.lora_fold.folded == folded

    engine.on_worker_sync(switch)


async def timed(engine: HFEngine, requests: list[GenerationRequest]) -> tuple[float, list[Any]]:
    await engine.generate(requests[0])  # fills the prefix cache with the shared prompt, as in the demo
    started = time.perf_counter()
    generations = await asyncio.gather(*(engine.generate(r) for r in requests))
    return time.perf_counter() - started, generations


def rescore_diff(engine: HFEngine, requests: list[GenerationRequest], generations: list[Any]) -> float:
    """Mean |engine logprob - logprob from one unfolded forward pass| over every sampled token."""
    diffs = []
    set_folded(engine, False)

    def rescore() -> None:
        with engine.weights_lock, torch.inference_mode():
            for request, generation in zip(requests, generations):
                ids = list(request.prompt_ids) + list(generation.completion_ids)
                logits = engine.model(input_ids=torch.tensor([ids])).logits[0, len(request.prompt_ids) - 1 : -1]
                picked = torch.log_softmax(logits.float(), -1).gather(
                    1, torch.tensor(generation.completion_ids)[:, None])
                diffs.append((picked[:, 0] - torch.tensor(generation.logprobs)).abs())

    engine.on_worker_sync(rescore)
    set_folded(engine, True)
    return round(float(torch.cat(diffs).mean()), 4)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    folder = resolve_model("smollm2-135m")
    engine = HFEngine(folder, dtype="bf16", eos_token_ids=(), num_threads=args.threads)
    dtype = model_dtype(engine.model)
    with tempfile.TemporaryDirectory() as tmp:
        await engine.load_adapter(str(save_adapter(folder, Path(tmp) / "adapter")), 1)
    renderer = ChatRenderer(engine.tokenizer)
    load_before = os.getloadavg()
    results: dict[str, Any] = {}
    for name, requests in workloads(renderer, args).items():
        times: dict[str, list[float]] = {"folded": [], "peft": []}
        last: dict[str, list[Any]] = {}
        for _ in range(args.rounds):
            for label, folded in (("peft", False), ("folded", True)):
                set_folded(engine, folded)
                seconds, last[label] = await timed(engine, requests)
                times[label].append(round(seconds, 2))
        tokens = sum(len(g.completion_ids) for g in last["folded"])
        best = {label: min(values) for label, values in times.items()}
        results[name] = {
            "tokens": tokens, "seconds": times, "best_s": best,
            "tokens_per_s": {label: round(tokens / s, 1) for label, s in best.items()},
            "speedup": round(best["peft"] / best["folded"], 2),
            # each engine's sampled-token logprobs against a full unfolded forward pass of the same tokens
            "mean_abs_logprob_diff_vs_unfolded_forward": {
                label: rescore_diff(engine, requests, generations) for label, generations in last.items()},
        }
    load_after = os.getloadavg()
    await engine.close()
    return {
        "benchmark": "lora_fold",
        "model": "SmolLM2-135M-Instruct (bf16), LoRA r16 on q,k,v,o,gate,up,down",
        "machine": machine_info(load_before, load_after, args.threads, dtype=dtype),
        "note": load_note(load_before, load_after, "times are upper bounds"),
        "rounds": args.rounds,
        "workloads": results,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "lora_fold.json"))
    args = parser.parse_args()
    result = asyncio.run(main(args))
    for name, r in result["workloads"].items():
        print(f"{name}: peft {r['best_s']['peft']} s, folded {r['best_s']['folded']} s ({r['speedup']}x), "
              f"{r['tokens']} tokens; mean |logprob - unfolded forward|: "
              f"{r['mean_abs_logprob_diff_vs_unfolded_forward']}")
    print(result["note"])
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
