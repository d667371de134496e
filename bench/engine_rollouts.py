"""The hf engine under agents' traffic: concurrent multi-turn conversations that each go at their own pace.

Each of ``--conversations`` aircraft-inspection episodes (the example's real
system prompt, worked example, tools and task, rendered by mtrl's chat
renderer) runs as its own task: generate a turn, append a short tool
result, generate the next, ``--turns`` times, so rows join and leave the
decode batch whenever a turn ends, as in a demo step's rollouts or an
evaluation. SmolLM2-135M-Instruct, sampling at temperature 0.7 with fixed
seeds, ``--max-tokens`` a turn.

Configurations, side by side on one machine (a fresh engine each, in
rotated order over ``--rounds``; the best round counts):

- ``before``: the engine as it was (``kv_cache=concat``, ``share_prefix``
  off, ``cpu_linear=aten``);
- ``after``: the engine's defaults (``auto`` everything);
- with ``--mixed``, ``after-mixed``: the defaults, with a LoRA adapter
  loaded and half the conversations asking for the base model
  (``GenerationRequest.base_model``): an evaluation's two sides at once.

Reported per configuration: wall seconds, tokens/s generated, the seconds
in decode passes (``EngineStats.decode_s``) and the rest (prefill, rows
joining and leaving), rows per decode pass.

    python bench/engine_rollouts.py [--conversations 8] [--turns 4] [--max-tokens 48] [--rounds 1] [--mixed]

Writes bench/results/engine_rollouts.json (or ``--out``).
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

from _conversation import Conversation
from _machine import load_note, machine_info, model_dtype

from mtrl_examples.aircraft_inspection import load_instances
from mtrl_runtime.chat import ChatRenderer, PromptBuilder
from mtrl_runtime.engines import HFEngine, resolve_model
from mtrl_runtime.types import GenerationRequest, SamplingParams

CONFIGS = {
    "before": {"kv_cache": "concat", "share_prefix": False, "cpu_linear": "aten"},
    "after": {},
}


async def conversation(engine: HFEngine, builder: PromptBuilder, instance: dict[str, Any], index: int,
                       args: argparse.Namespace, base: bool) -> list[tuple[int, ...]]:
    """One episode at its own pace: its turns' completions."""
    episode, out = Conversation(builder, instance), []
    for turn in range(args.turns):
        gen = await engine.generate(GenerationRequest(episode.plan.prompt_ids, SamplingParams(
            temperature=0.7, max_tokens=args.max_tokens, seed=1000 * index + turn), base_model=base))
        out.append(gen.completion_ids)
        episode.advance(gen.completion_ids, gen.finish_reason, turn)
    return out


async def run_config(name: str, folder: Path, adapter: Path | None, args: argparse.Namespace) -> dict[str, Any]:
    options = CONFIGS.get(name, {})
    engine = HFEngine(folder, dtype=args.dtype, num_threads=args.threads, **options)
    try:
        if adapter is not None:
            await engine.load_adapter(str(adapter), 1)
        builder = PromptBuilder(ChatRenderer(engine.tokenizer))
        rows = (load_instances("train") * 4)[: args.conversations]
        started = time.perf_counter()
        completions = await asyncio.gather(*(
            conversation(engine, builder, row, i, args, base=adapter is not None and i % 2 == 1)
            for i, row in enumerate(rows)))
        wall = time.perf_counter() - started
    finally:
        await engine.close()
    s = engine.stats
    return {
        "config": name,
        "engine": {"kv_cache": engine.kv_cache, "share_prefix": engine.share_prefix, "cpu_linear": engine.cpu_linear,
                   "dtype": model_dtype(engine.model)},
        "wall_s": round(wall, 2),
        "tokens": s.tokens,
        "tokens_per_s": round(s.tokens / wall, 2),
        "decode_s": round(s.decode_s, 2),
        "other_s": round(wall - s.decode_s, 2),
        "rows_per_decode_pass": round(s.rows_decoded / max(s.decode_passes, 1), 2),
        "joins": s.joins,
        "shared_prefix_passes": s.shared_prefix_passes,
        "mixed_passes": s.mixed_passes,
        "_completions": completions,
    }


def make_adapter(folder: Path, out: Path) -> Path:
    """A random non-zero LoRA adapter (r16 on all seven projections) for SmolLM2: the base rows then differ."""
    from peft import LoraConfig, get_peft_model

    from mtrl_runtime.engines.hf._pretrained import load_pretrained

    torch.manual_seed(0)
    model, _ = load_pretrained(folder, "fp32", "cpu")
    config = LoraConfig(r=16, lora_alpha=32, init_lora_weights=False, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(0.01)  # small: the adapter nudges the model, as a trained one does
    peft_model.save_pretrained(out)
    return out


async def main(args: argparse.Namespace) -> dict[str, Any]:
    folder = resolve_model("smollm2-135m")
    adapter = make_adapter(folder, Path(tempfile.mkdtemp()) / "adapter") if args.mixed else None
    names = list(CONFIGS) + (["after-mixed"] if args.mixed else [])
    load_before = os.getloadavg()
    rounds: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            result = await run_config(name, folder, adapter if name == "after-mixed" else None, args)
            rounds[name].append(result)
            print(f"round {r + 1} {name}: {result['wall_s']} s, {result['tokens_per_s']} tok/s, decode "
                  f"{result['decode_s']} s, other {result['other_s']} s, {result['rows_per_decode_pass']} rows/pass",
                  flush=True)
    load_after = os.getloadavg()
    best = {name: min(results, key=lambda x: x["wall_s"]) for name, results in rounds.items()}
    completions = {name: b.pop("_completions") for name, b in best.items()}
    for results in rounds.values():
        for x in results:
            x.pop("_completions", None)
    return {
        "benchmark": "engine_rollouts",
        "command": "python bench/engine_rollouts.py " + " ".join(args.argv),
        "machine": machine_info(load_before, load_after, args.threads or torch.get_num_threads(), dtype=args.dtype),
        "note": load_note(load_before, load_after, "configurations alternate, so they share the load"),
        "workload": {"conversations": args.conversations, "turns": args.turns, "max_tokens": args.max_tokens,
                     "prompt": "aircraft inspection: system prompt + worked example + task, tools rendered"},
        "best": best,
        "rounds": rounds,
        "speedup_after_vs_before": round(best["before"]["wall_s"] / best["after"]["wall_s"], 3),
        "same_tokens_after_vs_before": completions["before"] == completions["after"],
    }


if __name__ == "__main__":
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--mixed", action="store_true", help="also the evaluation's two sides at once on one engine")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "engine_rollouts.json"))
    args = parser.parse_args()
    args.argv = sys.argv[1:]
    data = asyncio.run(main(args))
    print(f"after vs before: {data['speedup_after_vs_before']}x wall; same tokens {data['same_tokens_after_vs_before']}")
    Path(args.out).write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {args.out}")
